package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/inferlb/inferlb/tools/workload"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteJSONFile writes the report to path.
func (r *Report) WriteJSONFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := r.WriteJSON(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WriteTable writes the report as a human-readable table.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }
	load := r.Arrival
	switch r.Arrival {
	case "poisson":
		load += fmt.Sprintf(" at %.1f req/s", r.Rate)
	case "trace":
		load += fmt.Sprintf(" timestamps, speedup %g", r.Speedup)
	case "closed":
		load += fmt.Sprintf(" loop, concurrency %d", r.Concurrency)
	}
	if r.TimeScale != 0 {
		load += fmt.Sprintf(", in the target's time (time scale %g)", r.TimeScale)
	}
	if r.Interrupted {
		load += " (interrupted)"
	}
	fmt.Fprintf(w, "load: %s, %.2f s\n", load, r.DurationS)
	q := r.Requests
	fmt.Fprintf(w, "requests: %d sent, %d ok, %d rejected (429), %d timeouts, %d errors, %d cancelled\n",
		q.Sent, q.OK, q.Rejected, q.Timeouts, q.Errors, q.Cancelled)
	fmt.Fprintf(w, "throughput: %.2f req/s, %.0f input tok/s, %.0f output tok/s\n", r.RequestsPerS, r.InputTokensPerS, r.OutputTokensPerS)
	if r.SLO.TTFTMs > 0 || r.SLO.TPOTMs > 0 {
		fmt.Fprintf(w, "goodput: %.2f req/s (%d requests with TTFT ≤ %g ms and TPOT ≤ %g ms; 0 = unbounded)\n", r.GoodputPerS, r.Goodput, r.SLO.TTFTMs, r.SLO.TPOTMs)
	}
	if r.UsageRequests > 0 {
		fmt.Fprintf(w, "prefix cache: %.1f%% of prompt tokens cached (%d of %d requests reported usage)\n", 100*r.CachedShare, r.UsageRequests, r.Requests.OK)
	}
	if r.IdealCachedShare > 0 {
		fmt.Fprintf(w, "prefix cache ideal for the rows sent: %.1f%% of prompt tokens, %.1f%% of blocks (an unbounded cache, requests one after another)\n", 100*r.IdealCachedShare, 100*r.IdealBlockShare)
	}
	p("\tcount\tmean\tp50\tp90\tp99\tmax\t\n")
	row := func(name string, d Dist) {
		p("%s (ms)\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", name, d.Count, d.Mean, d.P50, d.P90, d.P99, d.Max)
	}
	row("TTFT", r.TTFT)
	row("TPOT", r.TPOT)
	row("ITL", r.ITL)
	row("E2E", r.E2E)
	if r.Arrival != "closed" {
		row("send lag", r.SendLag)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Groups) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "group\tok\t429\terr+timeout\treq/s\tTTFT p50\tTTFT p99\tTPOT p50\tE2E p99\tcached\t")
		keys := make([]string, 0, len(r.Groups))
		for k := range r.Groups {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			g := r.Groups[k]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f%%\t\n", k, g.Requests.OK, g.Requests.Rejected,
				g.Requests.Errors+g.Requests.Timeouts, g.RequestsPerS, g.TTFT.P50, g.TTFT.P99, g.TPOT.P50, g.E2E.P99, 100*g.CachedShare)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Errors) > 0 {
		fmt.Fprintln(w, "errors:")
		keys := make([]string, 0, len(r.Errors))
		for k := range r.Errors {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  %6d  %s\n", r.Errors[k], k)
		}
	}
	return nil
}

// RequestRecord is one request's line in a per-request JSONL log.
type RequestRecord struct {
	Index     int     `json:"index"`
	SessionID string  `json:"session_id,omitempty"`
	Turn      int     `json:"turn,omitempty"`
	Priority  string  `json:"priority,omitempty"`
	Region    string  `json:"region,omitempty"`
	SentS     float64 `json:"sent_s"` // since the run's start
	Outcome   string  `json:"outcome"`
	Status    int     `json:"status,omitempty"`
	TTFTMs    float64 `json:"ttft_ms,omitempty"`
	TPOTMs    float64 `json:"tpot_ms,omitempty"`
	E2EMs     float64 `json:"e2e_ms"`
	Prompt    int     `json:"prompt_tokens"`
	Output    int     `json:"output_tokens"`
	Cached    int     `json:"cached_tokens"`
	Error     string  `json:"error,omitempty"`
}

// Record builds req's record; durations in real time divided by scale (the
// target's time scale, 1 for none).
func Record(req *workload.Request, res *Result, start time.Time, scale float64) RequestRecord {
	if scale <= 0 {
		scale = 1
	}
	msf := func(d time.Duration) float64 { return float64(d) / 1e6 / scale }
	rec := RequestRecord{Index: req.Index, SessionID: req.SessionID, Turn: req.Turn, Priority: req.Priority, Region: req.Region,
		SentS: res.Sent.Sub(start).Seconds() / scale, Outcome: res.Outcome.String(), Status: res.Status,
		TTFTMs: msf(res.TTFT), E2EMs: msf(res.E2E), Prompt: req.PromptTokens, Output: res.OutputTokens, Cached: res.CachedTokens}
	if res.HasUsage {
		rec.Prompt = res.PromptTokens
	}
	if tpot, ok := res.TPOT(); ok {
		rec.TPOTMs = msf(tpot)
	}
	if res.Err != nil {
		rec.Error = res.Err.Error()
	}
	return rec
}
