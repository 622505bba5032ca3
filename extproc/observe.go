package extproc

import (
	"sort"
	"sync"
	"time"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Observer accumulates one reporting interval of demand (per class and
// priority, shed requests included) and per-engine evidence (responses,
// errors, time to response headers). Flush hands the interval over as a
// ReportRequest and starts the next one.
type Observer struct {
	mu      sync.Mutex
	start   time.Time
	demand  map[demandKey]*policyv1.DemandSample
	engines map[string]*policyv1.EngineEvidence
}

type demandKey struct{ class, priority string }

// NewObserver starts an interval at now.
func NewObserver(now time.Time) *Observer {
	return &Observer{start: now, demand: map[demandKey]*policyv1.DemandSample{}, engines: map[string]*policyv1.EngineEvidence{}}
}

// Demand records one arriving request of a class and priority.
func (o *Observer) Demand(class, priority string, shed bool, promptTokens, outputTokens int) {
	o.mu.Lock()
	d := o.demand[demandKey{class, priority}]
	if d == nil {
		d = &policyv1.DemandSample{Class: class, Priority: priority}
		o.demand[demandKey{class, priority}] = d
	}
	d.Requests++
	if shed {
		d.Shed++
	}
	d.PromptTokens += uint64(max(promptTokens, 0))
	d.OutputTokens += uint64(max(outputTokens, 0))
	o.mu.Unlock()
}

// Completed records one request the upstream at addr served to the end
// (from Envoy's request log): a response, its time to response headers and
// its whole upstream time, with the prompt and output tokens it asked for.
func (o *Observer) Completed(addr, engineID string, headerLatency, total time.Duration, promptTokens, outputTokens int) {
	o.mu.Lock()
	e := o.engine(addr, engineID)
	e.Responses++
	e.HeaderLatencySumSeconds += headerLatency.Seconds()
	e.HeaderLatencyCount++
	e.Completed++
	e.CompletionSecondsSum += total.Seconds()
	e.CompletionPromptTokens += uint64(max(promptTokens, 0))
	e.CompletionOutputTokens += uint64(max(outputTokens, 0))
	o.mu.Unlock()
}

// Answered records one response without timing (a success whose stream was
// cut short, whose time says nothing about the engine's speed).
func (o *Observer) Answered(addr, engineID string) {
	o.mu.Lock()
	o.engine(addr, engineID).Responses++
	o.mu.Unlock()
}

// Failure records one failed upstream attempt at addr (from Envoy's
// upstream log): a response and an error, without a latency sample.
func (o *Observer) Failure(addr, engineID string) {
	o.mu.Lock()
	e := o.engine(addr, engineID)
	e.Responses++
	e.Errors++
	o.mu.Unlock()
}

// engine is the interval's evidence for addr, created on first use; o.mu
// must be held.
func (o *Observer) engine(addr, engineID string) *policyv1.EngineEvidence {
	e := o.engines[addr]
	if e == nil {
		e = &policyv1.EngineEvidence{Address: addr, EngineId: engineID}
		o.engines[addr] = e
	}
	return e
}

// Flush returns the interval that ends at now (sorted, for stable reports)
// and starts a new one.
func (o *Observer) Flush(now time.Time) *policyv1.ReportRequest {
	o.mu.Lock()
	demand, engines, start := o.demand, o.engines, o.start
	o.demand = make(map[demandKey]*policyv1.DemandSample, len(demand))
	o.engines = make(map[string]*policyv1.EngineEvidence, len(engines))
	o.start = now
	o.mu.Unlock()
	r := &policyv1.ReportRequest{IntervalStart: timestamppb.New(start), IntervalEnd: timestamppb.New(now)}
	for _, d := range demand {
		r.Demand = append(r.Demand, d)
	}
	for _, e := range engines {
		r.Engines = append(r.Engines, e)
	}
	sort.Slice(r.Demand, func(i, j int) bool {
		if r.Demand[i].Class != r.Demand[j].Class {
			return r.Demand[i].Class < r.Demand[j].Class
		}
		return r.Demand[i].Priority < r.Demand[j].Priority
	})
	sort.Slice(r.Engines, func(i, j int) bool { return r.Engines[i].Address < r.Engines[j].Address })
	return r
}
