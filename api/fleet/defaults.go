package fleet

import (
	"slices"
	"strings"
)

// Defaults for omitted optional fields. docs/fleet-spec.md lists them with
// their reasons; engine-calibration.md §5 is the source of the vLLM ones.
const (
	DefaultSameRegionRTTMs  = 1.0   // ms, one region's typical inter-AZ round trip
	DefaultReplicas         = 1     // an engine address is one server
	DefaultOverheadMs       = 0.0   // ms per request, no fixed cost unless given
	DefaultMaxRunning       = 256   // vLLM max_num_seqs
	DefaultMaxBatchedTokens = 8192  // vLLM max_num_batched_tokens (chunked prefill)
	DefaultBlockSize        = 16    // vLLM KV block size in tokens
	DefaultMeanPromptTokens = 200.0 // ShareGPT-like request shape
	DefaultMeanOutputTokens = 200.0
	DefaultHotShare         = 0.5  // of one engine's share of its class
	DefaultGroupMinTokens   = 1024 // tokens of a shared prefix worth grouping on
	DefaultSpreadKVFraction = 0.1  // hot prefixes this share of a KV cache are spread
	DefaultPriorityName     = "default"
	DefaultShedCost         = 1000.0 // the default priority's shed cost (relative)
	// DefaultChatTemplateTokens covers the chat templates of common models
	// (Llama 3.1's injected system header is about 30 tokens, ChatML's
	// generation prompt 3, Qwen3's empty think block 6) with room to spare.
	DefaultChatTemplateTokens = 64
	DefaultServer             = ServerVLLM
)

// setDefaults fills the optional fields the user omitted (nil pointers, empty
// optional strings, absent lists), and nothing else: a value that is present,
// even if wrong, is left for validate to report. Defaults that depend on other
// entities (a profile's context limit is its model's) are resolved by
// normalize, after validation has proved the reference good.
func setDefaults(d *specDoc) {
	if d.Network.SameRegionRTTMs == nil {
		d.Network.SameRegionRTTMs = ptr(DefaultSameRegionRTTMs)
	}
	for i := range d.Profiles {
		defaultProfile(&d.Profiles[i])
	}
	if d.Classes == nil {
		d.Classes = ptr(defaultClasses(d.Models))
	}
	for i := range *d.Classes {
		defaultClass(&(*d.Classes)[i])
	}
	if d.Priorities == nil {
		d.Priorities = &[]priorityDoc{{Name: DefaultPriorityName, Level: ptr(0), ShedCost: ptr(DefaultShedCost)}}
	}
	for i := range d.Frontends {
		if d.Frontends[i].NodeID == "" {
			d.Frontends[i].NodeID = d.Frontends[i].Name
		}
	}
	for i := range d.Models {
		if d.Models[i].ChatTemplateTokens == nil {
			d.Models[i].ChatTemplateTokens = ptr(DefaultChatTemplateTokens)
		}
	}
	for i := range d.Engines {
		e := &d.Engines[i]
		if e.Replicas == nil {
			e.Replicas = ptr(DefaultReplicas)
		}
		if e.Server == "" {
			e.Server = DefaultServer
		}
		if e.HealthPath == "" {
			e.HealthPath = DefaultHealthPath(e.Server)
		}
	}
}

func defaultProfile(p *profileDoc) {
	if p.OverheadMs == nil {
		p.OverheadMs = ptr(DefaultOverheadMs)
	}
	if p.MaxRunning == nil {
		p.MaxRunning = ptr(DefaultMaxRunning)
	}
	if p.MaxBatchedTokens == nil {
		p.MaxBatchedTokens = ptr(DefaultMaxBatchedTokens)
	}
	if p.BlockSize == nil {
		p.BlockSize = ptr(DefaultBlockSize)
	}
}

// defaultClasses gives one class per model, named after it, with no
// residency or context requirement: the fleet serves each model anywhere.
func defaultClasses(models []modelDoc) []classDoc {
	out := []classDoc{}
	for _, m := range models {
		if m.Name == "" {
			continue
		}
		out = append(out, classDoc{Name: className(m.Name), Model: m.Name})
	}
	return out
}

// className makes a model name usable as a class (Envoy cluster) name.
func className(model string) string {
	return strings.Map(func(r rune) rune {
		if isNameRune(r) {
			return r
		}
		return '-'
	}, model)
}

// defaultClass: no context requirement; the ShareGPT-like request shape, with
// a long-context class's prompts assumed to fill half its minimum context.
func defaultClass(c *classDoc) {
	if c.MinContextTokens == nil {
		c.MinContextTokens = ptr(0)
	}
	if c.MeanPromptTokens == nil {
		c.MeanPromptTokens = ptr(max(DefaultMeanPromptTokens, float64(*c.MinContextTokens)/2))
	}
	if c.MeanOutputTokens == nil {
		c.MeanOutputTokens = ptr(DefaultMeanOutputTokens)
	}
	if c.Affinity == nil {
		c.Affinity = &affinityDoc{}
	}
	a := c.Affinity
	if a.Mode == "" {
		a.Mode = AffinityOn
	}
	if a.Keys == nil {
		a.Keys = ptr(slices.Clone(DefaultAffinityKeys))
	}
	if a.HotShare == nil {
		a.HotShare = ptr(DefaultHotShare)
	}
	if a.GroupMinPrefixTokens == nil {
		a.GroupMinPrefixTokens = ptr(DefaultGroupMinTokens)
	}
	// SpreadMinPrefixTokens depends on the class's engines: normalize.
}

func ptr[T any](v T) *T { return &v }
