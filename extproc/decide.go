package extproc

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferlb/inferlb/api/headers"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/internal/tokens/hf"
)

// Decider is ext_proc's per-request decision logic without the gRPC
// protocol: the policy in force, the per-class runtime state (in-flight
// counts, retry budgets), the keys for requests with nothing to hash, and
// the Observer whose Flush becomes the Reports sent to the control plane.
//
// The gRPC Server drives one Decider; the fleet simulator (tools/fleetsim)
// drives one per simulated frontend, so both run the same decisions. A
// request's life is Decide, then (if admitted) Responded or Failed for what
// the upstream did, and Release once it is over.
type Decider struct {
	obs    *Observer
	policy atomic.Pointer[Policy]

	statesMu sync.Mutex // guards states and serializes SetPolicy
	states   map[string]*classState

	anon atomic.Uint64 // keys for requests with nothing to hash

	// tokenizers are the models' tokenizers by SHA-256 (SetTokenizers),
	// matched to classes when a policy is installed; guarded by statesMu.
	tokenizers map[string]*hf.Tokenizer
	// adm is given to each policy installed (SetAdmission); guarded by
	// statesMu.
	adm Admission

	clients atomic.Pointer[ClientPriorities] // nil: any client may ask for any priority

	maxMessages atomic.Int64 // body.Limits.MaxMessages (SetMaxMessages)

	// placer is the placement in force (nil: off); placeMu guards the
	// switches it follows.
	placer                     atomic.Pointer[placer]
	placeMu                    sync.Mutex
	prefillOn, idleOn, cacheOn bool
}

// SetCachePlacement turns cache-aware placement on or off (cacheplace.go):
// each request goes to the engine of its plan where its first token is
// predicted soonest, its cached prefix there counted, within each
// engine's budget of the plan's shares; a conversation stays where its
// history is. On, it supersedes prefill-aware and idle placement.
func (d *Decider) SetCachePlacement(on bool) {
	d.placeMu.Lock()
	defer d.placeMu.Unlock()
	d.cacheOn = on
	d.switchPlacer()
}

// SetPrefillPlacement turns prefill-aware placement on or off (placement.go):
// a request whose first token is predicted sooner elsewhere in its home
// engine's region, by more than PlacementSlack, is routed there by its key.
// On, it supersedes idle placement.
func (d *Decider) SetPrefillPlacement(on bool) {
	d.placeMu.Lock()
	defer d.placeMu.Unlock()
	d.prefillOn = on
	d.switchPlacer()
}

// SetIdlePlacement turns idle-engine placement on or off (placement.go):
// a request moves, by its key, to an engine of its home engine's region
// with none of this service's requests in flight, or a faster one with
// fewer and none of its prefills, where its first token is predicted sooner
// by more than PlacementSlack.
func (d *Decider) SetIdlePlacement(on bool) {
	d.placeMu.Lock()
	defer d.placeMu.Unlock()
	d.idleOn = on
	d.switchPlacer()
}

// switchPlacer puts the placer the switches ask for in force, keeping the
// one in force when it is already of that kind. Requests placed by a
// replaced placer end on it (Held keeps it). Callers hold placeMu.
func (d *Decider) switchPlacer() {
	cur := d.placer.Load()
	switch {
	case d.cacheOn:
		if cur == nil || !cur.cacheAware {
			pl := newPlacer()
			pl.cacheAware = true
			d.placer.Store(pl)
		}
	case d.prefillOn:
		if cur == nil || cur.idleOnly || cur.cacheAware {
			d.placer.Store(newPlacer())
		}
	case d.idleOn:
		if cur == nil || !cur.idleOnly || cur.cacheAware {
			pl := newPlacer()
			pl.idleOnly = true
			d.placer.Store(pl)
		}
	default:
		d.placer.Store(nil)
	}
}

// DefaultMaxMessages bounds a chat request's messages: far above any real
// conversation, and a hostile body of many tiny messages stops there.
const DefaultMaxMessages = 16384

// SetMaxMessages bounds the messages of a chat request (0: no bound but
// the context's); more get 400 too_many_messages as soon as the parser
// reaches one too many.
func (d *Decider) SetMaxMessages(n int) { d.maxMessages.Store(int64(max(n, 0))) }

// SetClientPriorities installs which priorities each client may use (nil:
// no restriction).
func (d *Decider) SetClientPriorities(c *ClientPriorities) { d.clients.Store(c) }

// ClientHeader is the header naming the client ("" without client
// priorities).
func (d *Decider) ClientHeader() string {
	if c := d.clients.Load(); c != nil {
		return c.Header
	}
	return ""
}

// SetTokenizers gives the tokenizers (by SHA-256) that policies' classes
// name; it applies from the next SetPolicy.
func (d *Decider) SetTokenizers(m map[string]*hf.Tokenizer) {
	d.statesMu.Lock()
	defer d.statesMu.Unlock()
	d.tokenizers = m
}

// NewDecider returns a Decider without a policy; its Observer's first
// interval starts at now.
func NewDecider(now time.Time) *Decider {
	d := &Decider{obs: NewObserver(now), states: map[string]*classState{}, adm: DefaultAdmission()}
	d.maxMessages.Store(DefaultMaxMessages)
	return d
}

// fresh is a new key for a request with nothing to key on (or with
// affinity off): distinct per request, spread over the whole range.
func (d *Decider) fresh() uint64 { return mix(d.anon.Add(1)) }

// Observer returns the demand and evidence accumulator.
func (d *Decider) Observer() *Observer { return d.obs }

// Policy returns the policy in force (nil before the first).
func (d *Decider) Policy() *Policy { return d.policy.Load() }

// SetPolicy compiles and installs a RoutingPolicy; it returns the policy
// installed and the one it replaced. On error the old policy stays in force.
func (d *Decider) SetPolicy(rp *policyv1.RoutingPolicy) (installed, old *Policy, err error) {
	d.statesMu.Lock()
	defer d.statesMu.Unlock()
	p, err := Compile(rp, func(name string) *classState {
		st := d.states[name]
		if st == nil {
			st = &classState{tokens: d.adm.RetryBurst} // a full budget
			d.states[name] = st
		}
		return st
	})
	if err != nil {
		return nil, nil, err
	}
	p.setAdmission(d.adm)
	for _, c := range p.classes {
		if c.TokenizerSHA256 != "" {
			c.tokenizer = d.tokenizers[c.TokenizerSHA256]
		}
	}
	return p, d.policy.Swap(p), nil
}

// Input is what the decision reads from one request: the API it is for,
// the trusted request headers that matter, and the buffered body.
type Input struct {
	Kind body.Kind
	// Session, Priority and Residency are the values of the headers
	// headers.SessionID, headers.Priority and headers.Residency ("" when
	// absent).
	Session, Priority, Residency string
	// Client is the value of the client-identity header (ClientHeader),
	// set by an authentication layer; "" when absent.
	Client string
	// Body is the request body (JSON).
	Body []byte
	// Now is the decision's time (zero: the clock's), which prefill-aware
	// placement predicts from.
	Now time.Time
}

// Outcome is the admission verdict.
type Outcome uint8

// Admission outcomes.
const (
	Admitted   Outcome = Outcome(admitted)
	ShedPolicy Outcome = Outcome(shedPolicy)
	ShedLocal  Outcome = Outcome(shedLocal)
)

func (o Outcome) String() string { return shedReason(o).String() }

// Decision is one request's outcome. Fields are valid after Decide returned
// no Rejection.
type Decision struct {
	// Body is what the decision read from the body.
	Body body.Request
	// Held is what the request holds until it ends (the policy, the
	// class, its retries).
	Held
	// Priority is the priority's name and Level its level.
	Priority string
	Level    uint32
	// KeyHash is the cache-affinity key the route hashes on (as the header
	// value hex16(KeyHash)); KeySource says where it came from ("session",
	// "prompt_cache_key", "user", "prefix", or "" for a per-request key);
	// Key is the whole derivation (affinity.go): the prefix walk's kind,
	// the conversation's key shedding used, affinity off.
	KeyHash   uint64
	KeySource string
	Key       KeyDecision
	// AffinityKey is the key the affinity rules derived; KeyHash differs
	// from it when prefill-aware placement routed the request elsewhere
	// (placement.go).
	AffinityKey uint64
	// Outcome is admitted or a shed verdict (then the request is answered
	// 429 and nothing else applies).
	Outcome Outcome
	// Bound says how the request's context need was bounded to pick the
	// class ("short", "bytes" or "tokenizer"; see routeByContext).
	Bound string
}

// Held is the part of a decision an admitted request holds until it
// ends: its in-flight slot, its retry allowance and what it charged, and
// the tokens it costs in reports. The request table keeps it, not the
// whole Decision, for every request in flight until Envoy's request log
// reports its end: a Decision carries the body's prefix chain (1.2 KB),
// which nothing after the decision reads, and kept whole the table held
// 120 MB after 80,000 decisions whose log never came (the protocol
// benchmark plays no log).
type Held struct {
	// Policy is the policy the decision was made under; Class the class
	// (Envoy cluster) chosen.
	Policy *Policy
	Class  *Class
	// Retries is how many retries the request may use (Envoy's
	// x-envoy-max-retries): an allowance from the class's budget, which is
	// charged for the retries the request uses (ChargeRetry, Responded).
	Retries int

	held           bool // counted in flight: Release must undo it
	charged        int  // retries charged to the budget
	prompt, output int  // the request's cost in reports (Class.cost)
	// placer placed the request, counting it in flight at placed until
	// Release (nil: no placement).
	placer *placer
	placed string
}

// AffinityHeader is the value of the affinity-key header for the decision.
func (dc *Decision) AffinityHeader() string { return hex16(dc.KeyHash) }

// UnplacedHeader is what AffinityHeader would be without prefill-aware
// placement: the affinity rules' key.
func (dc *Decision) UnplacedHeader() string { return hex16(dc.AffinityKey) }

// Rejection is a request answered with an error before routing (unknown
// model, invalid body, no policy, or a shed verdict): an HTTP status, an
// OpenAI-format error and a reason label.
type Rejection struct{ e *apiError }

// Status is the HTTP status.
func (r *Rejection) Status() int { return r.e.status }

// Reason is the metric label of the rejection (e.g. "unknown_model",
// "shed_policy").
func (r *Rejection) Reason() string { return r.e.reason }

// Shed reports whether the request was refused by admission (the policy's
// shed fraction or the local in-flight limit); the Decision's Class,
// Priority and Outcome are then set.
func (r *Rejection) Shed() bool {
	return r.e.reason == shedPolicy.String() || r.e.reason == shedLocal.String()
}

func (r *Rejection) Error() string {
	return fmt.Sprintf("%d %s: %s", r.e.status, r.e.reason, r.e.message)
}

var errNoPolicy = &apiError{status: 503, typ: "service_unavailable", code: "no_routing_decision",
	message: "The load balancer cannot route requests right now (no routing decision available); retry shortly.", retryAfter: 1, reason: "no_policy"}

// Decide makes the request's decision under the policy in force: it parses
// the body, picks the priority and the class, derives the affinity key,
// decides admission, records the request's demand in the Observer (shed
// ones too) and grants its retries. A request that is not admitted, or that
// is invalid, gets a Rejection. An admitted request holds an in-flight slot
// of its class until Release; Release it before reusing dc.
func (d *Decider) Decide(in Input, dc *Decision) *Rejection {
	if e := d.decide(in, dc); e != nil {
		return &Rejection{e}
	}
	return nil
}

// limitRejection is the answer to a body proved over one of the parser's
// limits.
func limitRejection(le *body.LimitError) *apiError {
	if le.Context {
		return badRequest("context_length_exceeded", le.Field, fmt.Sprintf(
			"This request's %s has more than %d elements of at least one token each: it exceeds the largest context served here, %d tokens.", le.Field, le.Limit, le.Limit))
	}
	return badRequest("too_many_messages", le.Field, fmt.Sprintf("Too many messages: at most %d are accepted.", le.Limit))
}

// limits are the parser's limits under policy p: the same for a whole
// body (decide) and for a streamed body's prefix (provedOver), so that a
// prefix is refused only with the answer the whole body would get.
func (d *Decider) limits(p *Policy) body.Limits {
	return body.Limits{MaxMessages: int(d.maxMessages.Load()), MaxContext: p.maxContext}
}

// provedOver returns the answer a body's first bytes already prove: a
// prefix of a body with more messages (or completion token ids) than a
// limit allows is over it whatever follows, and the parser, reading in
// order, would stop the whole body at the same element with the same
// answer. It returns nil when the prefix proves nothing (the rest may
// still be malformed or over a limit).
func (d *Decider) provedOver(prefix []byte, kind body.Kind) *apiError {
	p := d.policy.Load()
	if p == nil {
		return nil
	}
	lim := d.limits(p)
	if lim.MaxMessages <= 0 && lim.MaxContext <= 0 {
		return nil
	}
	var r body.Request
	var le *body.LimitError
	if err := body.ParseWithin(prefix, kind, lim, &r); errors.As(err, &le) {
		return limitRejection(le)
	}
	return nil
}

func (d *Decider) decide(in Input, dc *Decision) *apiError {
	*dc = Decision{}
	p := d.policy.Load()
	if p == nil {
		return errNoPolicy
	}
	if err := body.ParseWithin(in.Body, in.Kind, d.limits(p), &dc.Body); err != nil {
		var fe *body.FieldError
		if errors.As(err, &fe) {
			return badRequest("invalid_field", fe.Field, "Invalid request: "+err.Error()+".")
		}
		var le *body.LimitError
		if errors.As(err, &le) {
			return limitRejection(le)
		}
		return badRequest("invalid_json", "", "We could not parse the JSON body of your request: "+err.Error()+".")
	}
	br := &dc.Body
	level, prio := p.defaultLevel, p.defaultPriority
	if in.Priority != "" {
		l, ok := p.priorities[in.Priority]
		if !ok {
			return badRequest("invalid_priority", headers.Priority,
				fmt.Sprintf("Unknown priority %q in header %s; known: %s.", in.Priority, headers.Priority, strings.Join(p.priorityNames(), ", ")))
		}
		level, prio = l, in.Priority
	}
	if cp := d.clients.Load(); cp != nil {
		var e *apiError
		if level, prio, e = cp.priorityFor(p, in.Client, in.Priority, level, prio); e != nil {
			return e
		}
	}
	c, bound, rerr := p.routeByContext(br.Model, in.Residency, in.Body, in.Kind, br)
	dc.Bound = bound
	switch rerr {
	case errUnknownModel:
		return &apiError{status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model",
			message: fmt.Sprintf("The model %q does not exist or is not served here.", br.Model), reason: "unknown_model"}
	case errResidency:
		return &apiError{status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model",
			message: fmt.Sprintf("The model %q is not served in data-residency zone %q (header %s).", br.Model, in.Residency, headers.Residency), reason: "residency"}
	}
	kd := c.aff.key(in.Session, br, d.fresh)
	keyHash := kd.Key
	if keyHash == 0 {
		keyHash = d.fresh()
	}
	// Shedding keeps a conversation whole: it uses the conversation's key
	// (with affinity off too), not a spread slot or a fresh key.
	shedKey := kd.Conversation
	if shedKey == 0 {
		shedKey = keyHash
	}
	outcome := p.admit(c, level, shedKey)
	prompt, output := c.cost(br)
	d.obs.Demand(c.Name, prio, outcome != admitted, prompt, output)
	d.obs.Prefixes(c.Name, &br.Chain, &kd, prompt+output, d.fresh())
	dc.Policy, dc.Class, dc.Priority, dc.Level = p, c, prio, level
	src := kd.Source
	if kd.Off {
		src = "" // a fresh key per request
	}
	dc.KeyHash, dc.KeySource, dc.Key, dc.Outcome, dc.AffinityKey = keyHash, src, kd, Outcome(outcome), keyHash
	if outcome != admitted {
		msg := fmt.Sprintf("The %s service is overloaded; requests of priority %q are being shed. Retry after the indicated delay.", c.Name, prio)
		if outcome == shedLocal {
			msg = fmt.Sprintf("Too many requests in flight for %s at this frontend; retry after the indicated delay.", c.Name)
		}
		return &apiError{status: 429, typ: "rate_limit_exceeded", code: "overloaded", message: msg,
			retryAfter: 1, reason: outcome.String()}
	}
	dc.held = true
	dc.Retries = c.grantRetries()
	dc.prompt, dc.output = prompt, output
	if pl := d.placer.Load(); pl != nil {
		now := in.Now
		if now.IsZero() {
			now = time.Now()
		}
		// A class with affinity off gets no prefix matching either: its
		// requests go where they are soonest with nothing counted cached.
		chain := &br.Chain
		if kd.Off {
			chain = nil
		}
		dc.KeyHash, dc.placed = pl.place(p, c.Name, keyHash, chain, prompt, sharedTokens(&kd, br), !kd.Off && kd.Key != 0, now)
		if dc.placed != "" {
			dc.placer = pl
		}
	}
	return nil
}

// Release ends an admitted request: its in-flight slot is freed. Calling it
// again, or for a request that was not admitted, does nothing.
func (d *Decider) Release(dc *Held) {
	if dc.held {
		dc.held = false
		dc.Class.release()
		if dc.placer != nil {
			dc.placer.done(dc.placed)
			dc.placer = nil
		}
	}
}

// Responded records the final response of an admitted request: upstream is
// the address of the engine that served it ("" if none), code the HTTP
// status, attempts the number of upstream attempts Envoy made (0 when
// unknown), latency the time to response headers. A response below 500
// from a known upstream is evidence for that engine; the retries the
// request used and were not charged yet are charged to the budget.
func (d *Decider) Responded(dc *Held, upstream string, code, attempts int, latency time.Duration) {
	if upstream != "" && code < 500 {
		d.obs.Response(upstream, dc.Policy.EngineID(upstream), false, latency)
	}
	for dc.charged < attempts-1 && d.ChargeRetry(dc) {
	}
}

// ChargeRetry charges one retry the request uses (a failed attempt that
// Envoy retries) to its class's budget, if the request had one left; it
// reports whether it did.
func (d *Decider) ChargeRetry(dc *Held) bool {
	if dc.Class == nil || dc.charged >= dc.Retries {
		return false
	}
	dc.charged++
	dc.Class.chargeRetry()
	return true
}

// Finished records how an admitted request ended, from Envoy's request
// log: the engine that served it last, the HTTP status, and (timed) its
// upstream time to response headers and to the last byte, which with the
// tokens the request asked for is latency evidence for the engine. An
// answer below 500 counts as the engine's response; failures are counted
// per attempt by Failed.
func (d *Decider) Finished(dc *Held, upstream string, code int, header, total time.Duration, timed bool) {
	if upstream == "" || code == 0 || code >= 500 {
		return
	}
	id := dc.Policy.EngineID(upstream)
	if !timed {
		d.obs.Answered(upstream, id)
		return
	}
	d.obs.Completed(upstream, id, header, total, dc.prompt, dc.output)
}

// cost is the prompt and output tokens a request of the class costs in
// reports: its prompt, and the output it asks for, else the class's typical
// length; each at most the class's context limit (a request beyond it is
// refused by the engine, and a client's max_tokens of a billion would make
// the control plane refuse the whole report: it bounds a request's tokens
// by the fleet's largest context).
func (c *Class) cost(br *body.Request) (prompt, output int) {
	prompt, output = max(br.PromptTokens, 0), br.MaxTokens
	if output < 0 {
		output = max(c.MeanOutputTokens, 0)
	}
	if c.MaxContext > 0 {
		prompt, output = min(prompt, c.MaxContext), min(output, c.MaxContext)
	}
	return prompt, output
}

// Failed records one failed upstream attempt at addr (Envoy's upstream log:
// a 5xx, a reset, a connect failure or a timeout), retried or not, and
// returns the engine's id ("" if the policy does not know the address).
func (d *Decider) Failed(addr string) (engineID string) {
	if p := d.policy.Load(); p != nil {
		engineID = p.EngineID(addr)
	}
	d.obs.Failure(addr, engineID)
	return engineID
}

// sharedTokens is the prefix of the request's prompt that placement
// credits to its home engine as cached (placer.place's shared): a group or
// spread key's prefix, and the request's deepest hot prefix whatever its
// key. A hot point is one the split table learned that many conversations
// pass through; the table keys them deeper (or spreads them), so the
// engines the class's table sends them to hold it. Without the credit a
// request opening with a long hot preamble looks slower at a slow home
// than at an idle fast engine, which has to prefill the preamble too, so
// idle placement would move such requests and unbalance the engines
// (the measurements are in docs/decisions/idle-placement-on.md).
func sharedTokens(kd *KeyDecision, br *body.Request) int {
	n := 0
	if (kd.Kind == "group" || kd.Kind == "spread") && kd.Point >= 0 {
		n = int(br.Chain.Points[kd.Point].Tokens)
	}
	if kd.Hot >= 0 {
		n = max(n, int(br.Chain.Points[kd.Hot].Tokens))
	}
	return n
}
