// Package fleet describes a fleet of frontend clusters and inference engines:
// the regions they live in, the network distance between them, the models and
// eligibility classes served, the engines, and the latency profile of each
// (GPU type, model) pair. It is the one input every inferlb component shares.
//
// A spec is read with Parse or Load, which decode the YAML (unknown keys are
// errors) and then go through three steps, in the style of grpc-go's balancer
// configs: defaults (fill fields the user omitted, never overwriting a value
// that was given), validate (collect every problem, each naming the field
// path and the bad value), normalize (effective values, derived fields, lookup
// indexes). New does the same for a Spec built in Go. The lookups (RTT,
// EligibleEngines, Classify, ProfileOf, FrontendByNodeID, EngineByID, ...)
// are safe for concurrent use. docs/fleet-spec.md documents every key.
package fleet

// Spec is a fleet spec. Field names are the YAML keys; docs/fleet-spec.md
// describes every key, its default, its unit and its rules.
//
// A Spec returned by Parse, Load or New has been defaulted, validated and
// normalized: every optional field holds its effective value, every reference
// resolves, and the lookup methods (RTT, EligibleEngines, Classify, ProfileOf,
// ...) answer from indexes built once. Such a Spec is read-only: do not modify
// it (nor the slices and maps it holds); it is then safe to share between
// goroutines. Slices keep the order of the input.
type Spec struct {
	// Name labels the fleet in logs and metrics.
	Name string `yaml:"name,omitempty"`
	// Regions are the places frontends and engines live in.
	Regions []Region `yaml:"regions"`
	// Network gives the round trip between a frontend region and an engine
	// region. Pairs not listed are an error unless both are the same region
	// (then SameRegionRTTMs applies).
	Network Network `yaml:"network"`
	// Models served by the fleet.
	Models []Model `yaml:"models"`
	// Profiles are latency profiles per (GPU type, model).
	Profiles []Profile `yaml:"profiles"`
	// Classes are the eligibility classes: each selects the engines that may
	// serve a request and becomes one Envoy cluster per frontend.
	Classes []Class `yaml:"classes"`
	// Priorities, highest first in importance by Level (0 is most important).
	Priorities []Priority `yaml:"priorities"`
	// Frontends are the CPU clusters (Envoy nodes) that receive client traffic.
	Frontends []Frontend `yaml:"frontends"`
	// Engines are the inference engines.
	Engines []Engine `yaml:"engines"`

	// ix holds the lookups built by normalize; nil for a Spec not built by
	// Parse, Load or New.
	ix *index
}

// Region is a place. Residency is the data-residency zone it belongs to
// (e.g. "eu"); requests that demand a residency only go to engines in regions
// of that zone.
type Region struct {
	Name      string `yaml:"name"`
	Residency string `yaml:"residency,omitempty"`
}

// Network holds round-trip times in milliseconds.
type Network struct {
	// SameRegionRTTMs is the round trip inside one region (default 1 ms).
	// Always set in a parsed Spec.
	SameRegionRTTMs *float64 `yaml:"same_region_rtt_ms"`
	// Links are symmetric round trips between two regions.
	Links []Link `yaml:"links"`
}

// Link is a symmetric round trip between regions A and B.
type Link struct {
	A     string  `yaml:"a"`
	B     string  `yaml:"b"`
	RTTMs float64 `yaml:"rtt_ms"`
}

// Model is a served model.
type Model struct {
	Name string `yaml:"name"`
	// MaxContextTokens is the model's own context limit.
	MaxContextTokens int `yaml:"max_context_tokens"`
	// Tokenizer is the path of the model's Hugging Face tokenizer.json
	// (relative paths are relative to the spec file when read by Load);
	// empty: context limits use the bytes bound (internal/tokens).
	Tokenizer string `yaml:"tokenizer,omitempty"`
	// TokenizerSHA256 is derived, not written: the SHA-256 (hex) of the
	// tokenizer's JSON, set by Load (empty from Parse and New, which read no
	// files).
	TokenizerSHA256 string `yaml:"-"`
	// ChatTemplateTokens bounds the tokens the model's chat template adds
	// that are not in the request's JSON (a default system prompt, the
	// generation prompt, BOS). Always set in a parsed Spec.
	ChatTemplateTokens int `yaml:"chat_template_tokens"`
}

// Profile is the latency profile of one model on one GPU type. The engine
// simulator executes it; the optimizer reads its queueing form.
//
// Step model (vLLM-like continuous batching, see engine-calibration.md §5):
// a scheduler step that prefills p uncached tokens and decodes for B running
// sequences takes DecodeStepMs + DecodeStepPerSeqMs·B + p/PrefillTokensPerS.
type Profile struct {
	GPU   string `yaml:"gpu"`
	Model string `yaml:"model"`
	// PrefillTokensPerS is the prefill throughput for uncached prompt tokens.
	PrefillTokensPerS float64 `yaml:"prefill_tokens_per_s"`
	// OverheadMs is the fixed per-request cost (API, tokenization, first step).
	OverheadMs float64 `yaml:"overhead_ms"`
	// DecodeStepMs is the decode step time at batch 1 (intercept a).
	DecodeStepMs float64 `yaml:"decode_step_ms"`
	// DecodeStepPerSeqMs is the added step time per running sequence (slope b).
	DecodeStepPerSeqMs float64 `yaml:"decode_step_per_seq_ms"`
	// MaxRunning is vLLM's max_num_seqs: running slots.
	MaxRunning int `yaml:"max_running"`
	// MaxBatchedTokens is vLLM's max_num_batched_tokens (chunked prefill budget per step).
	MaxBatchedTokens int `yaml:"max_batched_tokens"`
	// KVCapacityTokens is the KV cache size in tokens.
	KVCapacityTokens int `yaml:"kv_capacity_tokens"`
	// BlockSize is the KV block size in tokens (vLLM default 16).
	BlockSize int `yaml:"block_size"`
	// MaxContextTokens is the longest prompt+output this deployment accepts
	// (vLLM's max_model_len). Omitted: the model's limit (always set in a
	// parsed Spec).
	MaxContextTokens int `yaml:"max_context_tokens"`
	// CapacityRPS is the sustainable request rate at the reference request
	// shape, used by the optimizer; 0 (omitted) means derive it from the step
	// model.
	CapacityRPS float64 `yaml:"capacity_rps,omitempty"`
	// TTFTCurve and TBOTCurve are measured latency curves of the reference
	// request against utilization (`inferlb profile` fits them); the
	// optimizer uses them instead of the curves it derives from the step
	// model. Omitted (nil): derived.
	TTFTCurve *Curve `yaml:"ttft_curve,omitempty"`
	TBOTCurve *Curve `yaml:"tbot_curve,omitempty"`
}

// Curve is a latency curve in milliseconds at utilization u:
// BaseMs + LinearMs·u + QueueMs·u/(1−u).
type Curve struct {
	BaseMs   float64 `yaml:"base_ms"`
	LinearMs float64 `yaml:"linear_ms"`
	QueueMs  float64 `yaml:"queue_ms"`
}

// Class is an eligibility class: the engines serving Model, restricted to
// regions whose residency is Residency (empty: anywhere) and to engines whose
// context limit is at least MinContextTokens.
type Class struct {
	Name             string `yaml:"name"`
	Model            string `yaml:"model"`
	Residency        string `yaml:"residency,omitempty"`
	MinContextTokens int    `yaml:"min_context_tokens,omitempty"`
	// MeanPromptTokens and MeanOutputTokens describe the class's typical
	// request, used when demand reports carry no token counts.
	MeanPromptTokens float64 `yaml:"mean_prompt_tokens"`
	MeanOutputTokens float64 `yaml:"mean_output_tokens"`
	// Affinity configures the class's cache-affinity key. Always set in
	// a parsed Spec (every field effective).
	Affinity Affinity `yaml:"affinity"`
	// ContextLimit is derived, not written: the smallest context limit among
	// the class's eligible engines, i.e. the longest request (prompt plus
	// output tokens) every engine of the class accepts. Classify uses it.
	ContextLimit int `yaml:"-"`
}

// Affinity configures how ext_proc keys a class's requests for Envoy's
// consistent hash, and how the control plane splits hot prefixes
// (docs/extproc.md, docs/control-plane.md).
type Affinity struct {
	// Mode is AffinityOn (default) or AffinityOff: every request a fresh
	// random key, so Envoy spreads requests evenly (baselines, operators).
	Mode string `yaml:"mode"`
	// Keys are the key sources in the order tried; the first one a request
	// has keys it: KeySession (the x-session-id header),
	// KeyPromptCacheKey, KeyUser (body fields), KeyPrefix (the prompt's
	// prefix chain). Default: all four in that order.
	Keys []string `yaml:"keys"`
	// HotShare: a prefix is hot when its load exceeds this fraction of one
	// engine's share of the class's load (default 0.5).
	HotShare float64 `yaml:"hot_share"`
	// SpreadMinPrefixTokens: a hot prefix at least this long is spread over
	// a few engines (its conversations modulo R), shorter ones are keyed
	// deeper, on their conversations (every engine then caches them).
	// Default: a tenth of the smallest KV cache among the class's engines.
	SpreadMinPrefixTokens int `yaml:"spread_min_prefix_tokens"`
	// GroupMinPrefixTokens: a shared prefix whose load one engine can serve
	// keys the conversations sharing it together when it is at least this
	// long (default 1024).
	GroupMinPrefixTokens int `yaml:"group_min_prefix_tokens"`
}

// Affinity modes and key sources (Affinity.Mode, Affinity.Keys).
const (
	AffinityOn        = "on"
	AffinityOff       = "off"
	KeySession        = "session"
	KeyPromptCacheKey = "prompt_cache_key"
	KeyUser           = "user"
	KeyPrefix         = "prefix"
)

// DefaultAffinityKeys is the key order of a class that names none.
var DefaultAffinityKeys = []string{KeySession, KeyPromptCacheKey, KeyUser, KeyPrefix}

// Priority is a traffic priority. Level 0 is the most important; shedding
// takes the highest Level first. ShedCost weighs shedding it in the optimizer.
type Priority struct {
	Name  string `yaml:"name"`
	Level int    `yaml:"level"`
	// ShedCost is the relative cost of shedding one request of this
	// priority (a positive weight, no unit): when demand cannot fit, the
	// optimizer sheds the priority with the smallest ShedCost first. Must not
	// exceed the ShedCost of a more important priority (lower Level), so
	// that cost order and level order agree.
	ShedCost float64 `yaml:"shed_cost"`
}

// Frontend is a CPU cluster: a fleet of Envoys sharing one node id.
type Frontend struct {
	Name   string `yaml:"name"`
	Region string `yaml:"region"`
	NodeID string `yaml:"node_id"`
	// MaxRequestsPerS is the most requests per second the frontend can
	// physically carry (its Envoys and ext_proc instances together). The
	// control plane refuses demand reports above it and caps the node's
	// demand at it, so a faulty or forged reporter cannot claim more. 0
	// (omitted): twice the fleet's capacity at the reference request.
	MaxRequestsPerS float64 `yaml:"max_requests_per_s,omitempty"`
}

// Engine is one inference engine (a vLLM server, or a group of identical
// replicas behind one address).
type Engine struct {
	ID       string            `yaml:"id"`
	Address  string            `yaml:"address"`
	Region   string            `yaml:"region"`
	GPU      string            `yaml:"gpu"`
	Model    string            `yaml:"model"`
	Replicas int               `yaml:"replicas"`
	Labels   map[string]string `yaml:"labels,omitempty"`
	// Server is the kind of model server (ServerVLLM, ServerSGLang,
	// ServerGeneric, ServerLlamaCpp): it selects the metric names the control plane reads
	// and the default HealthPath. Always set in a parsed Spec.
	Server string `yaml:"server"`
	// HealthPath is the HTTP path Envoy's active health check and the
	// control plane probe; 2xx means ready for traffic. Always set in a
	// parsed Spec.
	HealthPath string `yaml:"health_path"`
}

// Model server kinds (engines[].server).
const (
	// ServerVLLM: vLLM's /metrics names (current and older), /health.
	ServerVLLM = "vllm"
	// ServerSGLang: SGLang's sglang: metrics, /health_generate.
	ServerSGLang = "sglang"
	// ServerGeneric: an OpenAI-compatible server whose metrics are not
	// known; vLLM names are read when present, none is required, /health.
	ServerGeneric = "generic"
	// ServerLlamaCpp: llama.cpp's llama-server (started with --metrics):
	// its llamacpp: metrics, /health.
	ServerLlamaCpp = "llamacpp"
)

// ServerKinds lists the accepted engines[].server values.
var ServerKinds = []string{ServerVLLM, ServerSGLang, ServerGeneric, ServerLlamaCpp}

// DefaultHealthPath is the health path of a server kind.
func DefaultHealthPath(server string) string {
	if server == ServerSGLang {
		return "/health_generate"
	}
	return "/health"
}
