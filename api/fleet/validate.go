package fleet

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Limits on values, beyond which a spec is certainly a mistake (and
// arithmetic on it could overflow).
const (
	maxNameLen  = 128
	maxRTTMs    = 60_000    // one minute
	maxTokens   = 1 << 30   // context, KV and batch sizes
	maxReplicas = 1_000_000 // per engine entry
	maxRate     = 1e9       // tokens/s, requests/s
	maxMs       = 3_600_000 // one hour, for step times
	maxShedCost = 1e9       // a relative weight
	maxLabelLen = 256       // label keys and values
	maxNodeID   = 256       // Envoy node ids
	maxHostLen  = 253       // DNS
)

// validator checks a defaulted specDoc. Each method checks one section and
// records what later sections need (known regions, models, profiles), so
// that a reference to a broken entity is reported once, at the entity.
type validator struct {
	d    *specDoc
	errs []*FieldError

	regions     map[string]int    // name → index, valid names only
	residencies map[string]bool   // residencies of regions
	badRes      map[string]bool   // residencies given but invalid
	badClass    map[int]bool      // classes whose own fields are wrong
	models      map[string]int    // name → max context tokens (0 if invalid)
	profiles    map[[2]string]int // (gpu, model) → effective context limit
	linked      map[[2]string]bool
}

// validate returns every problem of a defaulted spec, in input order.
func validate(d *specDoc) []*FieldError {
	v := &validator{
		d:           d,
		regions:     map[string]int{},
		residencies: map[string]bool{},
		badRes:      map[string]bool{},
		badClass:    map[int]bool{},
		models:      map[string]int{},
		profiles:    map[[2]string]int{},
		linked:      map[[2]string]bool{},
	}
	if d.Name != "" {
		v.name("name", d.Name)
	}
	v.checkRegions()
	v.checkNetwork()
	v.checkModels()
	v.checkProfiles()
	v.checkClasses()
	v.checkPriorities()
	v.checkFrontends()
	v.checkEngines()
	v.checkLinksUsed()
	v.checkEligibility()
	return v.errs
}

func (v *validator) errorf(path, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func isNameRune(r rune) bool {
	return r < unicode.MaxASCII && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
}

// name checks an identifier that ends up in Envoy cluster names, stats and
// headers: letters, digits, '.', '_', '-'. Reports and returns false if bad.
func (v *validator) name(path, s string) bool {
	return v.ident(path, s, isNameRune, "letters, digits, '.', '_' and '-'")
}

// modelName also allows '/' and ':' (Hugging Face ids, tags).
func (v *validator) modelName(path, s string) bool {
	return v.ident(path, s, func(r rune) bool { return isNameRune(r) || r == '/' || r == ':' }, "letters, digits, '.', '_', '-', '/' and ':'")
}

func (v *validator) ident(path, s string, ok func(rune) bool, allowed string) bool {
	if s == "" {
		v.errorf(path, "required")
		return false
	}
	if len(s) > maxNameLen || strings.IndexFunc(s, func(r rune) bool { return !ok(r) }) >= 0 {
		v.errorf(path, "%q is not a valid name (%s; at most %d characters)", s, allowed, maxNameLen)
		return false
	}
	return true
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// number checks a required number in [0, hi], 0 excluded if positive.
func (v *validator) number(path string, p *float64, hi float64, positive bool) bool {
	if p == nil {
		v.errorf(path, "required")
		return false
	}
	x := *p
	switch {
	case positive && x <= 0:
		v.errorf(path, "must be positive, got %s", fmtFloat(x))
	case !positive && x < 0:
		v.errorf(path, "must not be negative, got %s", fmtFloat(x))
	case x > hi:
		v.errorf(path, "must be at most %s, got %s", fmtFloat(hi), fmtFloat(x))
	default:
		return true
	}
	return false
}

// integer checks a required integer in [lo, hi].
func (v *validator) integer(path string, p *int, lo, hi int) bool {
	if p == nil {
		v.errorf(path, "required")
		return false
	}
	switch x := *p; {
	case x < lo && lo == 1:
		v.errorf(path, "must be positive, got %d", x)
	case x < lo && lo == 0:
		v.errorf(path, "must not be negative, got %d", x)
	case x < lo:
		v.errorf(path, "must be at least %d, got %d", lo, x)
	case x > hi:
		v.errorf(path, "must be at most %d, got %d", hi, x)
	default:
		return true
	}
	return false
}

// known lists the keys of m for a hint, if there are few.
func known[V any](m map[string]V) string {
	if len(m) == 0 || len(m) > 8 {
		return ""
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, strconv.Quote(k))
	}
	slices.Sort(ks)
	return " (known: " + strings.Join(ks, ", ") + ")"
}

// region checks a reference to a region. With no regions at all, only the
// empty list is reported.
func (v *validator) region(path, name string) bool {
	if name == "" {
		v.errorf(path, "required")
		return false
	}
	if _, ok := v.regions[name]; !ok && len(v.d.Regions) > 0 {
		v.errorf(path, "unknown region %q%s", name, known(v.regions))
		return false
	}
	return true
}

// model checks a reference to a model, like region.
func (v *validator) model(path, name string) bool {
	if name == "" {
		v.errorf(path, "required")
		return false
	}
	if _, ok := v.models[name]; !ok && len(v.d.Models) > 0 {
		v.errorf(path, "unknown model %q%s", name, known(v.models))
		return false
	}
	return true
}

func (v *validator) checkRegions() {
	if len(v.d.Regions) == 0 {
		v.errorf("regions", "at least one region required")
	}
	seen := map[string]int{}
	for i, r := range v.d.Regions {
		p := fmt.Sprintf("regions[%d]", i)
		if !v.name(p+".name", r.Name) {
			continue
		}
		if j, dup := seen[r.Name]; dup {
			v.errorf(p+".name", "duplicate region %q (also regions[%d])", r.Name, j)
			continue
		}
		seen[r.Name] = i
		v.regions[r.Name] = i
		if r.Residency != "" {
			if v.name(p+".residency", r.Residency) {
				v.residencies[r.Residency] = true
			} else {
				v.badRes[r.Residency] = true
			}
		}
	}
}

func (v *validator) checkNetwork() {
	n := &v.d.Network
	v.number("network.same_region_rtt_ms", n.SameRegionRTTMs, maxRTTMs, false)
	seen := map[[2]string]int{}
	for i, l := range n.Links {
		p := fmt.Sprintf("network.links[%d]", i)
		okA, okB := v.region(p+".a", l.A), v.region(p+".b", l.B)
		v.number(p+".rtt_ms", l.RTTMs, maxRTTMs, true)
		if !okA || !okB {
			continue
		}
		if l.A == l.B {
			v.errorf(p+".b", "link from region %q to itself (use network.same_region_rtt_ms)", l.B)
			continue
		}
		key := pair(l.A, l.B)
		if j, dup := seen[key]; dup {
			v.errorf(p, "duplicate link between %q and %q (also network.links[%d])", l.A, l.B, j)
			continue
		}
		seen[key] = i
		v.linked[key] = true // declared; a bad rtt_ms is reported above
	}
}

// pair orders two region names so a link is found from either end.
func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

func (v *validator) checkModels() {
	if len(v.d.Models) == 0 {
		v.errorf("models", "at least one model required")
	}
	seen := map[string]int{}
	for i, m := range v.d.Models {
		p := fmt.Sprintf("models[%d]", i)
		if !v.modelName(p+".name", m.Name) {
			continue
		}
		if j, dup := seen[m.Name]; dup {
			v.errorf(p+".name", "duplicate model %q (also models[%d])", m.Name, j)
			continue
		}
		seen[m.Name] = i
		ctx := 0
		if v.integer(p+".max_context_tokens", m.MaxContextTokens, 1, maxTokens) {
			ctx = *m.MaxContextTokens
		}
		v.models[m.Name] = ctx
		// ≥ 1 (a BOS at least): 0 would read as "omitted" in Go (New).
		v.integer(p+".chat_template_tokens", m.ChatTemplateTokens, 1, maxTokens)
		if strings.ContainsRune(m.Tokenizer, 0) {
			v.errorf(p+".tokenizer", "%q is not a file path", m.Tokenizer)
		}
	}
}

func (v *validator) checkProfiles() {
	seen := map[[2]string]int{}
	for i := range v.d.Profiles {
		pr := &v.d.Profiles[i]
		p := fmt.Sprintf("profiles[%d]", i)
		okGPU := v.name(p+".gpu", pr.GPU)
		okModel := v.model(p+".model", pr.Model)
		v.number(p+".prefill_tokens_per_s", pr.PrefillTokensPerS, maxRate, true)
		v.number(p+".overhead_ms", pr.OverheadMs, maxMs, false)
		v.number(p+".decode_step_ms", pr.DecodeStepMs, maxMs, true)
		v.number(p+".decode_step_per_seq_ms", pr.DecodeStepPerSeqMs, maxMs, false)
		okRun := v.integer(p+".max_running", pr.MaxRunning, 1, maxTokens)
		okBatch := v.integer(p+".max_batched_tokens", pr.MaxBatchedTokens, 1, maxTokens)
		okKV := v.integer(p+".kv_capacity_tokens", pr.KVCapacityTokens, 1, maxTokens)
		okBlock := v.integer(p+".block_size", pr.BlockSize, 1, maxTokens)
		if pr.CapacityRPS != nil {
			v.number(p+".capacity_rps", pr.CapacityRPS, maxRate, true)
		}
		v.checkCurves(p, pr)
		if okRun && okBatch && *pr.MaxBatchedTokens < *pr.MaxRunning {
			v.errorf(p+".max_batched_tokens", "%d is less than max_running %d (every running sequence needs a token per step)", *pr.MaxBatchedTokens, *pr.MaxRunning)
		}
		if okKV && okBlock && *pr.KVCapacityTokens < *pr.BlockSize {
			v.errorf(p+".kv_capacity_tokens", "%d is less than one block (block_size %d)", *pr.KVCapacityTokens, *pr.BlockSize)
		}
		// The context limit: given, or the model's.
		ctx, okCtx := 0, okModel && v.models[pr.Model] > 0
		if okCtx {
			ctx = v.models[pr.Model]
		}
		if pr.MaxContextTokens != nil {
			if okCtx = v.integer(p+".max_context_tokens", pr.MaxContextTokens, 1, maxTokens); okCtx {
				ctx = *pr.MaxContextTokens
				if okModel && v.models[pr.Model] > 0 && ctx > v.models[pr.Model] {
					v.errorf(p+".max_context_tokens", "%d exceeds model %q's max_context_tokens %d", ctx, pr.Model, v.models[pr.Model])
					okCtx = false
				}
			}
		}
		if okCtx && okKV && *pr.KVCapacityTokens < ctx {
			v.errorf(p+".kv_capacity_tokens", "%d cannot hold one request of max_context_tokens %d", *pr.KVCapacityTokens, ctx)
		}
		if !okGPU || !okModel {
			continue
		}
		key := [2]string{pr.GPU, pr.Model}
		if j, dup := seen[key]; dup {
			v.errorf(p, "duplicate profile for gpu %q and model %q (also profiles[%d])", pr.GPU, pr.Model, j)
			continue
		}
		seen[key] = i
		v.profiles[key] = ctx // 0 if the limit is broken: the entity reported it
	}
}

func (v *validator) checkClasses() {
	classes := *v.d.Classes
	if len(classes) == 0 {
		v.errorf("classes", "must not be empty (omit the key for one class per model)")
	}
	seen := map[string]int{}
	for i := range classes {
		c := &classes[i]
		p := fmt.Sprintf("classes[%d]", i)
		if v.name(p+".name", c.Name) {
			if j, dup := seen[c.Name]; dup {
				v.errorf(p+".name", "duplicate class %q (also classes[%d])", c.Name, j)
			} else {
				seen[c.Name] = i
			}
		}
		bad := !v.model(p+".model", c.Model)
		if c.Residency != "" {
			switch {
			case v.badRes[c.Residency]:
				bad = true // the region's residency is reported
			case !v.name(p+".residency", c.Residency):
				bad = true
			case !v.residencies[c.Residency] && len(v.d.Regions) > 0:
				v.errorf(p+".residency", "unknown residency %q: no region has it%s", c.Residency, known(v.residencies))
				bad = true
			case !v.residencies[c.Residency]:
				bad = true
			}
		}
		limit := 0
		if !bad {
			limit = v.models[c.Model]
		}
		if !v.integer(p+".min_context_tokens", c.MinContextTokens, 0, maxTokens) {
			bad = true
		} else if limit > 0 && *c.MinContextTokens > limit {
			v.errorf(p+".min_context_tokens", "%d exceeds model %q's max_context_tokens %d", *c.MinContextTokens, c.Model, limit)
			bad = true
		}
		if bad || limit == 0 {
			v.badClass[i] = true
		}
		okP := v.number(p+".mean_prompt_tokens", c.MeanPromptTokens, maxTokens, true)
		okO := v.number(p+".mean_output_tokens", c.MeanOutputTokens, maxTokens, true)
		if okP && okO && limit > 0 && *c.MeanPromptTokens+*c.MeanOutputTokens > float64(limit) {
			v.errorf(p+".mean_prompt_tokens", "%s plus mean_output_tokens %s exceeds model %q's max_context_tokens %d",
				fmtFloat(*c.MeanPromptTokens), fmtFloat(*c.MeanOutputTokens), c.Model, limit)
		}
		v.checkAffinity(p+".affinity", c.Affinity)
	}
}

// maxHotShare bounds affinity.hot_share: above a few engines' share no
// prefix would ever be split.
const maxHotShare = 4.0

func (v *validator) checkAffinity(p string, a *affinityDoc) {
	switch a.Mode {
	case AffinityOn, AffinityOff:
	default:
		v.errorf(p+".mode", "must be %q or %q, got %q", AffinityOn, AffinityOff, a.Mode)
	}
	if len(*a.Keys) == 0 {
		v.errorf(p+".keys", "must not be empty (mode: off turns affinity off)")
	}
	seen := map[string]int{}
	for i, k := range *a.Keys {
		kp := fmt.Sprintf("%s.keys[%d]", p, i)
		if !slices.Contains(DefaultAffinityKeys, k) {
			v.errorf(kp, "unknown key source %q (known: %s)", k, strings.Join(DefaultAffinityKeys, ", "))
			continue
		}
		if j, dup := seen[k]; dup {
			v.errorf(kp, "%q listed twice (also keys[%d])", k, j)
			continue
		}
		seen[k] = i
	}
	v.number(p+".hot_share", a.HotShare, maxHotShare, true)
	if a.SpreadMinPrefixTokens != nil {
		v.integer(p+".spread_min_prefix_tokens", a.SpreadMinPrefixTokens, 1, maxTokens)
	}
	v.integer(p+".group_min_prefix_tokens", a.GroupMinPrefixTokens, 1, maxTokens)
}

func (v *validator) checkPriorities() {
	prios := *v.d.Priorities
	if len(prios) == 0 {
		v.errorf("priorities", "must not be empty (omit the key for one default priority)")
	}
	names, levels := map[string]int{}, map[int]int{}
	type okPrio struct {
		i     int
		level int
		cost  float64
	}
	var good []okPrio
	for i, pr := range prios {
		p := fmt.Sprintf("priorities[%d]", i)
		if v.name(p+".name", pr.Name) {
			if j, dup := names[pr.Name]; dup {
				v.errorf(p+".name", "duplicate priority %q (also priorities[%d])", pr.Name, j)
			} else {
				names[pr.Name] = i
			}
		}
		okLevel := v.integer(p+".level", pr.Level, 0, 1000)
		if okLevel {
			if j, dup := levels[*pr.Level]; dup {
				v.errorf(p+".level", "duplicate level %d (also priorities[%d] %q)", *pr.Level, j, prios[j].Name)
				okLevel = false
			} else {
				levels[*pr.Level] = i
			}
		}
		if v.number(p+".shed_cost", pr.ShedCost, maxShedCost, true) && okLevel {
			good = append(good, okPrio{i, *pr.Level, *pr.ShedCost})
		}
	}
	// Shedding takes the highest level first, so a less important priority
	// must not be dearer to shed than a more important one.
	slices.SortFunc(good, func(a, b okPrio) int { return a.level - b.level })
	for k := 1; k < len(good); k++ {
		prev, cur := good[k-1], good[k]
		if cur.cost > prev.cost {
			v.errorf(fmt.Sprintf("priorities[%d].shed_cost", cur.i), "%s is higher than the shed_cost %s of the more important priority %q (level %d)",
				fmtFloat(cur.cost), fmtFloat(prev.cost), prios[prev.i].Name, prev.level)
		}
	}
}

func (v *validator) checkFrontends() {
	if len(v.d.Frontends) == 0 {
		v.errorf("frontends", "at least one frontend required")
	}
	names, nodes := map[string]int{}, map[string]int{}
	for i, f := range v.d.Frontends {
		p := fmt.Sprintf("frontends[%d]", i)
		if v.name(p+".name", f.Name) {
			if j, dup := names[f.Name]; dup {
				v.errorf(p+".name", "duplicate frontend %q (also frontends[%d])", f.Name, j)
			} else {
				names[f.Name] = i
			}
		}
		v.region(p+".region", f.Region)
		v.number(p+".max_requests_per_s", &f.MaxRequestsPerS, maxRate, false)
		switch {
		case f.NodeID == "":
			// name was empty too; reported there
		case len(f.NodeID) > maxNodeID || strings.IndexFunc(f.NodeID, func(r rune) bool { return r <= ' ' || r >= unicode.MaxASCII }) >= 0:
			v.errorf(p+".node_id", "%q is not a valid node id (printable ASCII without spaces, at most %d characters)", f.NodeID, maxNodeID)
		default:
			if j, dup := nodes[f.NodeID]; dup {
				v.errorf(p+".node_id", "duplicate node id %q (also frontends[%d])", f.NodeID, j)
			} else {
				nodes[f.NodeID] = i
			}
		}
	}
}

func (v *validator) checkEngines() {
	if len(v.d.Engines) == 0 {
		v.errorf("engines", "at least one engine required")
	}
	ids, addrs := map[string]int{}, map[string]int{}
	for i, e := range v.d.Engines {
		p := fmt.Sprintf("engines[%d]", i)
		if v.name(p+".id", e.ID) {
			if j, dup := ids[e.ID]; dup {
				v.errorf(p+".id", "duplicate engine id %q (also engines[%d])", e.ID, j)
			} else {
				ids[e.ID] = i
			}
		}
		if v.address(p+".address", e.Address) {
			if j, dup := addrs[e.Address]; dup {
				v.errorf(p+".address", "duplicate address %q (also engines[%d] %q)", e.Address, j, v.d.Engines[j].ID)
			} else {
				addrs[e.Address] = i
			}
		}
		v.region(p+".region", e.Region)
		okGPU := v.name(p+".gpu", e.GPU)
		okModel := v.model(p+".model", e.Model)
		if okGPU && okModel {
			if _, ok := v.profiles[[2]string{e.GPU, e.Model}]; !ok {
				v.errorf(p+".gpu", "no profile for gpu %q and model %q", e.GPU, e.Model)
			}
		}
		v.integer(p+".replicas", e.Replicas, 1, maxReplicas)
		if !slices.Contains(ServerKinds, e.Server) {
			v.errorf(p+".server", "unknown server kind %q (known: %s)", e.Server, strings.Join(ServerKinds, ", "))
		}
		v.healthPath(p+".health_path", e.HealthPath)
		keys := make([]string, 0, len(e.Labels))
		for k := range e.Labels {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if k == "" || len(k) > maxLabelLen {
				v.errorf(p+".labels", "label key %q must be 1 to %d bytes", k, maxLabelLen)
			} else if len(e.Labels[k]) > maxLabelLen {
				v.errorf(p+".labels."+k, "value longer than %d bytes", maxLabelLen)
			}
		}
	}
}

// healthPath checks an HTTP path Envoy can put in a health check: absolute,
// printable ASCII without spaces, no query or fragment.
func (v *validator) healthPath(path, hp string) {
	switch {
	case hp == "" || hp[0] != '/':
		v.errorf(path, "%q must start with /", hp)
	case len(hp) > 1024 || strings.IndexFunc(hp, func(r rune) bool { return r <= ' ' || r >= unicode.MaxASCII || r == '?' || r == '#' }) >= 0:
		v.errorf(path, "%q is not a plain URL path (printable ASCII without spaces, '?' or '#', at most 1024 bytes)", hp)
	}
}

// address checks host:port, port 1-65535, host an IP or a DNS name.
func (v *validator) address(path, a string) bool {
	if a == "" {
		v.errorf(path, "required")
		return false
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		v.errorf(path, "%q is not host:port", a)
		return false
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		v.errorf(path, "%q: port %q is not a number from 1 to 65535", a, port)
		return false
	}
	if net.ParseIP(host) != nil {
		return true
	}
	if host == "" || len(host) > maxHostLen || strings.IndexFunc(host, func(r rune) bool {
		return !(r < unicode.MaxASCII && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-'))
	}) >= 0 || strings.HasPrefix(host, "-") || strings.HasPrefix(host, ".") || strings.Contains(host, "..") {
		v.errorf(path, "%q: host %q is not an IP address or DNS name", a, host)
		return false
	}
	return true
}

// checkLinksUsed requires a link for every (frontend region, engine region)
// pair of different regions that occurs in the fleet: a frontend may send
// traffic to any engine, so the optimizer needs every such distance.
func (v *validator) checkLinksUsed() {
	var fRegions, eRegions []string
	firstF, firstE := map[string]int{}, map[string]int{}
	for i, f := range v.d.Frontends {
		if _, ok := v.regions[f.Region]; ok {
			if _, seen := firstF[f.Region]; !seen {
				firstF[f.Region] = i
				fRegions = append(fRegions, f.Region)
			}
		}
	}
	for i, e := range v.d.Engines {
		if _, ok := v.regions[e.Region]; ok {
			if _, seen := firstE[e.Region]; !seen {
				firstE[e.Region] = i
				eRegions = append(eRegions, e.Region)
			}
		}
	}
	reported := map[[2]string]bool{}
	for _, fr := range fRegions {
		for _, er := range eRegions {
			key := pair(fr, er)
			if fr == er || v.linked[key] || reported[key] {
				continue
			}
			reported[key] = true
			v.errorf("network.links", "no link between frontend region %q (frontends[%d]) and engine region %q (engines[%d])",
				fr, firstF[fr], er, firstE[er])
		}
	}
}

// checkEligibility requires every well-formed class to have an engine:
// the model matches, the engine's region has the class's residency (if
// set), and the engine's context limit is at least min_context_tokens.
//
// A class is not judged when it is itself wrong, or when an engine of its
// model is broken (unknown region, no profile, a profile without a valid
// context limit): that engine's problem is reported instead.
func (v *validator) checkEligibility() {
	if len(v.d.Engines) == 0 {
		return
	}
	for i, c := range *v.d.Classes {
		if v.badClass[i] {
			continue
		}
		found, unknown := false, false
		for _, e := range v.d.Engines {
			if e.Model != c.Model {
				continue
			}
			ri, okR := v.regions[e.Region]
			ctx, okP := v.profiles[[2]string{e.GPU, e.Model}]
			if !okR || !okP || ctx == 0 {
				unknown = true
				continue
			}
			if c.Residency != "" && v.d.Regions[ri].Residency != c.Residency {
				continue
			}
			if ctx >= *c.MinContextTokens {
				found = true
				break
			}
		}
		if !found && !unknown {
			desc := fmt.Sprintf("model %q", c.Model)
			if c.Residency != "" {
				desc += fmt.Sprintf(", residency %q", c.Residency)
			}
			if *c.MinContextTokens > 0 {
				desc += fmt.Sprintf(", context limit at least %d", *c.MinContextTokens)
			}
			v.errorf(fmt.Sprintf("classes[%d]", i), "class %q has no eligible engine (%s)", c.Name, desc)
		}
	}
}

// checkCurves checks a profile's measured curves: convex and increasing in
// u, positive at zero load (what the optimizer's latency model needs), at
// least one of them growing with load, and measured against a stated
// capacity (u = rate / capacity_rps: against a derived capacity the curve
// would slide along the load axis).
func (v *validator) checkCurves(p string, pr *profileDoc) {
	curves := []struct {
		key   string
		curve *curveDoc
	}{{"ttft_curve", pr.TTFTCurve}, {"tbot_curve", pr.TBOTCurve}}
	given, ok, growth := "", true, 0.0
	for _, c := range curves {
		if c.curve == nil {
			continue
		}
		if given == "" {
			given = c.key
		}
		ok = v.number(p+"."+c.key+".base_ms", c.curve.BaseMs, maxMs, true) && ok
		okL := v.number(p+"."+c.key+".linear_ms", c.curve.LinearMs, maxMs, false)
		okQ := v.number(p+"."+c.key+".queue_ms", c.curve.QueueMs, maxMs, false)
		if ok = ok && okL && okQ; ok {
			growth += *c.curve.LinearMs + *c.curve.QueueMs
		}
	}
	switch {
	case given == "":
	case pr.CapacityRPS == nil:
		v.errorf(p+"."+given, "measured curves need the capacity they were measured against (capacity_rps)")
	case ok && pr.TTFTCurve != nil && pr.TBOTCurve != nil && growth == 0:
		v.errorf(p+"."+given, "latency does not grow with load (linear_ms and queue_ms are 0 in both curves)")
	}
}
