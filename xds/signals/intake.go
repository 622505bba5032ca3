package signals

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
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
	// Prefix configures the prefix view (prefixes.go).
	Prefix PrefixOptions
}

// DemandKey names one demand stream.
type DemandKey struct {
	Node, Class, Priority string
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
	// Set by NewIntake, then read-only.
	opt                        IntakeOptions
	nodes, classes, priorities map[string]bool
	prefixes                   *Prefixes // safe for concurrent use itself

	// mu guards the fields below.
	mu                 sync.Mutex
	byInstance         map[[2]string][]report // (node, instance) → reports in arrival order
	lastReport         map[string]time.Time   // node → last report
	accepted, rejected uint64
	lastRejection      string
	lastRejectionAt    time.Time
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
	in := &Intake{opt: opt, nodes: set(opt.Nodes), classes: set(opt.Classes), priorities: set(opt.Priorities),
		byInstance: map[[2]string][]report{}, lastReport: map[string]time.Time{}}
	var err error
	if in.prefixes, err = NewPrefixes(opt.Prefix); err != nil {
		return nil, fmt.Errorf("intake: %w", err)
	}
	return in, nil
}

func (in *Intake) now() time.Time {
	if in.opt.Now != nil {
		return in.opt.Now()
	}
	return time.Now()
}

// Report validates and stores one report (the Reports service calls it).
func (in *Intake) Report(_ context.Context, r *policyv1.ReportRequest) error {
	if err := in.validate(r); err != nil {
		in.mu.Lock()
		in.rejected++
		in.lastRejection, in.lastRejectionAt = err.Error(), in.now()
		in.mu.Unlock()
		return err
	}
	now := in.now()
	// Trust our own clock for the window: an instance's clock may be off.
	// The interval's length is kept; its end is the receive time.
	d := r.IntervalEnd.AsTime().Sub(r.IntervalStart.AsTime())
	rep := report{received: now, req: r, start: now.Add(-d), end: now}
	k := [2]string{r.NodeId, r.Instance}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.accepted++
	reps := append(in.byInstance[k], rep)
	if len(reps) > in.opt.MaxIntervals {
		reps = reps[len(reps)-in.opt.MaxIntervals:]
	}
	in.byInstance[k] = reps
	in.lastReport[r.NodeId] = now
	in.prefixes.Add(now, r)
	return nil
}

// Prefixes returns the prefix view of every class as of now.
func (in *Intake) Prefixes(now time.Time) map[string]ClassPrefixes { return in.prefixes.Snapshot(now) }

func (in *Intake) validate(r *policyv1.ReportRequest) error {
	if !in.nodes[r.NodeId] {
		return fmt.Errorf("report: node_id %q is not a frontend of the fleet", r.NodeId)
	}
	// Rates are counts over the interval's length: without both ends the
	// counts cannot be placed in the window (a missing start would spread
	// them over decades and the demand would silently read as zero).
	if r.IntervalStart == nil || r.IntervalEnd == nil {
		return fmt.Errorf("report from %s/%s: interval_start and interval_end are required", r.NodeId, r.Instance)
	}
	if err := r.IntervalStart.CheckValid(); err != nil {
		return fmt.Errorf("report from %s/%s: interval_start: %w", r.NodeId, r.Instance, err)
	}
	if err := r.IntervalEnd.CheckValid(); err != nil {
		return fmt.Errorf("report from %s/%s: interval_end: %w", r.NodeId, r.Instance, err)
	}
	if s, e := r.IntervalStart.AsTime(), r.IntervalEnd.AsTime(); !e.After(s) {
		return fmt.Errorf("report from %s/%s: interval_end %s is not after interval_start %s", r.NodeId, r.Instance, e.Format(time.RFC3339Nano), s.Format(time.RFC3339Nano))
	}
	var errs []error
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
	}
	for i, e := range r.Engines {
		if e.Address == "" {
			errs = append(errs, fmt.Errorf("engines[%d].address is empty", i))
		}
		if e.Errors > e.Responses {
			errs = append(errs, fmt.Errorf("engines[%d] (%s): errors %d > responses %d", i, e.Address, e.Errors, e.Responses))
		}
		if e.HeaderLatencySumSeconds < 0 || math.IsNaN(e.HeaderLatencySumSeconds) || math.IsInf(e.HeaderLatencySumSeconds, 0) {
			errs = append(errs, fmt.Errorf("engines[%d] (%s): header_latency_sum_seconds %v", i, e.Address, e.HeaderLatencySumSeconds))
		}
	}
	errs = append(errs, validatePrefixes(r, in.classes)...)
	if len(errs) > 0 {
		return fmt.Errorf("report from %s/%s: %w", r.NodeId, r.Instance, errors.Join(errs...))
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

// Snapshot returns demand rates and per-address evidence over the window
// ending at now, and drops reports older than the window.
func (in *Intake) Snapshot(now time.Time) (map[DemandKey]DemandRate, map[string]Evidence) {
	from := now.Add(-in.opt.Window)
	type acc struct{ req, shed, pt, ot float64 }
	dem := map[DemandKey]*acc{}
	ev := map[string]*Evidence{}
	latSum := map[string]float64{}
	earliest := map[string]time.Time{}
	in.mu.Lock()
	for k, reps := range in.byInstance {
		keep := reps[:0]
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
			for _, d := range rp.req.Demand {
				dk := DemandKey{rp.req.NodeId, d.Class, d.Priority}
				a := dem[dk]
				if a == nil {
					a = &acc{}
					dem[dk] = a
				}
				a.req += f * float64(d.Requests)
				a.shed += f * float64(d.Shed)
				a.pt += f * float64(d.PromptTokens)
				a.ot += f * float64(d.OutputTokens)
			}
			for _, e := range rp.req.Engines {
				x := ev[e.Address]
				if x == nil {
					x = &Evidence{}
					ev[e.Address] = x
				}
				x.Responses += f * float64(e.Responses)
				x.Errors += f * float64(e.Errors)
				x.HeaderLatencyCnt += f * float64(e.HeaderLatencyCount)
				latSum[e.Address] += f * e.HeaderLatencySumSeconds
			}
		}
		if len(keep) == 0 {
			delete(in.byInstance, k)
		} else {
			in.byInstance[k] = keep
		}
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
	outD := make(map[DemandKey]DemandRate, len(dem))
	for k, a := range dem {
		w := span(k.Node)
		r := DemandRate{RequestsPerS: a.req / w, ShedPerS: a.shed / w}
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
