package fleet

import (
	"maps"
	"slices"
	"strings"
)

// index holds the lookups of a normalized Spec. Built once by normalize and
// never modified, so concurrent readers need no locks.
type index struct {
	regions    map[string]int
	models     map[string]int
	profiles   map[[2]string]int // (gpu, model) → index in Profiles
	classes    map[string]int
	priorities map[string]int
	frontends  map[string]int // node id → index
	engines    map[string]int // id → index
	rttMs      map[[2]string]float64
	sameRTTMs  float64

	eligible [][]int // class index → engine indexes, in input order
	// byModel lists, per model, the class indexes in Classify's order of
	// preference: no residency first, then by ContextLimit, then by name.
	byModel map[string][]int
}

// normalize turns a validated specDoc into a Spec: optional fields hold their
// effective values, derived fields are computed, and the lookups are built.
// It assumes validate found nothing.
func normalize(d *specDoc) *Spec {
	s := &Spec{
		Name:    d.Name,
		Regions: slices.Clone(d.Regions),
		Network: Network{SameRegionRTTMs: ptr(*d.Network.SameRegionRTTMs)},
	}
	for _, l := range d.Network.Links {
		s.Network.Links = append(s.Network.Links, Link{A: l.A, B: l.B, RTTMs: *l.RTTMs})
	}
	modelCtx := map[string]int{}
	for _, m := range d.Models {
		s.Models = append(s.Models, Model{Name: m.Name, MaxContextTokens: *m.MaxContextTokens,
			Tokenizer: m.Tokenizer, TokenizerSHA256: m.TokenizerSHA256, ChatTemplateTokens: *m.ChatTemplateTokens})
		modelCtx[m.Name] = *m.MaxContextTokens
	}
	for _, p := range d.Profiles {
		ctx := modelCtx[p.Model]
		if p.MaxContextTokens != nil {
			ctx = *p.MaxContextTokens
		}
		s.Profiles = append(s.Profiles, Profile{
			GPU:                p.GPU,
			Model:              p.Model,
			PrefillTokensPerS:  *p.PrefillTokensPerS,
			OverheadMs:         *p.OverheadMs,
			DecodeStepMs:       *p.DecodeStepMs,
			DecodeStepPerSeqMs: *p.DecodeStepPerSeqMs,
			MaxRunning:         *p.MaxRunning,
			MaxBatchedTokens:   *p.MaxBatchedTokens,
			KVCapacityTokens:   *p.KVCapacityTokens,
			BlockSize:          *p.BlockSize,
			MaxContextTokens:   ctx,
			CapacityRPS:        deref(p.CapacityRPS),
			TTFTCurve:          curveOf(p.TTFTCurve),
			TBOTCurve:          curveOf(p.TBOTCurve),
		})
	}
	for _, c := range *d.Classes {
		s.Classes = append(s.Classes, Class{
			Name:             c.Name,
			Model:            c.Model,
			Residency:        c.Residency,
			MinContextTokens: *c.MinContextTokens,
			MeanPromptTokens: *c.MeanPromptTokens,
			MeanOutputTokens: *c.MeanOutputTokens,
			Affinity: Affinity{
				Mode:                  c.Affinity.Mode,
				Keys:                  slices.Clone(*c.Affinity.Keys),
				HotShare:              *c.Affinity.HotShare,
				SpreadMinPrefixTokens: deref(c.Affinity.SpreadMinPrefixTokens), // 0: derived below
				GroupMinPrefixTokens:  *c.Affinity.GroupMinPrefixTokens,
			},
		})
	}
	for _, p := range *d.Priorities {
		s.Priorities = append(s.Priorities, Priority{Name: p.Name, Level: *p.Level, ShedCost: *p.ShedCost})
	}
	s.Frontends = slices.Clone(d.Frontends)
	for _, e := range d.Engines {
		s.Engines = append(s.Engines, Engine{
			ID:         e.ID,
			Address:    e.Address,
			Region:     e.Region,
			GPU:        e.GPU,
			Model:      e.Model,
			Replicas:   *e.Replicas,
			Labels:     maps.Clone(e.Labels),
			Server:     e.Server,
			HealthPath: e.HealthPath,
		})
	}
	s.ix = buildIndex(s)
	return s
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func buildIndex(s *Spec) *index {
	ix := &index{
		regions:    make(map[string]int, len(s.Regions)),
		models:     make(map[string]int, len(s.Models)),
		profiles:   make(map[[2]string]int, len(s.Profiles)),
		classes:    make(map[string]int, len(s.Classes)),
		priorities: make(map[string]int, len(s.Priorities)),
		frontends:  make(map[string]int, len(s.Frontends)),
		engines:    make(map[string]int, len(s.Engines)),
		rttMs:      make(map[[2]string]float64, len(s.Network.Links)),
		sameRTTMs:  *s.Network.SameRegionRTTMs,
		eligible:   make([][]int, len(s.Classes)),
		byModel:    map[string][]int{},
	}
	for i, r := range s.Regions {
		ix.regions[r.Name] = i
	}
	for i, m := range s.Models {
		ix.models[m.Name] = i
	}
	for i, p := range s.Profiles {
		ix.profiles[[2]string{p.GPU, p.Model}] = i
	}
	for i, c := range s.Classes {
		ix.classes[c.Name] = i
	}
	for i, p := range s.Priorities {
		ix.priorities[p.Name] = i
	}
	for i, f := range s.Frontends {
		ix.frontends[f.NodeID] = i
	}
	for i, e := range s.Engines {
		ix.engines[e.ID] = i
	}
	for _, l := range s.Network.Links {
		ix.rttMs[pair(l.A, l.B)] = l.RTTMs
	}
	for ci := range s.Classes {
		c := &s.Classes[ci]
		limit, kv := 0, 0
		for ei, e := range s.Engines {
			if e.Model != c.Model {
				continue
			}
			if c.Residency != "" && s.Regions[ix.regions[e.Region]].Residency != c.Residency {
				continue
			}
			prof := &s.Profiles[ix.profiles[[2]string{e.GPU, e.Model}]]
			ctx := prof.MaxContextTokens
			if ctx < c.MinContextTokens {
				continue
			}
			ix.eligible[ci] = append(ix.eligible[ci], ei)
			if limit == 0 || ctx < limit {
				limit = ctx
			}
			if kv == 0 || prof.KVCapacityTokens < kv {
				kv = prof.KVCapacityTokens
			}
		}
		c.ContextLimit = limit
		if c.Affinity.SpreadMinPrefixTokens == 0 {
			c.Affinity.SpreadMinPrefixTokens = max(1, int(float64(kv)*DefaultSpreadKVFraction))
		}
		ix.byModel[c.Model] = append(ix.byModel[c.Model], ci)
	}
	for _, list := range ix.byModel {
		slices.SortStableFunc(list, func(a, b int) int {
			ca, cb := &s.Classes[a], &s.Classes[b]
			if ra, rb := ca.Residency != "", cb.Residency != ""; ra != rb {
				if ra {
					return 1
				}
				return -1
			}
			if ca.ContextLimit != cb.ContextLimit {
				return ca.ContextLimit - cb.ContextLimit
			}
			return strings.Compare(ca.Name, cb.Name)
		})
	}
	return ix
}

// curveOf is a validated curve, or nil when omitted.
func curveOf(c *curveDoc) *Curve {
	if c == nil {
		return nil
	}
	return &Curve{BaseMs: *c.BaseMs, LinearMs: *c.LinearMs, QueueMs: *c.QueueMs}
}
