package signals

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// IntakeOptions configure an Intake.
type IntakeOptions struct {
	// Window is how far back reports count: rates are totals over the
	// window divided by its length.
	Window time.Duration
	// Nodes, Classes and Priorities are the names reports may use; a report
	// naming others is rejected with a precise error.
	Nodes, Classes, Priorities []string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxIntervals bounds the reports kept per (node, instance); 0 means
	// 600.
	MaxIntervals int

	// Plausibility bounds (see Report). A report outside them is refused
	// with a *Rejection naming the bound.

	// MaxRequestsPerS is, per node, the most requests/s its frontend can
	// carry: a report's requests over its interval (at least a second)
	// beyond it are clipped to it (and counted), beyond AbsurdRate times it
	// refused, and Snapshot caps each instance's and each node's demand at
	// it. A node without a bound has none.
	MaxRequestsPerS map[string]float64
	// CapacityBound marks the nodes whose MaxRequestsPerS is derived from
	// the fleet's capacity (the spec sets none): their bound is raised to
	// CapacityBoundFactor times the capacity measured (SetMeasuredRPS), so
	// that a fleet serving more than its profiles say is not clipped.
	CapacityBound map[string]bool
	// Engines maps each engine's address to its id. A report's evidence
	// for an address not in it is dropped (counted as unknown_engine); one
	// whose engine_id names another engine than its address refuses the
	// report (engine_mismatch). nil: no check.
	Engines map[string]string
	// OnAdjust, if set, is called for every part of an accepted report
	// that was clipped or dropped ("rate_clipped", "unknown_engine").
	OnAdjust func(reason string)
	// MaxInflight is, per node, the most requests one instance can have in
	// flight (its classes' local in-flight limits): the evidence a report
	// may carry beyond its own requests. 0: 1000.
	MaxInflight map[string]float64
	// MaxAttempts is the most upstream attempts one request makes (1 + the
	// most retries); 0 means 3.
	MaxAttempts float64
	// MaxTokensPerRequest bounds a request's prompt and output tokens (the
	// largest context of the fleet); 0: no bound.
	MaxTokensPerRequest float64
	// MaxClockSkew is how far interval_end may be from this clock; 0 means
	// 10 s. MaxInterval is the longest interval a report may cover (ext_proc
	// merges unsent reports for up to 30 s); 0 means 60 s.
	MaxClockSkew, MaxInterval time.Duration
	// Prefix configures the prefix view (prefixes.go).
	Prefix PrefixOptions
}

// Rejection is why a report was refused: Reason is a short label (for the
// metric), Err the precise message.
type Rejection struct {
	Reason string
	Err    error
}

func (r *Rejection) Error() string { return r.Err.Error() }
func (r *Rejection) Unwrap() error { return r.Err }

// MergeBacklog is how long ext_proc keeps unsent reports to merge into the
// next (cpclient.Reporter's MaxBacklog default): a report may arrive that
// late.
const MergeBacklog = 30 * time.Second

// AbsurdRate: a report claiming more than this many times its node's
// MaxRequestsPerS is not a burst the bound clips but a forgery or a bug,
// and is refused whole.
const AbsurdRate = 10

// CapacityBoundFactor is a capacity-derived bound's multiple of the
// capacity measured (the same as the default's of the profiles').
const CapacityBoundFactor = 2

// RejectReason is the metric label.
func (r *Rejection) RejectReason() string { return r.Reason }

func reject(reason string, format string, args ...any) *Rejection {
	return &Rejection{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// DemandKey names one demand stream.
type DemandKey struct {
	Node, Class, Priority string
}

// Compare orders keys by node, class and priority.
func (k DemandKey) Compare(o DemandKey) int {
	return cmp.Or(strings.Compare(k.Node, o.Node), strings.Compare(k.Class, o.Class), strings.Compare(k.Priority, o.Priority))
}

// DemandKeys are m's keys in order: sums over a demand map walk it so,
// since map order varies from run to run and float addition is not
// associative (replicas must agree bit for bit).
func DemandKeys[V any](m map[DemandKey]V) []DemandKey {
	return slices.SortedFunc(maps.Keys(m), DemandKey.Compare)
}

// DemandRate is a demand stream's rates over the window.
type DemandRate struct {
	RequestsPerS float64 `json:"requests_per_s"`
	ShedPerS     float64 `json:"shed_per_s"`
	// Mean tokens per request (0 if no requests).
	PromptTokens float64 `json:"prompt_tokens"`
	OutputTokens float64 `json:"output_tokens"`
}

// Evidence is per-engine response evidence over the window.
type Evidence struct {
	Responses        float64 `json:"responses"`
	Errors           float64 `json:"errors"`
	HeaderLatencyMs  float64 `json:"header_latency_ms"` // mean, 0 if none
	HeaderLatencyCnt float64 `json:"header_latency_count"`
	// Completed requests (served to the end) with their summed upstream
	// time and the tokens they asked for; CompletedByNode splits Completed
	// by reporting frontend (each adds its round trip to the engine).
	Completed              float64            `json:"completed"`
	CompletionSeconds      float64            `json:"completion_seconds"`
	CompletionPromptTokens float64            `json:"completion_prompt_tokens"`
	CompletionOutputTokens float64            `json:"completion_output_tokens"`
	CompletedByNode        map[string]float64 `json:"completed_by_node,omitempty"`
}

// ErrorRate is Errors/Responses, 0 without responses.
func (e Evidence) ErrorRate() float64 {
	if e.Responses <= 0 {
		return 0
	}
	return math.Min(1, e.Errors/e.Responses)
}

type report struct {
	start, end time.Time
	received   time.Time
	req        *policyv1.ReportRequest
}

// Intake collects Reports. Safe for concurrent use.
type Intake struct {
	// Set by NewIntake, then read-only (but for the bounds, below).
	opt                        IntakeOptions
	nodes, classes, priorities map[string]bool
	prefixes                   *Prefixes // safe for concurrent use itself

	// bounds are opt's MaxRequestsPerS, MaxInflight and
	// MaxTokensPerRequest, which follow the fleet's capacity (SetBounds).
	bounds atomic.Pointer[intakeBounds]

	// mu guards the fields below.
	mu                 sync.Mutex
	byInstance         map[[2]string][]report // (node, instance) → reports in arrival order
	credit             map[[2]string]float64  // (node, instance) → responses it may still report
	lastReport         map[string]time.Time   // node → last report
	accepted, rejected uint64
	lastRejection      string
	lastRejectionAt    time.Time
	// measuredRPS is the fleet's measured serving rate (SetMeasuredRPS).
	measuredRPS float64
}

// NewIntake returns an Intake. The window must be positive: rates divide by
// it.
func NewIntake(opt IntakeOptions) (*Intake, error) {
	if opt.Window <= 0 {
		return nil, fmt.Errorf("intake: window must be positive, got %v", opt.Window)
	}
	if opt.MaxIntervals < 0 {
		return nil, fmt.Errorf("intake: max intervals must be ≥ 0 (0: 600), got %d", opt.MaxIntervals)
	}
	set := func(xs []string) map[string]bool {
		m := map[string]bool{}
		for _, x := range xs {
			m[x] = true
		}
		return m
	}
	if opt.MaxIntervals == 0 {
		opt.MaxIntervals = 600
	}
	if opt.MaxAttempts == 0 {
		opt.MaxAttempts = 3
	}
	if opt.MaxClockSkew == 0 {
		opt.MaxClockSkew = 10 * time.Second
	}
	if opt.MaxInterval == 0 {
		opt.MaxInterval = time.Minute
	}
	if opt.MaxAttempts < 1 || opt.MaxClockSkew < 0 || opt.MaxInterval < 0 || opt.MaxTokensPerRequest < 0 {
		return nil, fmt.Errorf("intake: max attempts %v (≥ 1), clock skew %v, interval %v and tokens per request %v (≥ 0) out of range",
			opt.MaxAttempts, opt.MaxClockSkew, opt.MaxInterval, opt.MaxTokensPerRequest)
	}
	in := &Intake{opt: opt, nodes: set(opt.Nodes), classes: set(opt.Classes), priorities: set(opt.Priorities),
		byInstance: map[[2]string][]report{}, credit: map[[2]string]float64{}, lastReport: map[string]time.Time{}}
	in.SetBounds(opt)
	var err error
	if in.prefixes, err = NewPrefixes(opt.Prefix); err != nil {
		return nil, fmt.Errorf("intake: %w", err)
	}
	return in, nil
}

type intakeBounds struct {
	maxRPS, maxInflight map[string]float64
	maxTokens           float64
	capacityBound       map[string]bool
	engines             map[string]string
}

// SetBounds replaces the plausibility bounds that follow the fleet's
// engines (MaxRequestsPerS, CapacityBound, MaxInflight,
// MaxTokensPerRequest and Engines of o; the rest of o is ignored): engines join and leave with Kubernetes discovery,
// and a frontend's default bound is twice the fleet's capacity. Reports
// already accepted stay. Safe for concurrent use.
func (in *Intake) SetBounds(o IntakeOptions) {
	in.bounds.Store(&intakeBounds{maxRPS: maps.Clone(o.MaxRequestsPerS), maxInflight: maps.Clone(o.MaxInflight),
		maxTokens: max(o.MaxTokensPerRequest, 0), capacityBound: maps.Clone(o.CapacityBound), engines: maps.Clone(o.Engines)})
}

func (in *Intake) b() *intakeBounds { return in.bounds.Load() }

func (in *Intake) now() time.Time {
	if in.opt.Now != nil {
		return in.opt.Now()
	}
	return time.Now()
}

// Report validates and stores one report (the Reports service calls it).
//
// Besides well-formedness (known node, class and priority; shed ≤ requests;
// errors ≤ responses), a report must be plausible, or it is refused whole
// with a *Rejection:
//
//   - clock: interval_end within MaxClockSkew of this clock, the interval at
//     most MaxInterval long;
//   - rate: its requests over its interval (at least one second) within
//     AbsurdRate times the node's MaxRequestsPerS; between the bound and
//     that, its demand is clipped to the bound (and counted, OnAdjust):
//     an overload's genuine burst is not refused, which would leave the
//     planner blind to the very demand it must shed;
//   - tokens: prompt and output tokens within MaxTokensPerRequest per
//     request;
//   - engines: an engine_id that is not its address's engine refuses the
//     report; evidence for an address that is no engine of the fleet is
//     dropped (and counted);
//   - evidence: responses within what the instance's requests can produce.
//     Every admitted request makes at most MaxAttempts upstream attempts, and
//     may end in a later interval than it arrived in, so an instance has a
//     credit of responses: MaxAttempts × its admitted requests, plus
//     MaxAttempts × MaxInflight for the requests in flight when it started
//     (and at most that much carried over). Responses beyond the credit are
//     not from requests the instance saw.
//
// A report is counted once however often it arrives. An instance that got
// no answer resends its report merged with the next interval's (the same
// interval_start, a later end; cpclient.Reporter), yet the first may have
// arrived: a report with the interval_start of one already accepted from
// the instance replaces it if it ends later (it holds all of it), and is
// ignored otherwise (it is a late copy of what the other holds).
func (in *Intake) Report(_ context.Context, r *policyv1.ReportRequest) error {
	now := in.now()
	r, adjusted, err := in.validate(r, now)
	if err == nil && in.opt.OnAdjust != nil {
		for _, a := range adjusted {
			in.opt.OnAdjust(a)
		}
	}
	k := [2]string{r.NodeId, r.Instance}
	in.mu.Lock()
	defer in.mu.Unlock()
	prev := -1
	if err == nil {
		prev = in.sameStart(k, r)
		switch {
		case prev < 0:
			err = in.spend(k, r)
		case !r.IntervalEnd.AsTime().After(in.byInstance[k][prev].req.IntervalEnd.AsTime()):
			// A late copy: what it says is counted, if it is a copy (it
			// holds no more than the report that extends it).
			ha, hr := totals(in.byInstance[k][prev].req)
			if a, rs := totals(r); a > ha || rs > hr {
				err = reject("evidence", "report from %s/%s: %.0f admitted requests and %.0f engine responses since %s, more than the %.0f and %.0f of the report it resends",
					k[0], k[1], a, rs, r.IntervalStart.AsTime().Format(time.RFC3339Nano), ha, hr)
				break
			}
			in.accepted++
			return nil
		default:
			// It extends the report: that one's credit back, then this one's.
			a, rs := totals(in.byInstance[k][prev].req)
			in.credit[k] += rs - in.opt.MaxAttempts*a
			err = in.spend(k, r)
		}
	}
	if err != nil {
		in.rejected++
		in.lastRejection, in.lastRejectionAt = err.Error(), now
		return err
	}
	// Trust our own clock for the window: an instance's clock may be off.
	// The interval's length is kept; its end is the receive time.
	d := r.IntervalEnd.AsTime().Sub(r.IntervalStart.AsTime())
	rep := report{received: now, req: r, start: now.Add(-d), end: now}
	in.accepted++
	in.lastReport[r.NodeId] = now
	if prev >= 0 {
		old := in.byInstance[k][prev].req
		in.byInstance[k] = append(slices.Delete(in.byInstance[k], prev, prev+1), rep)
		in.prefixes.Add(now, &policyv1.ReportRequest{Prefixes: prefixesBeyond(r.Prefixes, old.Prefixes)})
		return nil
	}
	reps := append(in.byInstance[k], rep)
	if len(reps) > in.opt.MaxIntervals {
		reps = reps[len(reps)-in.opt.MaxIntervals:]
	}
	in.byInstance[k] = reps
	in.prefixes.Add(now, r)
	return nil
}

// sameStart is the index of the instance's accepted report with r's
// interval_start, -1 if none; in.mu must be held.
func (in *Intake) sameStart(k [2]string, r *policyv1.ReportRequest) int {
	s := r.IntervalStart.AsTime()
	for i, rp := range in.byInstance[k] {
		if rp.req.IntervalStart.AsTime().Equal(s) {
			return i
		}
	}
	return -1
}

// totals are a report's admitted requests and engine responses.
func totals(r *policyv1.ReportRequest) (admitted, responses float64) {
	for _, d := range r.Demand {
		admitted += float64(d.Requests - d.Shed)
	}
	for _, e := range r.Engines {
		responses += float64(e.Responses)
	}
	return admitted, responses
}

// Prefixes returns the prefix view of every class as of now.
func (in *Intake) Prefixes(now time.Time) map[string]ClassPrefixes { return in.prefixes.Snapshot(now) }

// credit0 is an instance's evidence credit when its first report arrives.
func (in *Intake) credit0(node string) float64 {
	inflight := in.b().maxInflight[node]
	if inflight <= 0 {
		inflight = 1000
	}
	return in.opt.MaxAttempts * inflight
}

// spend checks a report's evidence against its instance's credit and
// updates the credit; in.mu must be held.
func (in *Intake) spend(k [2]string, r *policyv1.ReportRequest) error {
	c, ok := in.credit[k]
	if !ok {
		c = in.credit0(k[0])
	}
	c = math.Min(c, in.credit0(k[0]))
	admitted, responses := totals(r)
	c += in.opt.MaxAttempts * admitted
	if responses > c {
		return reject("evidence", "report from %s/%s: %.0f engine responses, more than its %.0f admitted requests and the ones it had in flight can produce (at most %.0f)",
			k[0], k[1], responses, admitted, c)
	}
	in.credit[k] = c - responses
	return nil
}

// validate checks a report and returns it as it is to be stored: its
// demand clipped to its node's bound, its evidence for unknown engines
// dropped (adjusted says which, for the metric).
func (in *Intake) validate(r *policyv1.ReportRequest, now time.Time) (_ *policyv1.ReportRequest, adjusted []string, err error) {
	if err := in.check(r, now); err != nil {
		return r, nil, err
	}
	out := r
	clone := func() {
		if out == r {
			out = &policyv1.ReportRequest{NodeId: r.NodeId, Instance: r.Instance, IntervalStart: r.IntervalStart, IntervalEnd: r.IntervalEnd,
				Demand: r.Demand, Engines: r.Engines, Prefixes: r.Prefixes}
		}
	}
	if k := in.clipRate(r); k < 1 {
		clone()
		out.Demand = make([]*policyv1.DemandSample, len(r.Demand))
		for i, d := range r.Demand {
			// Rounded down: the clipped report stays within the bound.
			req := uint64(math.Floor(k * float64(d.Requests)))
			out.Demand[i] = &policyv1.DemandSample{Class: d.Class, Priority: d.Priority, Requests: req,
				Shed: min(req, uint64(math.Floor(k*float64(d.Shed)))), PromptTokens: uint64(k * float64(d.PromptTokens)),
				OutputTokens: uint64(k * float64(d.OutputTokens))}
		}
		adjusted = append(adjusted, "rate_clipped")
	}
	if engines := in.b().engines; engines != nil {
		var keep []*policyv1.EngineEvidence
		for _, e := range r.Engines {
			if _, ok := engines[e.Address]; ok {
				keep = append(keep, e)
				continue
			}
			adjusted = append(adjusted, "unknown_engine")
		}
		if len(keep) < len(r.Engines) {
			clone()
			out.Engines = keep
		}
	}
	return out, adjusted, nil
}

// bound is a node's MaxRequestsPerS in force (0: none).
func (in *Intake) bound(node string) float64 {
	bs := in.b()
	b := bs.maxRPS[node]
	if b > 0 && bs.capacityBound[node] {
		in.mu.Lock()
		b = math.Max(b, CapacityBoundFactor*in.measuredRPS)
		in.mu.Unlock()
	}
	return b
}

// SetMeasuredRPS gives the fleet's measured serving rate (requests/s the
// engines complete): capacity-derived bounds follow it (CapacityBound).
func (in *Intake) SetMeasuredRPS(rps float64) {
	if math.IsNaN(rps) || rps < 0 {
		return
	}
	in.mu.Lock()
	in.measuredRPS = rps
	in.mu.Unlock()
}

// clipRate is the factor that brings a (checked) report's requests within
// its node's bound: 1 when they are.
func (in *Intake) clipRate(r *policyv1.ReportRequest) float64 {
	b := in.bound(r.NodeId)
	if b <= 0 {
		return 1
	}
	var requests float64
	for _, d := range r.Demand {
		requests += float64(d.Requests)
	}
	secs := math.Max(r.IntervalEnd.AsTime().Sub(r.IntervalStart.AsTime()).Seconds(), 1)
	if rate := requests / secs; rate > b {
		return b / rate
	}
	return 1
}

func (in *Intake) check(r *policyv1.ReportRequest, now time.Time) error {
	if !in.nodes[r.NodeId] {
		return reject("unknown_node", "report: node_id %q is not a frontend of the fleet", r.NodeId)
	}
	// Rates are counts over the interval's length: without both ends the
	// counts cannot be placed in the window (a missing start would spread
	// them over decades and the demand would silently read as zero).
	if r.IntervalStart == nil || r.IntervalEnd == nil {
		return reject("interval", "report from %s/%s: interval_start and interval_end are required", r.NodeId, r.Instance)
	}
	if err := r.IntervalStart.CheckValid(); err != nil {
		return reject("interval", "report from %s/%s: interval_start: %w", r.NodeId, r.Instance, err)
	}
	if err := r.IntervalEnd.CheckValid(); err != nil {
		return reject("interval", "report from %s/%s: interval_end: %w", r.NodeId, r.Instance, err)
	}
	s, e := r.IntervalStart.AsTime(), r.IntervalEnd.AsTime()
	if !e.After(s) {
		return reject("interval", "report from %s/%s: interval_end %s is not after interval_start %s", r.NodeId, r.Instance, e.Format(time.RFC3339Nano), s.Format(time.RFC3339Nano))
	}
	// A report may arrive late: sent before this process stalled (or a
	// network partition held it), read when it resumes. ext_proc merges
	// unsent reports for up to MergeBacklog, and a late copy is replaced by
	// the merged report that holds it (same interval_start): so an end up
	// to MergeBacklog in the past, beyond the skew, is taken.
	if skew := e.Sub(now); skew > in.opt.MaxClockSkew || -skew > in.opt.MaxClockSkew+MergeBacklog {
		return reject("clock", "report from %s/%s: interval_end %s is %v from the control plane's clock (%s); at most %v is accepted (%v behind: a late report)",
			r.NodeId, r.Instance, e.Format(time.RFC3339Nano), skew.Round(time.Millisecond), now.Format(time.RFC3339Nano), in.opt.MaxClockSkew, in.opt.MaxClockSkew+MergeBacklog)
	}
	if d := e.Sub(s); d > in.opt.MaxInterval {
		return reject("clock", "report from %s/%s: its interval covers %v, more than the %v accepted", r.NodeId, r.Instance, d.Round(time.Millisecond), in.opt.MaxInterval)
	}
	var errs []error
	var requests uint64 // saturating
	maxTok := in.b().maxTokens
	for i, d := range r.Demand {
		if !in.classes[d.Class] {
			errs = append(errs, fmt.Errorf("demand[%d].class %q is not a class of the fleet", i, d.Class))
		}
		if !in.priorities[d.Priority] {
			errs = append(errs, fmt.Errorf("demand[%d].priority %q is not a priority of the fleet", i, d.Priority))
		}
		if d.Shed > d.Requests {
			errs = append(errs, fmt.Errorf("demand[%d]: shed %d > requests %d", i, d.Shed, d.Requests))
		}
		if requests+d.Requests < requests {
			requests = math.MaxUint64
		} else {
			requests += d.Requests
		}
		if maxTok > 0 && (float64(d.PromptTokens) > maxTok*float64(d.Requests) || float64(d.OutputTokens) > maxTok*float64(d.Requests)) {
			return reject("tokens", "report from %s/%s: demand[%d]: %d prompt and %d output tokens for %d requests; a request has at most %.0f",
				r.NodeId, r.Instance, i, d.PromptTokens, d.OutputTokens, d.Requests, maxTok)
		}
	}
	// Above the bound a report is clipped (validate): an overload's real
	// burst must not blind the planner. Far above it, it is no burst.
	if bound := in.bound(r.NodeId); bound > 0 {
		secs := math.Max(e.Sub(s).Seconds(), 1)
		if rate := float64(requests) / secs; rate > AbsurdRate*bound {
			return reject("rate", "report from %s/%s: %d requests in %.3g s (%.4g/s) exceed the %g/s frontend %s can carry (fleet spec max_requests_per_s) more than %d-fold",
				r.NodeId, r.Instance, requests, e.Sub(s).Seconds(), rate, bound, r.NodeId, AbsurdRate)
		}
	}
	for i, e := range r.Engines {
		if e.Address == "" {
			errs = append(errs, fmt.Errorf("engines[%d].address is empty", i))
		}
		// ext_proc names an engine by the policy's mapping: an id that
		// is not its address's is a forgery (or a broken reporter).
		if id, ok := in.b().engines[e.Address]; ok && e.EngineId != "" && e.EngineId != id {
			return reject("engine_mismatch", "report from %s/%s: engines[%d]: address %s is engine %s, not %q",
				r.NodeId, r.Instance, i, e.Address, id, e.EngineId)
		}
		if e.Errors > e.Responses {
			errs = append(errs, fmt.Errorf("engines[%d] (%s): errors %d > responses %d", i, e.Address, e.Errors, e.Responses))
		}
		if e.HeaderLatencySumSeconds < 0 || math.IsNaN(e.HeaderLatencySumSeconds) || math.IsInf(e.HeaderLatencySumSeconds, 0) {
			errs = append(errs, fmt.Errorf("engines[%d] (%s): header_latency_sum_seconds %v", i, e.Address, e.HeaderLatencySumSeconds))
		}
		if e.CompletionSecondsSum < 0 || math.IsNaN(e.CompletionSecondsSum) || math.IsInf(e.CompletionSecondsSum, 0) {
			errs = append(errs, fmt.Errorf("engines[%d] (%s): completion_seconds_sum %v", i, e.Address, e.CompletionSecondsSum))
		}
		if e.HeaderLatencyCount > e.Responses || e.Completed > e.Responses {
			errs = append(errs, fmt.Errorf("engines[%d] (%s): header_latency_count %d and completed %d may not exceed responses %d",
				i, e.Address, e.HeaderLatencyCount, e.Completed, e.Responses))
		}
		if maxTok > 0 && (float64(e.CompletionPromptTokens) > maxTok*float64(e.Completed) || float64(e.CompletionOutputTokens) > maxTok*float64(e.Completed)) {
			errs = append(errs, fmt.Errorf("engines[%d] (%s): %d prompt and %d output tokens for %d completed requests; a request has at most %.0f",
				i, e.Address, e.CompletionPromptTokens, e.CompletionOutputTokens, e.Completed, maxTok))
		}
	}
	errs = append(errs, validatePrefixes(r, in.classes)...)
	if len(errs) > 0 {
		return &Rejection{Reason: "malformed", Err: fmt.Errorf("report from %s/%s: %w", r.NodeId, r.Instance, errors.Join(errs...))}
	}
	return nil
}

// overlap is the share of [s, e] inside [from, to].
func overlap(s, e, from, to time.Time) float64 {
	if !e.After(s) {
		if !e.Before(from) && !e.After(to) {
			return 1
		}
		return 0
	}
	lo, hi := s, e
	if from.After(lo) {
		lo = from
	}
	if to.Before(hi) {
		hi = to
	}
	if !hi.After(lo) {
		return 0
	}
	return float64(hi.Sub(lo)) / float64(e.Sub(s))
}

// acc sums a demand key's figures over reports, each weighted by the share
// of its interval inside the window.
type acc struct{ req, shed, pt, ot float64 }

// instance is one (node, instance)'s demand within the window.
type instance struct {
	node  string
	dem   map[DemandKey]*acc
	total float64
}

// add counts a report's demand, weighted by f.
func (ins *instance) add(node string, f float64, demand []*policyv1.DemandSample) {
	for _, d := range demand {
		dk := DemandKey{node, d.Class, d.Priority}
		a := ins.dem[dk]
		if a == nil {
			a = &acc{}
			ins.dem[dk] = a
		}
		a.req += f * float64(d.Requests)
		a.shed += f * float64(d.Shed)
		a.pt += f * float64(d.PromptTokens)
		a.ot += f * float64(d.OutputTokens)
		ins.total += f * float64(d.Requests)
	}
}

// addEvidence counts a report's evidence per engine address, weighted by f;
// latSum sums the header latencies, whose mean Snapshot takes at the end.
func addEvidence(ev map[string]*Evidence, latSum map[string]float64, node string, f float64, engines []*policyv1.EngineEvidence) {
	for _, e := range engines {
		x := ev[e.Address]
		if x == nil {
			x = &Evidence{CompletedByNode: map[string]float64{}}
			ev[e.Address] = x
		}
		x.Responses += f * float64(e.Responses)
		x.Errors += f * float64(e.Errors)
		x.HeaderLatencyCnt += f * float64(e.HeaderLatencyCount)
		latSum[e.Address] += f * e.HeaderLatencySumSeconds
		x.Completed += f * float64(e.Completed)
		x.CompletionSeconds += f * e.CompletionSecondsSum
		x.CompletionPromptTokens += f * float64(e.CompletionPromptTokens)
		x.CompletionOutputTokens += f * float64(e.CompletionOutputTokens)
		if e.Completed > 0 {
			x.CompletedByNode[node] += f * float64(e.Completed)
		}
	}
}

// Snapshot returns demand rates and per-address evidence over the window
// ending at now, and drops reports older than the window.
//
// One reporter's weight is capped: an instance's demand counts at most the
// node's MaxRequestsPerS, and so does the node's total (scaled down
// proportionally, priorities and classes alike), so no reporter can add
// more than its frontend can carry to the global demand.
func (in *Intake) Snapshot(now time.Time) (map[DemandKey]DemandRate, map[string]Evidence) {
	from := now.Add(-in.opt.Window)
	var insts []*instance
	ev := map[string]*Evidence{}
	latSum := map[string]float64{}
	earliest := map[string]time.Time{}
	in.mu.Lock()
	// Instances in order: their reports' sums (per node, per engine address)
	// must not vary with map order.
	keys := slices.SortedFunc(maps.Keys(in.byInstance), func(a, b [2]string) int {
		return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1]))
	})
	for _, k := range keys {
		reps := in.byInstance[k]
		keep := reps[:0]
		ins := &instance{node: k[0], dem: map[DemandKey]*acc{}}
		var admitted, responses float64
		for _, rp := range reps {
			if rp.end.Before(from) {
				continue
			}
			keep = append(keep, rp)
			if s, ok := earliest[rp.req.NodeId]; !ok || rp.start.Before(s) {
				earliest[rp.req.NodeId] = rp.start
			}
			f := overlap(rp.start, rp.end, from, now)
			if f == 0 {
				continue
			}
			ins.add(rp.req.NodeId, f, rp.req.Demand)
			a, r := totals(rp.req)
			admitted, responses = admitted+f*a, responses+f*r
		}
		// Evidence is worth the requests behind it: an instance's
		// responses over the window count at most MaxAttempts per request
		// it admitted in the window (scaled down beyond), so a reporter
		// with few requests cannot weigh on engines with many responses
		// (the intake's credit lets a report carry its in-flight
		// requests' ends; the window's sums need no such allowance).
		worth := 1.0
		if lim := in.opt.MaxAttempts * admitted; responses > lim {
			worth = lim / responses
		}
		for _, rp := range reps {
			if rp.end.Before(from) {
				continue
			}
			if f := overlap(rp.start, rp.end, from, now); f > 0 && worth > 0 {
				addEvidence(ev, latSum, rp.req.NodeId, worth*f, rp.req.Engines)
			}
		}
		if len(keep) == 0 {
			delete(in.byInstance, k)
			delete(in.credit, k)
		} else {
			in.byInstance[k] = keep
		}
		insts = append(insts, ins)
	}
	in.mu.Unlock()
	// Rates divide by the span the node's reports cover, up to the window:
	// a restarted control plane (or a frontend that just came up) has less
	// than a window of reports and must not underestimate demand.
	span := func(node string) float64 {
		w := in.opt.Window.Seconds()
		if s, ok := earliest[node]; ok {
			if c := now.Sub(s).Seconds(); c > 0 && c < w {
				return c
			}
		}
		return w
	}
	// Cap each instance, then each node, at the node's bound.
	capped := func(node string, total float64) float64 {
		b := in.bound(node)
		if b <= 0 || total/span(node) <= b {
			return 1
		}
		return b * span(node) / total
	}
	dem := map[DemandKey]*acc{}
	nodeTotal := map[string]float64{}
	for _, ins := range insts {
		k := capped(ins.node, ins.total)
		for _, dk := range DemandKeys(ins.dem) {
			a := ins.dem[dk]
			x := dem[dk]
			if x == nil {
				x = &acc{}
				dem[dk] = x
			}
			x.req += k * a.req
			x.shed += k * a.shed
			x.pt += k * a.pt
			x.ot += k * a.ot
			nodeTotal[ins.node] += k * a.req
		}
	}
	outD := make(map[DemandKey]DemandRate, len(dem))
	for k, a := range dem {
		w := span(k.Node)
		c := capped(k.Node, nodeTotal[k.Node])
		r := DemandRate{RequestsPerS: c * a.req / w, ShedPerS: c * a.shed / w}
		if a.req > 0 {
			r.PromptTokens, r.OutputTokens = a.pt/a.req, a.ot/a.req
		}
		outD[k] = r
	}
	outE := make(map[string]Evidence, len(ev))
	for addr, e := range ev {
		if e.HeaderLatencyCnt > 0 {
			e.HeaderLatencyMs = 1000 * latSum[addr] / e.HeaderLatencyCnt
		}
		outE[addr] = *e
	}
	return outD, outE
}

// IntakeStatus is the admin view of the intake.
type IntakeStatus struct {
	Accepted        uint64               `json:"accepted"`
	Rejected        uint64               `json:"rejected"`
	LastRejection   string               `json:"last_rejection,omitempty"`
	LastRejectionAt time.Time            `json:"last_rejection_at,omitzero"`
	LastReport      map[string]time.Time `json:"last_report_by_node"`
	Instances       []string             `json:"instances"`
}

// Instances is the number of ext_proc instances per node whose reports
// cover part of the window ending at now. Several instances of one node
// split its requests among them: none of them sees all the requests of an
// engine only that node sends to.
func (in *Intake) Instances(now time.Time) map[string]int {
	from := now.Add(-in.opt.Window)
	out := map[string]int{}
	in.mu.Lock()
	defer in.mu.Unlock()
	for k, reps := range in.byInstance {
		if len(reps) > 0 && !reps[len(reps)-1].end.Before(from) {
			out[k[0]]++
		}
	}
	return out
}

// Status returns counters and the last rejection.
func (in *Intake) Status() IntakeStatus {
	in.mu.Lock()
	defer in.mu.Unlock()
	st := IntakeStatus{Accepted: in.accepted, Rejected: in.rejected, LastRejection: in.lastRejection,
		LastRejectionAt: in.lastRejectionAt, LastReport: map[string]time.Time{}}
	for k, v := range in.lastReport {
		st.LastReport[k] = v
	}
	for k := range in.byInstance {
		st.Instances = append(st.Instances, k[0]+"/"+k[1])
	}
	sort.Strings(st.Instances)
	return st
}
