package controlplane

import (
	"encoding/json"
	"math"
	"sync"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
)

// history keeps a summary of the last cycles, for the dashboard's charts
// (GET /history): per engine its TTFT, load and KV use, per frontend its
// demand and what ext_proc shed. It is bounded (a ring of cap points), so a
// control plane that runs for months holds the same memory as one that
// just started. Safe for concurrent use.
type history struct {
	// Set at construction, then read-only.
	fleet      string
	capacity   int // points kept
	engines    []fleet.Engine
	frontends  []fleet.Frontend
	priorities []string

	// mu guards pts and next.
	mu   sync.Mutex
	pts  []historyPoint // a ring once len(pts) == capacity
	next int            // where the next point goes once the ring is full
}

// historyPoint is one cycle. Slices follow the history's engine, frontend
// and priority order; latencies are NaN until an engine has served a
// request.
type historyPoint struct {
	at                        time.Time
	ttft, tbot                []float64
	running, waiting, kv, rps []float64
	util, planned, penalty    []float64
	state                     []string
	demand, shed              []float64 // per frontend, requests/s
	shedByPriority            []float64 // per priority, over every frontend
}

func newHistory(spec *fleet.Spec, n int) *history {
	h := &history{fleet: spec.Name, capacity: n, engines: spec.Engines, frontends: spec.Frontends, pts: make([]historyPoint, 0, n)}
	for _, p := range spec.Priorities {
		h.priorities = append(h.priorities, p.Name)
	}
	return h
}

// record adds one cycle: the engines' signals and the demand it used, and
// its outcome (nil if the cycle failed: the signals still count).
func (h *history) record(at time.Time, engines []signals.Engine, demand map[signals.DemandKey]signals.DemandRate, res *Result) {
	if h.capacity == 0 {
		return
	}
	ne := len(h.engines)
	// Milliseconds, as /history gives the times: ?since= then names a
	// point exactly.
	p := historyPoint{at: at.Truncate(time.Millisecond), ttft: nans(ne), tbot: nans(ne), running: nans(ne), waiting: nans(ne), kv: nans(ne),
		rps: nans(ne), util: nans(ne), planned: nans(ne), penalty: nans(ne), state: make([]string, ne),
		demand: make([]float64, len(h.frontends)), shed: make([]float64, len(h.frontends)),
		shedByPriority: make([]float64, len(h.priorities))}
	idx := map[string]int{}
	for j, e := range h.engines {
		idx[e.ID] = j
	}
	for _, e := range engines {
		j, ok := idx[e.ID]
		if !ok {
			continue
		}
		p.state[j] = e.Status().String()
		p.ttft[j], p.tbot[j] = e.TTFTMs, e.TBOTMs
		if e.Status() == signals.Up {
			p.running[j], p.waiting[j], p.kv[j], p.rps[j] = e.Running, e.Waiting, e.KVUsage, e.RequestsPerS
		}
	}
	if res != nil {
		for _, v := range res.Engines {
			if j, ok := idx[v.ID]; ok {
				p.util[j], p.planned[j], p.penalty[j] = v.ObservedUtilization, v.PlannedUtilization, v.Penalty
			}
		}
	}
	fidx := map[string]int{}
	for i, f := range h.frontends {
		fidx[f.NodeID] = i
	}
	pidx := map[string]int{}
	for k, name := range h.priorities {
		pidx[name] = k
	}
	for _, key := range signals.DemandKeys(demand) {
		d := demand[key]
		if i, ok := fidx[key.Node]; ok {
			p.demand[i] += d.RequestsPerS
			p.shed[i] += d.ShedPerS
		}
		if k, ok := pidx[key.Priority]; ok {
			p.shedByPriority[k] += d.ShedPerS
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.pts) < h.capacity {
		h.pts = append(h.pts, p)
		return
	}
	h.pts[h.next] = p
	h.next = (h.next + 1) % len(h.pts)
}

// points returns the points after since (all for the zero time), oldest
// first.
func (h *history) points(since time.Time) []historyPoint {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []historyPoint
	for _, part := range [][]historyPoint{h.pts[h.next:], h.pts[:h.next]} {
		for _, p := range part {
			if p.at.After(since) {
				out = append(out, p)
			}
		}
	}
	return out
}

func nans(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = math.NaN()
	}
	return s
}

// jsonFloat is a float64 that encodes NaN and ±Inf (nothing observed) as
// null: encoding/json refuses them, and a chart reads null as a gap.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(v)
}

// historyJSON is GET /history: column-major series, one value per point,
// ready for a chart (at is Unix seconds).
type historyJSON struct {
	Fleet      string            `json:"fleet"`
	Capacity   int               `json:"capacity"`
	Engines    []historyEngine   `json:"engines"`
	Frontends  []historyFrontend `json:"frontends"`
	Priorities []historyPriority `json:"priorities"`
	At         []float64         `json:"at"`
}

type historyEngine struct {
	ID      string      `json:"id"`
	Region  string      `json:"region"`
	GPU     string      `json:"gpu"`
	TTFTMs  []jsonFloat `json:"ttft_ms"`
	TBOTMs  []jsonFloat `json:"tbot_ms"`
	Running []jsonFloat `json:"running"`
	Waiting []jsonFloat `json:"waiting"`
	KVUsage []jsonFloat `json:"kv_usage"`
	ReqPerS []jsonFloat `json:"requests_per_s"`
	// Utilization is observed work over capacity, Planned the cycle's plan.
	Utilization []jsonFloat `json:"utilization"`
	Planned     []jsonFloat `json:"planned_utilization"`
	Penalty     []jsonFloat `json:"penalty"`
	State       []string    `json:"state"`
}

type historyFrontend struct {
	Node       string      `json:"node"`
	Region     string      `json:"region"`
	DemandPerS []jsonFloat `json:"demand_per_s"`
	ShedPerS   []jsonFloat `json:"shed_per_s"`
}

type historyPriority struct {
	Name     string      `json:"name"`
	ShedPerS []jsonFloat `json:"shed_per_s"`
}

// json returns the points after since (all for the zero time).
func (h *history) json(since time.Time) historyJSON {
	pts := h.points(since)
	out := historyJSON{Fleet: h.fleet, Capacity: h.capacity, At: make([]float64, len(pts))}
	for k, p := range pts {
		out.At[k] = float64(p.at.UnixMilli()) / 1000
	}
	col := func(get func(p historyPoint) float64) []jsonFloat {
		s := make([]jsonFloat, len(pts))
		for k, p := range pts {
			s[k] = jsonFloat(get(p))
		}
		return s
	}
	for j, e := range h.engines {
		he := historyEngine{ID: e.ID, Region: e.Region, GPU: e.GPU,
			TTFTMs:      col(func(p historyPoint) float64 { return p.ttft[j] }),
			TBOTMs:      col(func(p historyPoint) float64 { return p.tbot[j] }),
			Running:     col(func(p historyPoint) float64 { return p.running[j] }),
			Waiting:     col(func(p historyPoint) float64 { return p.waiting[j] }),
			KVUsage:     col(func(p historyPoint) float64 { return p.kv[j] }),
			ReqPerS:     col(func(p historyPoint) float64 { return p.rps[j] }),
			Utilization: col(func(p historyPoint) float64 { return p.util[j] }),
			Planned:     col(func(p historyPoint) float64 { return p.planned[j] }),
			Penalty:     col(func(p historyPoint) float64 { return p.penalty[j] }),
			State:       make([]string, len(pts))}
		for k, p := range pts {
			he.State[k] = p.state[j]
		}
		out.Engines = append(out.Engines, he)
	}
	for i, f := range h.frontends {
		out.Frontends = append(out.Frontends, historyFrontend{Node: f.NodeID, Region: f.Region,
			DemandPerS: col(func(p historyPoint) float64 { return p.demand[i] }),
			ShedPerS:   col(func(p historyPoint) float64 { return p.shed[i] })})
	}
	for k, name := range h.priorities {
		out.Priorities = append(out.Priorities, historyPriority{Name: name,
			ShedPerS: col(func(p historyPoint) float64 { return p.shedByPriority[k] })})
	}
	return out
}
