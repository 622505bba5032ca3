// Package rivalbench runs inferlb side by side with the real routers it is
// measured against (SGLang's model gateway smg, sglang-router, vllm-router,
// each at its documented defaults) on identical simulated fleets and the
// same traffic, started at the same instant, and reports what each router's
// clients and engines saw.
//
// One engine-sim process serves one fleet per router (identical engines
// that differ only in their ports). inferlb runs as its users run it: the
// control plane at its defaults, ext_proc, and Envoy with the bootstrap
// `inferlb extproc --print-bootstrap` prints. Every rival runs from its own
// virtual environment (scripts/setup-rivals.sh). Each run starts everything
// afresh, so every router meets empty prefix caches.
//
// Per router the bench reports the engines' prefix-cache hit rate (from
// their own vllm:prefix_cache_* counters), the clients' TTFT, TPOT,
// throughput, errors and 429s, the share of follow-up turns that reached an
// engine without their conversation's history (the engine served less of
// the prompt from cache than the previous turn's prompt), how evenly the
// engines were loaded, and the CPU the router used.
//
// With three regions the fleet is split over us-east, us-west and eu-west,
// with the round trips emulated by the engine simulator; each rival is
// deployed as its users deploy it, one router per region in front of that
// region's engines, and each region's clients send to their own region's
// router. inferlb runs one control plane, and one ext_proc and Envoy per
// region.
package rivalbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferlb/inferlb/internal/childproc"
	"github.com/inferlb/inferlb/tools/loadgen"
	"github.com/inferlb/inferlb/tools/workload"
)

// Options configure a bench. Start from DefaultOptions.
type Options struct {
	Routers   []Router
	Workloads []Workload
	// Regions is 1 (one region, "local") or 3 (us-east, us-west, eu-west).
	Regions int
	// Shares are the regions' shares of the traffic with three regions
	// (empty: equal).
	Shares []workload.Share
	// EnginesPerRegion is each router's engines in each region.
	EnginesPerRegion int
	// Runs per workload; the table shows each figure's median.
	Runs int
	// Duration bounds each run's traffic (requests in flight finish).
	Duration time.Duration
	// Load scales the synthetic workloads' arrival rates (1: the bench's
	// own, where round robin's engines queue).
	Load float64
	// Seed of the traffic (the same for every router).
	Seed uint64
	// DataDir holds the traces (Mooncake's synthetic trace, Azure's).
	DataDir string
	// OutDir receives the runs' logs and per-request files.
	OutDir string
	// Self is the lab's binary, inferlb-lab (engine-sim, control-plane,
	// extproc).
	Self string
	// Envoy is the Envoy binary; RivalDir holds the rivals' environments.
	Envoy    string
	RivalDir string
	// Progress, if set, receives progress lines.
	Progress io.Writer
	Logger   *slog.Logger
}

// DefaultOptions is a full single-region bench.
func DefaultOptions() Options {
	return Options{Routers: AllRouters, Workloads: Workloads, Regions: 1, EnginesPerRegion: 4, Runs: 3,
		Duration: 60 * time.Second, Load: 1, Seed: 1}
}

func (o Options) check() error {
	switch {
	case len(o.Routers) == 0:
		return errors.New("rivalbench: no router")
	case len(o.Workloads) == 0:
		return errors.New("rivalbench: no workload")
	case o.Regions != 1 && o.Regions != 3:
		return fmt.Errorf("rivalbench: regions must be 1 or 3, got %d", o.Regions)
	case o.EnginesPerRegion < 1:
		return fmt.Errorf("rivalbench: engines per region must be at least 1, got %d", o.EnginesPerRegion)
	case o.Runs < 1:
		return fmt.Errorf("rivalbench: runs must be at least 1, got %d", o.Runs)
	case o.Duration <= 0:
		return fmt.Errorf("rivalbench: duration must be positive, got %v", o.Duration)
	case !(o.Load > 0):
		return fmt.Errorf("rivalbench: load must be positive, got %v", o.Load)
	case o.Self == "" || o.OutDir == "":
		return errors.New("rivalbench: Self and OutDir are required")
	}
	if len(o.Shares) > 0 && len(o.Shares) != o.Regions {
		return fmt.Errorf("rivalbench: %d region shares for %d regions", len(o.Shares), o.Regions)
	}
	for _, s := range o.Shares {
		if !slicesContain(o.regionNames(), s.Name) {
			return fmt.Errorf("rivalbench: share for unknown region %q (regions: %s)", s.Name, strings.Join(o.regionNames(), ", "))
		}
	}
	return nil
}

func slicesContain(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// regionNames are the bench's regions.
func (o Options) regionNames() []string {
	if o.Regions == 3 {
		return []string{"us-east", "us-west", "eu-west"}
	}
	return []string{"local"}
}

// regionShares are the regions' shares of the traffic.
func (o Options) regionShares() []workload.Share {
	if len(o.Shares) > 0 {
		return o.Shares
	}
	var sh []workload.Share
	for _, r := range o.regionNames() {
		sh = append(sh, workload.Share{Name: r, Weight: 1})
	}
	return sh
}

// Run runs every workload Runs times and returns the results.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	res := &Result{Regions: o.regionNames(), EnginesPerRegion: o.EnginesPerRegion, Runs: o.Runs,
		DurationS: o.Duration.Seconds(), Load: o.Load, Seed: o.Seed, Started: time.Now().UTC()}
	for _, r := range o.Routers {
		res.Routers = append(res.Routers, r.ID)
	}
	for _, w := range o.Workloads {
		wr := WorkloadResult{Name: w.Name, About: w.About}
		for run := 0; run < o.Runs; run++ {
			o.progressf("%s: run %d of %d", w.Name, run+1, o.Runs)
			rr, err := runOnce(ctx, o, w, run)
			if errors.Is(err, errStart) && ctx.Err() == nil {
				// A router that failed to start (a port taken between its
				// choice and the router's bind) is no result: start afresh.
				o.progressf("%s: run %d did not start (%v); starting it again", w.Name, run+1, err)
				rr, err = runOnce(ctx, o, w, run)
			}
			if err != nil {
				return nil, fmt.Errorf("%s run %d: %w", w.Name, run+1, err)
			}
			wr.Runs = append(wr.Runs, rr)
		}
		wr.summarize(o.Routers)
		res.Workloads = append(res.Workloads, wr)
	}
	return res, nil
}

func (o Options) progressf(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
}

// errStart marks a run whose rig did not start: no traffic was sent.
var errStart = errors.New("the rig did not start")

// runOnce starts the rig afresh, sends the workload to every router at the
// same instant, and measures.
func runOnce(ctx context.Context, o Options, w Workload, run int) (RunResult, error) {
	dir := filepath.Join(o.OutDir, w.Name, "run-"+strconv.Itoa(run+1))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return RunResult{}, err
	}
	g := &childproc.Group{Dir: dir, Log: o.Logger, Grace: 5 * time.Second}
	defer g.StopAll()
	rig, err := startRig(ctx, o, g, dir)
	if err != nil {
		return RunResult{}, fmt.Errorf("%w: %w", errStart, err)
	}
	o.progressf("%s: every router is ready; traffic for %v", w.Name, o.Duration)

	// Sources first (a trace is read once per router), then the start.
	type target struct {
		r   *routerRig
		src workload.Source
		arr loadgen.Arrival
		m   *measure
	}
	var ts []*target
	for _, r := range rig.routers {
		src, arr, err := w.build(o, run)
		if err != nil {
			return RunResult{}, err
		}
		if o.Regions > 1 {
			src = withRegions(src, o.regionShares(), o.Seed+uint64(run))
		}
		ts = append(ts, &target{r: r, src: src, arr: arr, m: newMeasure()})
	}
	before := map[string]engineCounters{}
	cpuBefore := map[string]time.Duration{}
	for _, t := range ts {
		if before[t.r.router.ID], err = scrapeFleet(ctx, t.r.engines); err != nil {
			return RunResult{}, err
		}
		cpuBefore[t.r.router.ID] = t.r.cpu()
	}

	start := time.Now().Add(200 * time.Millisecond)
	var wg sync.WaitGroup
	reports := make([]*loadgen.Report, len(ts))
	errs := make([]error, len(ts))
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, t := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := loadgen.Config{
				Client:   t.r.client(),
				Source:   t.src,
				Arrival:  t.arr,
				Duration: o.Duration,
				Seed:     o.Seed + uint64(run),
				OnResult: t.m.observe,
			}
			// Every router's traffic starts at the same instant.
			time.Sleep(time.Until(start))
			reports[i], errs[i] = loadgen.Run(runCtx, cfg)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	watching := true
	for watching {
		select {
		case <-done:
			watching = false
		case <-tick.C:
			if err := g.Exited(); err != nil {
				cancel()
				<-done
				return RunResult{}, err
			}
			var parts []string
			for _, t := range ts {
				n, ok := t.m.counts()
				parts = append(parts, fmt.Sprintf("%s %d/%d", t.r.router.ID, ok, n))
			}
			o.progressf("%s: %v: done/sent %s", w.Name, time.Since(start).Round(time.Second), strings.Join(parts, ", "))
		case <-ctx.Done():
			cancel()
			<-done
			return RunResult{}, ctx.Err()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return RunResult{}, err
	}
	out := RunResult{Run: run + 1, Routers: map[string]RouterResult{}}
	for i, t := range ts {
		out.IdealHit = max(out.IdealHit, idealHit(o, w, run, reports[i].Requests.Sent))
		after, err := scrapeFleet(ctx, t.r.engines)
		if err != nil {
			return RunResult{}, err
		}
		rr := t.m.result(reports[i])
		rr.engineFigures(before[t.r.router.ID], after)
		rr.CPUSeconds = (t.r.cpu() - cpuBefore[t.r.router.ID]).Seconds()
		if err := t.m.writeTTFTs(filepath.Join(dir, t.r.router.ID+"-ttft.txt")); err != nil {
			return RunResult{}, err
		}
		rr.ttfts = t.m.ttftsMs()
		out.Routers[t.r.router.ID] = rr
	}
	return out, nil
}

// withRegions gives every new request a source region, drawn by the shares
// from a stream seeded by seed (follow-up turns keep their session's).
func withRegions(src workload.Source, shares []workload.Share, seed uint64) workload.Source {
	return &regional{Source: src, shares: shares, rng: rand.New(rand.NewPCG(seed, 0x726567))}
}

type regional struct {
	workload.Source
	shares []workload.Share
	rng    *rand.Rand // only Next uses it (one goroutine)
}

func (r *regional) Next(at time.Duration) (workload.Request, bool) {
	req, ok := r.Source.Next(at)
	if ok {
		var total float64
		for _, s := range r.shares {
			total += s.Weight
		}
		u := r.rng.Float64() * total
		for _, s := range r.shares {
			if u < s.Weight {
				req.Region = s.Name
				break
			}
			u -= s.Weight
		}
		if req.Region == "" {
			req.Region = r.shares[len(r.shares)-1].Name
		}
	}
	return req, ok
}

// FollowUp passes follow-ups through when the source has them.
func (r *regional) FollowUp(prev workload.Request, answer string) (workload.Request, bool) {
	if f, ok := r.Source.(workload.FollowUper); ok {
		return f.FollowUp(prev, answer)
	}
	return workload.Request{}, false
}
