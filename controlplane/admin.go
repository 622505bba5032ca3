package controlplane

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inferlb/inferlb/controlplane/dashboard"
	"github.com/inferlb/inferlb/controlplane/signals"
)

// adminIndex is the admin port's root page.
const adminIndex = `inferlb control plane
  /weights[?node=N]          published weights per node and class (shares, Envoy integers, priorities)
  /explain[?node=N&class=C]  the optimizer's terms behind every weight
  /signals                   engine signals, the cycle's engine view (penalties), demand, evidence
  /affinity                  per class: the split table of hot and shared prefixes, and why
  /xds                       per node: published, ACKed and NACKed versions, streams
  /history[?since=T]         the last cycles' engine signals, demand and shedding, column by column
  /dashboard/                the web dashboard (weights heatmap, engines, charts over time)
  /metrics                   Prometheus metrics
  /healthz /readyz
`

// adminHandler serves the admin port: the views of the last cycle, the
// xDS status, the history, the dashboard and the metrics.
func (r *Runner) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", r.serveReady)
	mux.HandleFunc("GET /weights", r.lastCycle(r.serveWeights))
	mux.HandleFunc("GET /signals", r.serveSignals)
	mux.HandleFunc("GET /explain", r.lastCycle(r.serveExplain))
	mux.HandleFunc("GET /affinity", r.lastCycle(func(w http.ResponseWriter, _ *http.Request, res *Result) {
		r.writeJSON(w, map[string]any{"at": res.At, "classes": res.Affinity}, true)
	}))
	mux.HandleFunc("GET /xds", func(w http.ResponseWriter, _ *http.Request) {
		r.writeJSON(w, map[string]any{"nodes": r.srv.Status()}, true)
	})
	mux.HandleFunc("GET /history", r.serveHistory)
	mux.Handle("GET /dashboard/", dashboard.Handler("/dashboard/"))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, adminIndex) })
	return mux
}

// writeJSON writes v as JSON, indented for a person reading curl's output
// or compact (the dashboard's history: thousands of numbers). It is
// encoded whole before anything is sent, so that a value JSON cannot carry
// (NaN) is a 500 that says so, not a 200 with half a document.
func (r *Runner) writeJSON(w http.ResponseWriter, v any, indent bool) {
	var b []byte
	var err error
	if indent {
		b, err = json.MarshalIndent(v, "", "  ")
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		r.log.Error("admin: encoding the answer", "err", err)
		http.Error(w, "encoding the answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}

// lastCycle adapts a view of the last cycle's result: 503 before the
// first cycle.
func (r *Runner) lastCycle(view func(http.ResponseWriter, *http.Request, *Result)) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		res := r.Last()
		if res == nil {
			http.Error(w, "no cycle yet", http.StatusServiceUnavailable)
			return
		}
		view(w, req, res)
	}
}

func (r *Runner) serveReady(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	ready := r.ready
	r.mu.Unlock()
	if !ready {
		http.Error(w, "warming up: no cycle yet", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ready")
}

// serveWeights: per node and class, the published shares, what Envoy got
// (integer weights, priorities, health), the deadband's verdict.
func (r *Runner) serveWeights(w http.ResponseWriter, req *http.Request, res *Result) {
	type cls struct {
		Weights  map[string]float64 `json:"weights"`
		Envoy    map[string]uint32  `json:"envoy_weights"`
		Priority map[string]uint32  `json:"envoy_priority"`
		Health   map[string]string  `json:"engine_health"`
		Held     bool               `json:"held_by_deadband"`
		TV       float64            `json:"tv_distance_proposed"`
		Shed     map[string]float64 `json:"shed_by_priority,omitempty"`
	}
	out := map[string]any{}
	for n, nd := range res.Nodes {
		if q := req.URL.Query().Get("node"); q != "" && q != n {
			continue
		}
		m := map[string]cls{}
		for c, cd := range nd.Classes {
			m[c] = cls{cd.Weights, cd.EnvoyW, cd.Priority, cd.Health, cd.Held, cd.TVDistance, cd.Shed}
		}
		out[n] = map[string]any{"classes": m, "cluster_version": nd.Resources.ClusterVersion,
			"endpoint_version": nd.Resources.EndpointVersion, "policy_version": nd.Resources.Policy.GetVersion()}
	}
	r.writeJSON(w, map[string]any{"at": res.At, "nodes": out}, true)
}

// serveSignals: the tracker's engine signals now, the last cycle's engine
// view, the demand and evidence from the intake.
func (r *Runner) serveSignals(w http.ResponseWriter, _ *http.Request) {
	now := r.cfg.Now()
	r.mu.Lock()
	eng := r.tracker.Engines(now)
	r.mu.Unlock()
	dem, ev := r.intake.Snapshot(now)
	demand := map[string]signals.DemandRate{}
	for k, v := range dem {
		demand[k.Node+"/"+k.Class+"/"+k.Priority] = v
	}
	var views []EngineView
	var shapes map[string]ClassShape
	if res := r.Last(); res != nil {
		views, shapes = res.Engines, res.Shapes
	}
	r.writeJSON(w, map[string]any{"at": now, "engines": eng, "cycle_view": views, "demand": demand,
		"evidence": ev, "intake": r.intake.Status(), "shapes": shapes}, true)
}

// serveExplain: the optimizer's terms behind every weight, for a node
// and class or all.
func (r *Runner) serveExplain(w http.ResponseWriter, req *http.Request, res *Result) {
	node, class := req.URL.Query().Get("node"), req.URL.Query().Get("class")
	out := map[string]any{}
	for n, nd := range res.Nodes {
		if node != "" && node != n {
			continue
		}
		m := map[string]any{}
		for c, cd := range nd.Classes {
			if class != "" && class != c {
				continue
			}
			m[c] = map[string]any{"demand_per_s": cd.Demand, "weights": cd.Weights, "held_by_deadband": cd.Held,
				"proposed": cd.Proposed, "explanations": cd.Explain, "flow": cd.Flow}
		}
		out[n] = m
	}
	if node != "" && len(out) == 0 {
		http.Error(w, fmt.Sprintf("unknown node %q", node), http.StatusNotFound)
		return
	}
	// The online profile correction each weight's TTFT was priced with.
	corr := map[string]any{}
	for _, v := range res.Engines {
		corr[v.ID] = map[string]any{"factor": v.ProfileCorrection, "why": v.ProfileCorrectionWhy}
	}
	r.writeJSON(w, map[string]any{"at": res.At, "allocator": res.Allocator, "fallback_reason": res.Fallback,
		"balance_skipped": res.BalanceSkipped, "objective": res.Objective, "profile_corrections": corr, "nodes": out}, true)
}

// serveHistory: the last cycles, column by column, compact.
func (r *Runner) serveHistory(w http.ResponseWriter, req *http.Request) {
	var since time.Time
	if q := req.URL.Query().Get("since"); q != "" {
		s, err := strconv.ParseFloat(q, 64)
		if err != nil || !(s >= 0 && s < 1e12) { // 1e12 s: the year 33658, within time.UnixMilli
			http.Error(w, fmt.Sprintf("since=%q: want Unix seconds (as /history's at gives them)", q), http.StatusBadRequest)
			return
		}
		since = time.UnixMilli(int64(math.Round(s * 1000)))
	}
	r.mu.Lock()
	hist := r.hist
	r.mu.Unlock()
	r.writeJSON(w, hist.json(since), false)
}
