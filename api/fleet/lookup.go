package fleet

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The lookups below read indexes built once by Parse, Load or New; they are
// safe for concurrent use. On a Spec not built by those they panic.

func (s *Spec) index() *index {
	if s.ix == nil {
		panic("fleet: Spec was not built by fleet.Parse, fleet.Load or fleet.New")
	}
	return s.ix
}

// RTTMs returns the network round trip in milliseconds between two regions:
// network.same_region_rtt_ms if they are the same region, else the link
// between them. ok is false for an unknown region or an unlinked pair
// (validation guarantees a link for every frontend region and engine region
// pair in the fleet).
func (s *Spec) RTTMs(fromRegion, toRegion string) (ms float64, ok bool) {
	ix := s.index()
	if fromRegion == toRegion {
		if _, known := ix.regions[fromRegion]; !known {
			return 0, false
		}
		return ix.sameRTTMs, true
	}
	ms, ok = ix.rttMs[pair(fromRegion, toRegion)]
	return ms, ok
}

// RTT is RTTMs as a time.Duration.
func (s *Spec) RTT(fromRegion, toRegion string) (time.Duration, bool) {
	ms, ok := s.RTTMs(fromRegion, toRegion)
	return time.Duration(ms * float64(time.Millisecond)), ok
}

// EligibleEngines returns the engines of the named class, in spec order: the
// engines serving the class's model, in regions of the class's residency (if
// set), whose context limit is at least the class's MinContextTokens. It
// returns a new slice (nil for an unknown class); the engines' Labels maps
// are shared and must not be modified.
func (s *Spec) EligibleEngines(class string) []Engine {
	ix := s.index()
	ci, ok := ix.classes[class]
	if !ok {
		return nil
	}
	out := make([]Engine, len(ix.eligible[ci]))
	for k, ei := range ix.eligible[ci] {
		out[k] = s.Engines[ei]
	}
	return out
}

// IsEligible reports whether the engine with id engineID is eligible for the
// named class.
func (s *Spec) IsEligible(class, engineID string) bool {
	ix := s.index()
	ci, ok1 := ix.classes[class]
	ei, ok2 := ix.engines[engineID]
	return ok1 && ok2 && slices.Contains(ix.eligible[ci], ei)
}

// Classify picks the eligibility class of a request for model, with the
// data residency it demands ("" for none) and contextTokens, the prompt
// tokens plus the most output tokens it may generate (0 when unknown).
//
// Among the model's classes that admit the request (residency equal to the
// demanded one; a request without residency may use any class, and prefers
// classes without residency; ContextLimit ≥ contextTokens) it returns the
// one with the smallest ContextLimit, so short requests leave long-context
// engines to the requests that need them; ties go to the first name in
// lexical order. The errors wrap ErrUnknownModel or ErrNoClass.
//
// Classify does not allocate when it succeeds.
func (s *Spec) Classify(model, residency string, contextTokens int) (Class, error) {
	ix := s.index()
	list, ok := ix.byModel[model]
	if !ok {
		if _, served := ix.models[model]; served {
			return Class{}, fmt.Errorf("%w: model %q has no class", ErrNoClass, model)
		}
		return Class{}, fmt.Errorf("%w %q (served: %s)", ErrUnknownModel, model, quoteList(slices.Sorted(maps.Keys(ix.models))))
	}
	// list holds no-residency classes first, each group by ContextLimit.
	for _, ci := range list {
		c := &s.Classes[ci]
		if c.Residency == residency && c.ContextLimit >= contextTokens {
			return *c, nil
		}
	}
	if residency == "" {
		for _, ci := range list {
			if c := &s.Classes[ci]; c.ContextLimit >= contextTokens {
				return *c, nil
			}
		}
	}
	return Class{}, s.noClass(list, model, residency, contextTokens)
}

func (s *Spec) noClass(list []int, model, residency string, contextTokens int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "model %q", model)
	if residency != "" {
		fmt.Fprintf(&b, ", residency %q", residency)
	}
	if contextTokens > 0 {
		fmt.Fprintf(&b, ", %d context tokens", contextTokens)
	}
	b.WriteString("; classes of the model:")
	for _, ci := range list {
		c := &s.Classes[ci]
		res := c.Residency
		if res == "" {
			res = "any"
		}
		fmt.Fprintf(&b, " %s (residency %s, context up to %d)", c.Name, res, c.ContextLimit)
	}
	return fmt.Errorf("%w: %s", ErrNoClass, b.String())
}

func quoteList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = strconv.Quote(x)
	}
	return strings.Join(q, ", ")
}

// ProfileOf returns the latency profile of the engine's (GPU, model).
// ok is false only for an engine not of this fleet.
func (s *Spec) ProfileOf(e Engine) (Profile, bool) {
	return s.Profile(e.GPU, e.Model)
}

// Profile returns the latency profile of model on gpu.
func (s *Spec) Profile(gpu, model string) (Profile, bool) {
	i, ok := s.index().profiles[[2]string{gpu, model}]
	if !ok {
		return Profile{}, false
	}
	return s.Profiles[i], true
}

// FrontendByNodeID returns the frontend whose Envoy node id is nodeID.
func (s *Spec) FrontendByNodeID(nodeID string) (Frontend, bool) {
	return lookup(s.Frontends, s.index().frontends, nodeID)
}

// EngineByID returns the engine with the given id.
func (s *Spec) EngineByID(id string) (Engine, bool) {
	return lookup(s.Engines, s.index().engines, id)
}

// PriorityByName returns the named priority.
func (s *Spec) PriorityByName(name string) (Priority, bool) {
	return lookup(s.Priorities, s.index().priorities, name)
}

// ClassByName returns the named class.
func (s *Spec) ClassByName(name string) (Class, bool) {
	return lookup(s.Classes, s.index().classes, name)
}

// ModelByName returns the named model.
func (s *Spec) ModelByName(name string) (Model, bool) {
	return lookup(s.Models, s.index().models, name)
}

// RegionByName returns the named region.
func (s *Spec) RegionByName(name string) (Region, bool) {
	return lookup(s.Regions, s.index().regions, name)
}

func lookup[T any](xs []T, ix map[string]int, key string) (T, bool) {
	i, ok := ix[key]
	if !ok {
		var zero T
		return zero, false
	}
	return xs[i], true
}

// Summary describes the fleet in one line, e.g.
//
//	fleet "demo": 3 regions, 3 frontends, 12 engines (6 A100, 6 H100), 3 classes, 1 model (llama-3.1-8b), 3 priorities
//
// Engines with replicas count once; the replica total follows when larger.
func (s *Spec) Summary() string {
	gpus := map[string]int{}
	replicas := 0
	for _, e := range s.Engines {
		gpus[e.GPU]++
		replicas += e.Replicas
	}
	var byGPU []string
	for _, g := range slices.Sorted(maps.Keys(gpus)) {
		byGPU = append(byGPU, fmt.Sprintf("%d %s", gpus[g], g))
	}
	rep := ""
	if replicas > len(s.Engines) {
		rep = fmt.Sprintf(", %d replicas", replicas)
	}
	models := make([]string, len(s.Models))
	for i, m := range s.Models {
		models[i] = m.Name
	}
	name := ""
	if s.Name != "" {
		name = fmt.Sprintf("fleet %q: ", s.Name)
	}
	return fmt.Sprintf("%s%s, %s, %s (%s%s), %s, %s (%s), %s",
		name, plural(len(s.Regions), "region"), plural(len(s.Frontends), "frontend"),
		plural(len(s.Engines), "engine"), strings.Join(byGPU, ", "), rep,
		plural(len(s.Classes), "class"), plural(len(s.Models), "model"), strings.Join(models, ", "),
		plural(len(s.Priorities), "priority"))
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	switch {
	case strings.HasSuffix(noun, "ss"):
		noun += "es"
	case strings.HasSuffix(noun, "y"):
		noun = noun[:len(noun)-1] + "ies"
	default:
		noun += "s"
	}
	return strconv.Itoa(n) + " " + noun
}
