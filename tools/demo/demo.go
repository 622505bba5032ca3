// Package demo runs the whole balancer on one machine: simulated engines in
// several regions, the control plane, one ext_proc service and one Envoy per
// frontend, multi-turn traffic with a regional surge, and the live view.
//
// Every component runs as its own process (this binary's subcommands, and
// Envoy from the project's virtual environment), exactly as an operator would
// run them, so the demo exercises the real command lines, ports and gRPC
// streams. Logs go to one file per process in the output directory.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/internal/childproc"
	"github.com/inferlb/inferlb/internal/envoybin"
	"github.com/inferlb/inferlb/tools/liveview"
	"github.com/inferlb/inferlb/tools/llamacpp"
	"github.com/inferlb/inferlb/tools/loadgen"
)

// Options configure a demo run. Zero values are not defaults: the command
// sets every field from its flags.
type Options struct {
	FleetPath string
	OutDir    string
	// Self is this binary (os.Executable).
	Self string
	// Duration bounds the traffic (0: until interrupted).
	Duration time.Duration
	// TimeScale is the engine simulator's time scale (1 = real time).
	TimeScale float64
	// Rate is new conversations per second (Poisson).
	Rate float64
	// SurgeAfter is when one region's share of new conversations jumps;
	// SurgeRegion is that region (0 or "": no surge).
	SurgeAfter  time.Duration
	SurgeRegion string
	// OverloadAfter starts a phase of OverloadFor in which the rate of new
	// conversations is OverloadFactor × Rate (0: no such phase). Whether
	// that is beyond what the fleet serves depends on the engines and the
	// time scale: the plan sheds only what it finds the fleet short of.
	OverloadAfter, OverloadFor time.Duration
	OverloadFactor             float64
	// FailEngine crashes at FailAfter and comes back FailFor later (""
	// or 0: no failure).
	FailEngine         string
	FailAfter, FailFor time.Duration
	// ControlInterval is the control plane's cycle period.
	ControlInterval time.Duration
	// ViewInterval is the live view's redraw period; View is where it draws
	// (nil: no live view).
	ViewInterval time.Duration
	View         io.Writer
	// Plain appends screens instead of redrawing them.
	Plain bool
	// BasePort: the demo uses BasePort.. for its listeners (see ports).
	BasePort int
	Logger   *slog.Logger
	// Engines is what serves the fleet's engines: EnginesSim ("" too) or
	// EnginesLlamaCpp (real llama-servers, in real time: TimeScale 1).
	Engines string
}

// ports lays out the demo's listeners from a base port.
type ports struct {
	xds, cpAdmin int
	simAdmin     int   // the engine simulator's faults admin API
	envoy        []int // per frontend, client-facing
	envoyAdmin   []int
	extproc      []int
	extprocHTTP  []int
}

func layout(base, frontends int) ports {
	p := ports{xds: base, cpAdmin: base + 1, simAdmin: base + 2}
	for k := 0; k < frontends; k++ {
		p.envoy = append(p.envoy, base+10+k)
		p.envoyAdmin = append(p.envoyAdmin, base+20+k)
		p.extproc = append(p.extproc, base+30+k)
		p.extprocHTTP = append(p.extprocHTTP, base+40+k)
	}
	return p
}

func (p ports) all() []int {
	out := []int{p.xds, p.cpAdmin, p.simAdmin}
	out = append(out, p.envoy...)
	out = append(out, p.envoyAdmin...)
	out = append(out, p.extproc...)
	return append(out, p.extprocHTTP...)
}

// Result is what a finished demo reports.
type Result struct {
	// LoadgenReport is the path of the load generator's JSON report;
	// Report is that report (nil if the load generator wrote none).
	LoadgenReport string
	Report        *loadgen.Report
	OutDir        string
	// ControlPlaneAdmin is the control plane's admin base URL.
	ControlPlaneAdmin string
}

// Run starts everything, waits for readiness, sends traffic, draws the live
// view, and stops everything when ctx ends or the traffic is done.
func Run(ctx context.Context, o Options) (*Result, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	spec, err := fleet.Load(o.FleetPath)
	if err != nil {
		return nil, err
	}
	if len(spec.Frontends) == 0 {
		return nil, errors.New("demo: the fleet has no frontends")
	}
	failAddr, err := checkOptions(o, spec)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, err
	}
	envoy, err := envoybin.Binary()
	if err != nil {
		return nil, err
	}
	pt := layout(o.BasePort, len(spec.Frontends))
	if err := checkPorts(spec, pt); err != nil {
		return nil, err
	}

	procs := &childproc.Group{Dir: o.OutDir, Log: log}
	defer procs.StopAll()

	// 1. Engines, 2. the control plane.
	cpAdmin := fmt.Sprintf("http://127.0.0.1:%d", pt.cpAdmin)
	var llamas *llamaEngines
	if o.Engines == EnginesLlamaCpp {
		if llamas, err = startLlamaEngines(procs, log, spec); err != nil {
			return nil, err
		}
	}
	if err := startBackends(procs, o, pt); err != nil {
		return nil, err
	}
	// 3. Per frontend: ext_proc and Envoy.
	admins := map[string]string{}
	var regionURLs []string
	for k, f := range spec.Frontends {
		if _, err := procs.Start("extproc-"+f.Name, o.Self, "extproc",
			"--listen", fmt.Sprintf("127.0.0.1:%d", pt.extproc[k]),
			"--http-listen", fmt.Sprintf("127.0.0.1:%d", pt.extprocHTTP[k]),
			"--control-plane", fmt.Sprintf("127.0.0.1:%d", pt.xds),
			"--node-id", f.NodeID, "--region", f.Region, "--instance", "demo-"+f.Name, "--insecure"); err != nil {
			return nil, err
		}
		boot, err := FrontendBootstrap(f.NodeID, f.Region, pt.envoy[k], pt.extproc[k], pt.xds, pt.envoyAdmin[k],
			filepath.Join(o.OutDir, "envoy-admin-"+f.Name+".sock"))
		if err != nil {
			return nil, err
		}
		cfg := filepath.Join(o.OutDir, "envoy-"+f.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(boot), 0o644); err != nil {
			return nil, err
		}
		if _, err := procs.Start("envoy-"+f.Name, envoy, "-c", cfg, "--concurrency", "1",
			"--disable-hot-restart", "--use-dynamic-base-id", "--log-level", "warning",
			"--drain-time-s", "1"); err != nil {
			return nil, err
		}
		admins[f.Name] = fmt.Sprintf("http://127.0.0.1:%d", pt.envoyAdmin[k])
		regionURLs = append(regionURLs, fmt.Sprintf("%s=http://127.0.0.1:%d", f.Region, pt.envoy[k]))
	}

	// 4. Wait until every part is ready.
	checks := readyChecks(spec, pt, cpAdmin, admins)
	if err := waitReady(ctx, procs, checks, 60*time.Second); err != nil {
		return nil, err
	}
	log.Info("demo: every component is ready", "out", o.OutDir)

	// 5. Traffic: multi-turn conversations from every frontend region, then
	// a surge in one region.
	report, requests := filepath.Join(o.OutDir, "loadgen-report.json"), filepath.Join(o.OutDir, "requests.jsonl")
	lg, err := procs.Start("loadgen", o.Self, loadgenArgs(o, spec, pt, regionURLs, report, requests)...)
	if err != nil {
		return nil, err
	}
	// The load generator ends when its traffic is done.
	lg.EndsByItself()
	start := time.Now()

	// 6. The live view until the traffic ends or ctx is cancelled.
	viewCtx, stopView := context.WithCancel(ctx)
	defer stopView()
	var wg sync.WaitGroup
	if failAddr != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if llamas != nil {
				llamas.crash(viewCtx, o.FailEngine, start.Add(o.FailAfter), o.FailFor)
				return
			}
			failEngine(viewCtx, log, o, fmt.Sprintf("127.0.0.1:%d", pt.simAdmin), start)
		}()
	}
	if o.View != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runView(viewCtx, o, spec, admins, filepath.Join(o.OutDir, "loadgen.log"), requests, start, cpAdmin)
		}()
	}
	var lgErr error
	select {
	case <-lg.Done():
		lgErr = lg.Err()
	case <-ctx.Done():
		procs.Stop(lg)
	}
	stopView()
	wg.Wait()
	if err := procs.Exited(); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	if lgErr != nil && ctx.Err() == nil {
		return nil, fmt.Errorf("demo: load generator: %w (see %s)", lgErr, filepath.Join(o.OutDir, "loadgen.log"))
	}
	return readResult(report, o.OutDir, cpAdmin)
}

// startBackends starts the engines (one process serves all of them) and
// the control plane.
func startBackends(procs *childproc.Group, o Options, pt ports) error {
	// 1. Engines (one process serves all of them), unless llama-servers
	// do.
	if o.Engines != EnginesLlamaCpp {
		if _, err := procs.Start("engines", o.Self, "engine-sim", "--fleet", o.FleetPath,
			"--time-scale", fmt.Sprint(o.TimeScale), "--admin-listen", fmt.Sprintf("127.0.0.1:%d", pt.simAdmin)); err != nil {
			return err
		}
	}
	// 2. Control plane.
	if _, err := procs.Start("control-plane", o.Self, "control-plane", "--fleet", o.FleetPath,
		"--xds-listen", fmt.Sprintf("127.0.0.1:%d", pt.xds),
		"--admin-listen", fmt.Sprintf("127.0.0.1:%d", pt.cpAdmin),
		"--interval", o.ControlInterval.String(), "--insecure", "--time-scale", fmt.Sprint(o.TimeScale),
		"--state-file", filepath.Join(o.OutDir, "control-plane-state.json")); err != nil {
		return err
	}
	return nil
}

// readResult is the demo's result: where its outputs are, and the load
// generator's report if it wrote one.
func readResult(report, outDir, cpAdmin string) (*Result, error) {
	res := &Result{LoadgenReport: report, OutDir: outDir, ControlPlaneAdmin: cpAdmin}
	if b, err := os.ReadFile(report); err == nil {
		var rep loadgen.Report
		if err := json.Unmarshal(b, &rep); err != nil {
			return nil, fmt.Errorf("demo: load generator report %s: %w", report, err)
		}
		res.Report = &rep
	}
	return res, nil
}

// checkOptions refuses failure and surge options the fleet cannot carry out
// (they would silently not happen); it returns the address of the engine to
// fail ("" for none).
func checkOptions(o Options, spec *fleet.Spec) (failAddr string, err error) {
	switch o.Engines {
	case "", EnginesSim:
	case EnginesLlamaCpp:
		// A real engine runs in real time.
		if o.TimeScale != 1 {
			return "", fmt.Errorf("demo: --engines llamacpp runs real engines in real time: --time-scale must be 1, got %g", o.TimeScale)
		}
		if err := llamacpp.Available(); err != nil {
			return "", fmt.Errorf("demo: --engines llamacpp: %w", err)
		}
	default:
		return "", fmt.Errorf("demo: --engines %q: want %s or %s", o.Engines, EnginesSim, EnginesLlamaCpp)
	}
	if o.SurgeRegion != "" && o.SurgeAfter > 0 {
		// A region no frontend is in would make the surge silently not
		// happen.
		var regions []string
		for _, f := range spec.Frontends {
			if f.Region == o.SurgeRegion {
				regions = nil
				break
			}
			regions = append(regions, f.Region)
		}
		if regions != nil {
			return "", fmt.Errorf("demo: surge region %q has no frontend (frontends are in %s)", o.SurgeRegion, strings.Join(regions, ", "))
		}
	}
	if o.FailEngine != "" && o.FailAfter > 0 {
		for _, e := range spec.Engines {
			if e.ID == o.FailEngine {
				failAddr = e.Address
			}
		}
		if failAddr == "" {
			return "", fmt.Errorf("demo: the engine to fail, %q, is not in the fleet", o.FailEngine)
		}
	}
	if o.OverloadAfter > 0 && !(o.OverloadFactor > 0 && o.OverloadFor > 0) {
		return "", fmt.Errorf("demo: an overload phase needs a factor > 0 and a length > 0, got %v and %v", o.OverloadFactor, o.OverloadFor)
	}
	return failAddr, nil
}

// checkPorts refuses a layout whose demo ports collide with an engine's
// address or are taken.
func checkPorts(spec *fleet.Spec, pt ports) error {
	busy := append([]string{}, engineAddrs(spec)...)
	for _, p := range pt.all() {
		busy = append(busy, fmt.Sprintf("127.0.0.1:%d", p))
	}
	seen := map[string]bool{}
	for _, a := range busy {
		if seen[a] {
			return fmt.Errorf("demo: %s is both an engine address and a demo port; choose another base port", a)
		}
		seen[a] = true
	}
	for _, a := range busy {
		if l, err := net.Listen("tcp", a); err != nil {
			return fmt.Errorf("demo: %s is in use (another demo running?): %w", a, err)
		} else {
			l.Close()
		}
	}
	return nil
}

// readyChecks are the health URLs of every part of the demo.
func readyChecks(spec *fleet.Spec, pt ports, cpAdmin string, admins map[string]string) []readyCheck {
	var checks []readyCheck
	for _, e := range spec.Engines {
		checks = append(checks, readyCheck{"engine " + e.ID, "http://" + e.Address + "/health"})
	}
	checks = append(checks, readyCheck{"control plane", cpAdmin + "/healthz"})
	for k, f := range spec.Frontends {
		checks = append(checks,
			readyCheck{"ext_proc " + f.Name, fmt.Sprintf("http://127.0.0.1:%d/healthz", pt.extprocHTTP[k])},
			readyCheck{"envoy " + f.Name, admins[f.Name] + "/ready"})
	}
	return checks
}

// loadgenArgs is the load generator's command line: conversations from
// every frontend region at o.Rate, then the surge and the overload phases;
// report and requests are its JSON report and request log.
func loadgenArgs(o Options, spec *fleet.Spec, pt ports, regionURLs []string, report, requests string) []string {
	model := spec.Models[0].Name
	args := []string{"loadgen", "--workload", "multiturn", "--model", model,
		"--url", fmt.Sprintf("http://127.0.0.1:%d", pt.envoy[0]),
		"--arrival", "poisson", "--rate", fmt.Sprint(o.Rate),
		"--turns", "2-6", "--think-time", "2s", "--output-tokens", "50-150",
		"--user-tokens", "50-150", "--system-prompt-tokens", "400",
		"--priority-mix", priorityMix(spec),
		"--slo-ttft", "2s", "--slo-tpot", "100ms", "--json-out", report, "--requests-out", requests,
		// The load generator runs in the engines' (simulated) time, so its
		// rates, think times and latencies are on the engines' time base.
		"--time-scale", fmt.Sprint(o.TimeScale)}
	if o.Duration > 0 {
		args = append(args, "--duration", o.Duration.String())
	} else {
		// No bound: traffic until Ctrl-C, then the report.
		args = append(args, "--until-interrupted")
	}
	for _, u := range regionURLs {
		args = append(args, "--region-url", u)
	}
	var regions []string
	for _, f := range spec.Frontends {
		regions = append(regions, f.Region+"=1")
	}
	args = append(args, "--region-shares", strings.Join(regions, ","))
	if o.SurgeRegion != "" && o.SurgeAfter > 0 {
		var surge []string
		for _, f := range spec.Frontends {
			w := "1"
			if f.Region == o.SurgeRegion {
				w = "4"
			}
			surge = append(surge, f.Region+"="+w)
		}
		args = append(args, "--region-shares", o.SurgeAfter.String()+":"+strings.Join(surge, ","))
	}
	if o.OverloadAfter > 0 {
		args = append(args, "--rate-at", fmt.Sprintf("%v:%g", o.OverloadAfter, o.Rate*o.OverloadFactor),
			"--rate-at", fmt.Sprintf("%v:%g", o.OverloadAfter+o.OverloadFor, o.Rate))
	}
	return args
}

func engineAddrs(spec *fleet.Spec) []string {
	var a []string
	for _, e := range spec.Engines {
		a = append(a, e.Address)
	}
	return a
}

// priorityMix gives lower priorities more sessions: most traffic is the
// least important, as in production.
func priorityMix(spec *fleet.Spec) string {
	var parts []string
	for _, p := range spec.Priorities {
		parts = append(parts, fmt.Sprintf("%s=%d", p.Name, p.Level+1))
	}
	return strings.Join(parts, ",")
}

// wall converts a duration in the engines' time to real time.
func (o Options) wall(d time.Duration) time.Duration { return time.Duration(float64(d) * o.TimeScale) }

// failEngine crashes the engine at o.FailAfter (engines' time) through the
// simulator's admin API (its own listener), to come back o.FailFor later.
func failEngine(ctx context.Context, log *slog.Logger, o Options, admin string, start time.Time) {
	t := time.NewTimer(time.Until(start.Add(o.wall(o.FailAfter))))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	body := fmt.Sprintf(`{"crash": true, "restart_after_s": %g}`, o.FailFor.Seconds())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+admin+"/admin/engines/"+o.FailEngine+"/faults", strings.NewReader(body))
	if err != nil {
		log.Error("demo: engine failure", "err", err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Error("demo: engine failure", "engine", o.FailEngine, "err", err)
		return
	}
	resp.Body.Close()
	log.Info("demo: engine crashed on purpose", "engine", o.FailEngine, "status", resp.Status, "back_after", o.FailFor)
}

// timeline is the run's marks, in the engines' time.
func (o Options) timeline() []liveview.Mark {
	var m []liveview.Mark
	if o.SurgeRegion != "" && o.SurgeAfter > 0 {
		m = append(m, liveview.Mark{At: o.SurgeAfter, Text: "surge: " + o.SurgeRegion + "'s share ×4"})
	}
	if o.OverloadAfter > 0 {
		m = append(m, liveview.Mark{At: o.OverloadAfter, Text: fmt.Sprintf("overload: rate ×%g", o.OverloadFactor)},
			liveview.Mark{At: o.OverloadAfter + o.OverloadFor, Text: "rate back"})
	}
	if o.FailEngine != "" && o.FailAfter > 0 {
		m = append(m, liveview.Mark{At: o.FailAfter, Text: o.FailEngine + " crashes"},
			liveview.Mark{At: o.FailAfter + o.FailFor, Text: "it restarts"})
	}
	sort.SliceStable(m, func(i, j int) bool { return m[i].At < m[j].At })
	return m
}

// phase says what is going on at elapsed (engines' time).
func (o Options) phase(elapsed time.Duration) string {
	var now []string
	in := func(from, length time.Duration) bool {
		return from > 0 && elapsed >= from && (length == 0 || elapsed < from+length)
	}
	if o.SurgeRegion != "" && in(o.SurgeAfter, 0) {
		now = append(now, fmt.Sprintf("surge in %s (4× its share of new conversations): watch its overflow go to the nearest region", o.SurgeRegion))
	}
	if in(o.OverloadAfter, o.OverloadFor) {
		now = append(now, fmt.Sprintf("heavy load: %g× the rate: queues and TTFT rise; ext_proc sheds the lowest priorities (429) only where the plan finds the fleet short", o.OverloadFactor))
	}
	if o.FailEngine != "" && in(o.FailAfter, o.FailFor) {
		now = append(now, o.FailEngine+" is down: Envoy retries elsewhere, the control plane moves its weight")
	}
	if len(now) == 0 {
		return "steady traffic: multi-turn conversations from every region, each kept on the engine that caches it"
	}
	return strings.Join(now, "; ")
}

func runView(ctx context.Context, o Options, spec *fleet.Spec, admins map[string]string, loadgenLog, requests string, start time.Time, cpAdmin string) {
	c := &liveview.Collector{Fleet: spec, EnvoyAdmin: admins}
	clients := &liveview.ClientLog{Path: requests}
	regionFrontend := map[string]string{}
	for _, f := range spec.Frontends {
		regionFrontend[f.Region] = f.Name
	}
	var prios []string
	for _, p := range spec.Priorities {
		prios = append(prios, p.Name)
	}
	var prev liveview.Sample
	t := time.NewTicker(o.ViewInterval)
	defer t.Stop()
	for {
		cur, err := c.Collect(ctx)
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if !o.Plain {
			buf.WriteString("\033[H\033[2J")
		}
		v := c.Build(prev, cur)
		v.Elapsed = time.Duration(float64(time.Since(start)) / o.TimeScale)
		v.TimeScale, v.Marks, v.Phase, v.Priorities = o.TimeScale, o.timeline(), o.phase(v.Elapsed), prios
		if recs, err := clients.Read(); err == nil {
			v.Clients = liveview.SummarizeClients(recs, regionFrontend)
		}
		liveview.Render(&buf, v)
		if line := lastLine(loadgenLog); line != "" {
			fmt.Fprintf(&buf, "loadgen (whole run): %s\n", line)
		}
		fmt.Fprintf(&buf, "dashboard: %s/dashboard/ · control plane: %s/weights  %s/explain · logs: %s   (Ctrl-C stops the demo)\n", cpAdmin, cpAdmin, cpAdmin, o.OutDir)
		o.View.Write(buf.Bytes())
		prev = cur
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lastLine returns the last non-empty line of a file (the load generator's
// progress line), or "".
func lastLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - 4096
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	lines := strings.FieldsFunc(string(buf), func(r rune) bool { return r == '\n' || r == '\r' })
	if len(lines) == 0 {
		return ""
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

type readyCheck struct{ what, url string }

// FrontendBootstrap is the demo's Envoy bootstrap for a frontend: the
// project's, fail-closed, with a read-only admin interface on
// 127.0.0.1:adminPort (the real admin on a unix socket at adminSocket that
// only this user can open): the dashboard reads Envoy's /clusters and
// /stats there, and nobody can POST /healthcheck/fail or /quitquitquit.
func FrontendBootstrap(nodeID, region string, listenPort, extprocPort, xdsPort, adminPort int, adminSocket string) (string, error) {
	return envoyconfigs.Render(envoyconfigs.Params{
		Variant: envoyconfigs.FailClosed, NodeID: nodeID, Region: region,
		ListenPort: listenPort, ExtProcPort: extprocPort, XDSPort: xdsPort,
		BodyLimit:     4 << 20,
		ReadOnlyAdmin: &envoyconfigs.ReadOnlyAdmin{Port: adminPort, Socket: adminSocket},
	})
}

func waitReady(ctx context.Context, procs *childproc.Group, checks []readyCheck, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(timeout)
	for _, c := range checks {
		for {
			if err := procs.Exited(); err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			resp, err := client.Get(c.url)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
				err = fmt.Errorf("%s", resp.Status)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("demo: %s not ready after %v (%s: %v); logs in %s", c.what, timeout, c.url, err, procs.Dir)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}
