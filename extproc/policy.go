package extproc

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/inferlb/inferlb/api/headers"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/tokens/hf"
)

// Policy is an immutable, compiled RoutingPolicy: the hot path reads it
// through an atomic pointer and never locks. A new policy replaces the old
// one whole; per-class runtime state (in-flight count, retry budget) lives in
// classState objects that survive the swap, matched by class name.
type Policy struct {
	Version string
	NodeID  string
	Region  string

	byModel map[string][]*Class
	classes []*Class

	priorities      map[string]uint32
	defaultPriority string
	defaultLevel    uint32
	maxLevel        uint32
	levelNames      []string // by level, "" where unused

	adm Admission // local admission tuning (setAdmission)

	engines map[string]string // upstream address → engine id
	regions map[string]string // upstream address → engine region

	// src is the RoutingPolicy compiled (read-only): the endpoint picker
	// builds its tables from it (Source).
	src *policyv1.RoutingPolicy

	// regionHdr is the decision's source-region header, built once (nil
	// without a region).
	regionHdr *corev3.HeaderValueOption
	// maxContext is the largest context guarantee of its classes (0 if a
	// class has none: then no request is provably too long): the parser's
	// body.Limits.MaxContext.
	maxContext int
}

// Class is one eligibility class of a Policy.
type Class struct {
	Name, Cluster, Model, Residency string
	MinContext, MaxContext          int
	// shed[level] is the effective shed fraction (see Compile).
	shed          []float64
	RetryFraction float64
	MaxRetries    int
	InflightLimit int
	Utilization   float64
	// retryBurst is the most retries the budget holds (Admission).
	retryBurst float64
	// MeanOutputTokens stands in for max_tokens in demand reports when a
	// request states none.
	MeanOutputTokens int
	// TokenizerSHA256 names the model's tokenizer.json ("" none) and
	// TemplateTokens bounds what its chat template adds (routeByContext).
	TokenizerSHA256 string
	TemplateTokens  int
	// tokenizer is the loaded tokenizer of that digest (nil: the bytes
	// bound only), set by the Server when it installs the policy.
	tokenizer *hf.Tokenizer

	// aff derives the class's affinity keys (affinity.go).
	aff affinity

	state *classState
	// The decision's cluster and class headers, built once by Compile and
	// shared read-only by every response.
	clusterHdr, classHdr *corev3.HeaderValueOption
}

// ShedFraction returns the effective fraction shed at a priority level.
func (c *Class) ShedFraction(level uint32) float64 {
	if int(level) < len(c.shed) {
		return c.shed[level]
	}
	return 0
}

// Classes returns the policy's classes, sorted by name.
func (p *Policy) Classes() []*Class { return p.classes }

// Level returns the level of a priority name.
func (p *Policy) Level(name string) (uint32, bool) {
	l, ok := p.priorities[name]
	return l, ok
}

// EngineID names the engine at an upstream address ("" if unknown).
func (p *Policy) EngineID(addr string) string {
	if p == nil {
		return ""
	}
	return p.engines[addr]
}

// PriorityName returns the name of a level ("" if none).
func (p *Policy) PriorityName(level uint32) string {
	if int(level) < len(p.levelNames) {
		return p.levelNames[level]
	}
	return ""
}

// Compile validates a RoutingPolicy and builds the hot-path form. states
// supplies the runtime state per class name (created when missing); nil
// gives every class fresh state.
//
// Shed fractions are made consistent with "lowest priority first": a level
// sheds only when every less important level (higher number) sheds
// everything; otherwise its effective fraction is 0. The control plane's
// optimizer should never publish anything else; this is the guard.
func Compile(rp *policyv1.RoutingPolicy, states func(name string) *classState) (*Policy, error) {
	if rp == nil {
		return nil, fmt.Errorf("policy: nil")
	}
	if states == nil { // a policy to inspect (explain-key), not to serve
		states = func(string) *classState { return newClassState() }
	}
	p := &Policy{
		src:        rp,
		Version:    rp.GetVersion(),
		NodeID:     rp.GetNodeId(),
		Region:     rp.GetRegion(),
		byModel:    map[string][]*Class{},
		priorities: map[string]uint32{},
		engines:    map[string]string{},
		regions:    map[string]string{},
	}
	if p.Region != "" {
		p.regionHdr = setHeader(headers.SourceRegion, p.Region)
	}
	if err := validHeaderValue(p.Region); err != nil {
		return nil, fmt.Errorf("policy: region: %w", err)
	}
	if err := labelValue(p.Version); err != nil {
		return nil, fmt.Errorf("policy: version: %w", err)
	}
	levels, err := p.compilePriorities(rp)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, cp := range rp.GetClasses() {
		c, err := compileClass(i, cp, p.maxLevel, levels, seen)
		if err != nil {
			return nil, err
		}
		seen[c.Name] = true
		c.state = states(c.Name)
		p.classes = append(p.classes, c)
		p.byModel[c.Model] = append(p.byModel[c.Model], c)
	}
	sort.Slice(p.classes, func(i, j int) bool { return p.classes[i].Name < p.classes[j].Name })
	for _, cs := range p.byModel {
		// Most general class first (smallest context guarantee), then name.
		sort.Slice(cs, func(i, j int) bool {
			if gi, gj := cs[i].guarantee(), cs[j].guarantee(); gi != gj {
				return gi < gj
			}
			return cs[i].Name < cs[j].Name
		})
	}
	if err := p.compileEngines(rp); err != nil {
		return nil, err
	}
	for i, c := range p.classes {
		if g := c.guarantee(); g <= 0 || i > 0 && p.maxContext == 0 {
			p.maxContext = 0
		} else {
			p.maxContext = max(p.maxContext, g)
		}
	}
	p.setAdmission(DefaultAdmission()) // a Decider installs its own
	return p, nil
}

// compilePriorities reads the priorities and the default one into p; levels
// maps each level in use to its priority's name.
func (p *Policy) compilePriorities(rp *policyv1.RoutingPolicy) (levels map[uint32]string, err error) {
	levels = map[uint32]string{}
	for i, pr := range rp.GetPriorities() {
		if pr.GetName() == "" {
			return nil, fmt.Errorf("policy: priorities[%d]: empty name", i)
		}
		if err := labelValue(pr.GetName()); err != nil {
			return nil, fmt.Errorf("policy: priorities[%d]: name: %w", i, err)
		}
		if _, dup := p.priorities[pr.GetName()]; dup {
			return nil, fmt.Errorf("policy: priorities[%d]: duplicate name %q", i, pr.GetName())
		}
		if other, dup := levels[pr.GetLevel()]; dup {
			return nil, fmt.Errorf("policy: priorities[%d]: level %d already used by %q", i, pr.GetLevel(), other)
		}
		if pr.GetLevel() > 64 {
			return nil, fmt.Errorf("policy: priorities[%d]: level %d above 64", i, pr.GetLevel())
		}
		p.priorities[pr.GetName()] = pr.GetLevel()
		levels[pr.GetLevel()] = pr.GetName()
		p.maxLevel = max(p.maxLevel, pr.GetLevel())
	}
	p.levelNames = make([]string, p.maxLevel+1)
	for l, n := range levels {
		p.levelNames[l] = n
	}
	p.defaultPriority = rp.GetDefaultPriority()
	switch {
	case p.defaultPriority == "" && len(p.priorities) > 0:
		return nil, fmt.Errorf("policy: default_priority is empty but priorities are defined")
	case p.defaultPriority != "":
		l, ok := p.priorities[p.defaultPriority]
		if !ok {
			return nil, fmt.Errorf("policy: default_priority %q is not a defined priority", p.defaultPriority)
		}
		p.defaultLevel = l
	}
	return levels, nil
}

// compileClass checks and compiles classes[i]; seen holds the names of the
// classes before it, levels the priority levels in use.
func compileClass(i int, cp *policyv1.ClassPolicy, maxLevel uint32, levels map[uint32]string, seen map[string]bool) (*Class, error) {
	c := &Class{
		Name: cp.GetName(), Cluster: cp.GetCluster(), Model: cp.GetModel(), Residency: cp.GetResidency(),
		MinContext: int(cp.GetMinContextTokens()), MaxContext: int(cp.GetMaxContextTokens()),
		RetryFraction: cp.GetRetryBudgetFraction(), MaxRetries: int(cp.GetMaxRetries()),
		InflightLimit: int(cp.GetLocalInflightLimit()), Utilization: cp.GetUtilization(),
		MeanOutputTokens: int(cp.GetMeanOutputTokens()),
		TokenizerSHA256:  cp.GetTokenizerSha256(), TemplateTokens: int(cp.GetChatTemplateTokens()),
	}
	c.clusterHdr, c.classHdr = setHeader(headers.Cluster, c.Cluster), setHeader(headers.Class, c.Name)
	where := fmt.Sprintf("policy: classes[%d] (%q)", i, c.Name)
	switch {
	case c.Name == "":
		return nil, fmt.Errorf("policy: classes[%d]: empty name", i)
	case seen[c.Name]:
		return nil, fmt.Errorf("%s: duplicate class name", where)
	case c.Model == "":
		return nil, fmt.Errorf("%s: empty model", where)
	case c.Cluster == "":
		return nil, fmt.Errorf("%s: empty cluster", where)
	case !fraction(c.RetryFraction):
		return nil, fmt.Errorf("%s: retry_budget_fraction %v outside [0,1]", where, c.RetryFraction)
	case !fraction(c.Utilization) && !(c.Utilization > 1 && !math.IsInf(c.Utilization, 0)):
		return nil, fmt.Errorf("%s: utilization %v is not a number ≥ 0", where, c.Utilization)
	case c.MaxRetries > 10:
		return nil, fmt.Errorf("%s: max_retries %d above 10", where, c.MaxRetries)
	}
	if err := validHeaderValue(c.Cluster); err != nil {
		return nil, fmt.Errorf("%s: cluster: %w", where, err)
	}
	if err := validHeaderValue(c.Name); err != nil {
		return nil, fmt.Errorf("%s: name: %w", where, err)
	}
	if err := labelValue(c.Name); err != nil {
		return nil, fmt.Errorf("%s: name: %w", where, err)
	}
	aff, err := compileAffinity(cp.GetAffinity())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	c.aff = aff
	raw := make([]float64, maxLevel+1)
	for l, f := range cp.GetShedFractionByLevel() {
		if !fraction(f) {
			return nil, fmt.Errorf("%s: shed fraction %v for level %d outside [0,1]", where, f, l)
		}
		if _, ok := levels[l]; !ok {
			return nil, fmt.Errorf("%s: shed fraction for level %d, which no priority has", where, l)
		}
		raw[l] = f
	}
	c.shed = make([]float64, len(raw))
	for l := range raw {
		ok := true
		for lower := l + 1; lower < len(raw); lower++ {
			if _, used := levels[uint32(lower)]; used && raw[lower] < 1 {
				ok = false
				break
			}
		}
		if ok {
			c.shed[l] = raw[l]
		}
	}
	return c, nil
}

// compileEngines reads the engines' address → id map into p.
func (p *Policy) compileEngines(rp *policyv1.RoutingPolicy) error {
	for i, e := range rp.GetEngines() {
		if e.GetAddress() == "" {
			return fmt.Errorf("policy: engines[%d] (%q): empty address", i, e.GetId())
		}
		// One address is one engine (the fleet spec refuses duplicates):
		// evidence is keyed by the upstream address, so a second entry
		// would have it reported against whichever id came last.
		if err := labelValue(e.GetId()); err != nil {
			return fmt.Errorf("policy: engines[%d]: id: %w", i, err)
		}
		if other, dup := p.engines[e.GetAddress()]; dup {
			return fmt.Errorf("policy: engines[%d] (%q): address %q already belongs to %q", i, e.GetId(), e.GetAddress(), other)
		}
		p.engines[e.GetAddress()] = e.GetId()
		p.regions[e.GetAddress()] = e.GetRegion()
	}
	return nil
}

func fraction(f float64) bool { return f >= 0 && f <= 1 }

// labelValue rejects what Prometheus refuses as a label value: the version,
// class, priority and engine names become metric labels, and WithLabelValues
// panics on invalid UTF-8 (protobuf's decoder already refuses it on the
// wire, but SetPolicy takes Go values too).
func labelValue(s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%q is not valid UTF-8", s)
	}
	return nil
}

// validHeaderValue rejects what Envoy would refuse in a header value.
func validHeaderValue(s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("control character at byte %d of %q", i, s)
		}
	}
	if strings.TrimSpace(s) != s {
		return fmt.Errorf("leading or trailing space in %q", s)
	}
	return nil
}

// guarantee is the longest request (prompt + output tokens) every engine of
// the class accepts: the policy's max_context_tokens, which the control
// plane sets to the smallest context limit among the class's engines. A
// policy without it falls back to min_context_tokens (what the class asks of
// its engines); 0 means unknown and covers anything.
func (c *Class) guarantee() int {
	if c.MaxContext > 0 {
		return c.MaxContext
	}
	return c.MinContext
}

// Route picks the class for a model, residency and token need.
//
// Rule: among the classes serving the model whose residency equals the
// request's (a request without a residency header may use any class, and
// prefers classes without one), take the first, in order of increasing
// context guarantee, whose guarantee covers need (prompt tokens plus
// max_tokens; a guarantee of 0 covers anything); if none covers it, the one
// with the largest guarantee (the engine then judges the request). A class
// whose engines include one with a short context limit never gets a request
// longer than that limit while a class that covers it exists.
func (p *Policy) Route(model, residency string, need int) (*Class, routeErr) {
	cs := p.byModel[model]
	if len(cs) == 0 {
		return nil, errUnknownModel
	}
	var best *Class
	for pass := 0; pass < 2 && best == nil; pass++ {
		var last *Class
		for _, c := range cs {
			switch {
			case residency != "" && c.Residency != residency:
				continue
			case residency == "" && pass == 0 && c.Residency != "":
				continue
			}
			if g := c.guarantee(); g == 0 || g >= need {
				best = c
				break
			}
			last = c
		}
		if best == nil {
			best = last
		}
		if residency != "" {
			break
		}
	}
	if best == nil {
		return nil, errResidency
	}
	return best, 0
}

// smallerGuarantee is the largest context guarantee below c's among the
// classes Route could have chosen instead of c for this model and
// residency (0: none).
func (p *Policy) smallerGuarantee(model, residency string, c *Class) int {
	best := 0
	for _, o := range p.byModel[model] {
		switch {
		case residency != "" && o.Residency != residency:
			continue
		case residency == "" && c.Residency == "" && o.Residency != "":
			continue
		}
		if g := o.guarantee(); g > 0 && g < c.guarantee() && g > best {
			best = g
		}
	}
	return best
}

type routeErr uint8

const (
	errUnknownModel routeErr = iota + 1
	errResidency
)
