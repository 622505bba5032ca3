package controlplane

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/tools/enginesim"
)

var dashboardScreenshot = flag.String("dashboard-screenshot", "", "write a PNG of the dashboard, as the Chromium test sees it, to this file")

// adminRig is a control plane on ephemeral ports over four simulated
// engines, with its admin server's base URL.
type adminRig struct {
	runner  *Runner
	admin   string
	spec    *fleet.Spec
	engines map[string]*enginesim.Server
}

// startAdminRig starts the engines and the control plane; with demand, two
// frontends report demand (fe-east 40 req/s, fe-west 20 req/s) so that the
// weights are the optimizer's, not the idle fallback's. Every request of
// that demand is reported, none is sent: the engines stay idle.
func startAdminRig(t *testing.T, demand bool) *adminRig {
	t.Helper()
	engines, addrs := startEngines(t)
	spec, err := fleet.Parse([]byte(testFleetYAML(addrs)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultRunConfig()
	cfg.Fleet, cfg.XDSListen, cfg.AdminListen = spec, "127.0.0.1:0", "127.0.0.1:0"
	cfg.Interval, cfg.ScrapeInterval, cfg.ScrapeTimeout = 300*time.Millisecond, 100*time.Millisecond, time.Second
	cfg.DemandWindow, cfg.Warmup, cfg.Smoothing = time.Second, 200*time.Millisecond, 300*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if err := <-done; err != nil {
			t.Errorf("runner: %v", err)
		}
	})
	xds, admin, err := r.Addrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if demand {
		reportDemand(ctx, t, xds, &wg)
	}
	rig := &adminRig{runner: r, admin: "http://" + admin, spec: spec, engines: engines}
	// Ready: a few cycles (the first ones solve cold).
	if err := envoytest.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		r.mu.Lock()
		n := r.cycles
		r.mu.Unlock()
		if n < 3 {
			return fmt.Errorf("%d cycles so far", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rig
}

// get fetches an admin path and decodes its JSON into v (nil: checks that
// it is JSON).
func (a *adminRig) get(t *testing.T, path string, v any) {
	t.Helper()
	resp, err := http.Get(a.admin + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", path, resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("GET %s: content type %q", path, ct)
	}
	if v == nil {
		var any any
		v = &any
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, b)
	}
}

// Engines that have served no request have no TTFT (NaN inside), a
// crashed one no signals at all: every JSON endpoint still answers 200 with
// a document, the unknown values as null, and /history keeps one point per
// cycle.
func TestAdminJSONWithIdleEngines(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t)) // after the rig's cleanups
	rig := startAdminRig(t, false)
	all := []string{"/weights", "/explain", "/explain?node=fe-east&class=chat", "/xds", "/history", "/signals"}
	for _, path := range all {
		rig.get(t, path, nil)
	}
	var sig struct {
		Engines []map[string]any `json:"engines"`
	}
	rig.get(t, "/signals", &sig)
	if len(sig.Engines) != 4 {
		t.Fatalf("/signals: %d engines, want 4", len(sig.Engines))
	}
	for _, e := range sig.Engines {
		if v, ok := e["ttft_ms"]; !ok || v != nil {
			t.Errorf("/signals: engine %v: ttft_ms = %v (present %v), want null before its first request", e["id"], v, ok)
		}
		if e["state"] != "up" {
			t.Errorf("/signals: engine %v is %v, want up", e["id"], e["state"])
		}
	}
	// /explain states the profile correction every engine was planned
	// with: 1 (as configured) while no first token is observed.
	var ex struct {
		Corrections map[string]struct {
			Factor float64 `json:"factor"`
		} `json:"profile_corrections"`
	}
	rig.get(t, "/explain", &ex)
	if len(ex.Corrections) != 4 {
		t.Errorf("/explain: profile corrections of %d engines, want 4: %+v", len(ex.Corrections), ex.Corrections)
	}
	for id, c := range ex.Corrections {
		if c.Factor != 1 {
			t.Errorf("/explain: %s planned with a profile correction of %g before any evidence, want 1", id, c.Factor)
		}
	}
	var h historyJSON
	rig.get(t, "/history", &h)
	if len(h.At) < 3 || h.Capacity != DefaultRunConfig().History || len(h.Engines) != 4 || len(h.Frontends) != 2 || len(h.Priorities) != 2 {
		t.Fatalf("/history: %d points (capacity %d), %d engines, %d frontends, %d priorities; want ≥ 3 points of 4, 2, 2",
			len(h.At), h.Capacity, len(h.Engines), len(h.Frontends), len(h.Priorities))
	}
	for _, e := range h.Engines {
		if len(e.TTFTMs) != len(h.At) || len(e.Utilization) != len(h.At) {
			t.Errorf("/history: engine %s has %d TTFT and %d load points for %d times", e.ID, len(e.TTFTMs), len(e.Utilization), len(h.At))
		}
	}
	// ?since returns the points after a time only.
	var later historyJSON
	rig.get(t, "/history?since="+strconv.FormatFloat(h.At[len(h.At)-2], 'f', -1, 64), &later)
	if len(later.At) == 0 || later.At[0] != h.At[len(h.At)-1] || len(later.Engines[0].TTFTMs) != len(later.At) {
		t.Errorf("/history?since=(the last but one point): at %v, want it to start at the last point %v", later.At, h.At[len(h.At)-1])
	}
	// A crashed engine: down in /signals, every endpoint still a document.
	if err := rig.engines["e-west-1"].SetFaults(enginesim.Faults{Crash: true}); err != nil {
		t.Fatal(err)
	}
	if err := envoytest.Poll(context.Background(), 20*time.Second, 100*time.Millisecond, func() error {
		var sig struct {
			Engines []struct{ ID, State string }  `json:"engines"`
			View    []struct{ ID, Health string } `json:"cycle_view"`
		}
		rig.get(t, "/signals", &sig)
		state, health := "", ""
		for _, e := range sig.Engines {
			if e.ID == "e-west-1" {
				state = e.State
			}
		}
		for _, v := range sig.View {
			if v.ID == "e-west-1" {
				health = v.Health
			}
		}
		if state != "down" || health != "unhealthy" {
			return fmt.Errorf("e-west-1 is %q, %q in the last cycle", state, health)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, path := range all {
		rig.get(t, path, nil)
	}
	for _, bad := range []string{"yesterday", "-1", "NaN", "Inf", "1e300"} {
		resp, err := http.Get(rig.admin + "/history?since=" + bad)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), fmt.Sprintf("since=%q", bad)) {
			t.Errorf("/history?since=%s: %s %q, want 400 naming the parameter", bad, resp.Status, b)
		}
	}
}

// The history is a bounded ring: the newest points, oldest first.
func TestHistoryKeepsTheLastCycles(t *testing.T) {
	h := newHistory(testFleet(t), 3)
	t0 := time.Unix(1000, 0)
	for k := 0; k < 5; k++ {
		h.record(t0.Add(time.Duration(k)*time.Second), nil, nil, nil)
	}
	got := h.json(time.Time{}).At
	if fmt.Sprint(got) != "[1002 1003 1004]" {
		t.Errorf("at = %v, want the last three cycles [1002 1003 1004]", got)
	}
	if got := h.json(t0.Add(3 * time.Second)).At; fmt.Sprint(got) != "[1004]" {
		t.Errorf("since 1003: at = %v, want [1004]", got)
	}
	if n := len(newHistory(testFleet(t), 0).json(time.Time{}).At); n != 0 {
		t.Errorf("a history of 0 cycles holds %d", n)
	}
}

// chromium finds the browser the dashboard test drives: $INFERLB_CHROMIUM,
// else Debian's chromium on PATH (scripts/setup.sh installs it).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("INFERLB_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH: scripts/setup.sh (make setup) installs Debian's chromium package; or set INFERLB_CHROMIUM to a Chromium or Chrome binary")
	return ""
}

// cell is one heatmap cell as the page shows it.
type cell struct {
	Node, Class, Engine string
	Weight              string // the share the page was given, as JavaScript prints it
	Text                string // what the cell shows
}

// The dashboard in a real headless Chromium against a real control plane:
// the heatmap shows the weights /weights publishes (every cell, per class),
// the engine table and the three charts are drawn, a click on a cell opens
// the explanation of that weight with the price /explain gives, and the
// page throws no error.
func TestDashboardInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	t.Cleanup(leaktest.AfterTest(t)) // after the rig's cleanups
	browser := chromium(t)
	rig := startAdminRig(t, true)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(browser), chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 1300))
	defer cancelAlloc()
	tab, cancelTab := chromedp.NewContext(allocCtx)
	defer cancelTab()
	if err := chromedp.Do(tab); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", browser, err)
	}
	// Every console error and uncaught exception of the page fails the test.
	var cmu sync.Mutex
	var consoleErrs []string
	var cwg sync.WaitGroup
	cwg.Add(1)
	msgs := chromedp.Console(tab)
	go func() {
		defer cwg.Done()
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError {
				cmu.Lock()
				consoleErrs = append(consoleErrs, fmt.Sprintf("%s:%d: %s", m.URL, m.Line+1, m.Text))
				cmu.Unlock()
			}
		}
	}()
	defer cwg.Wait()
	defer cancelTab()

	if err := chromedp.Do(tab, chromedp.Navigate(rig.admin+"/dashboard/"),
		chromedp.WaitVisible(chromedp.CSS("table.heatmap td.cell"))); err != nil {
		t.Fatalf("the dashboard shows no heatmap: %v", err)
	}

	// 1. The heatmap is /weights: the same cells with the same shares, for
	// the same cycle (weights move between two reads, so poll until the
	// page and /weights agree on the cycle).
	type weightsDoc struct {
		At    string `json:"at"`
		Nodes map[string]struct {
			Classes map[string]struct {
				Weights map[string]float64 `json:"weights"`
			} `json:"classes"`
		} `json:"nodes"`
	}
	var page struct {
		At    string `json:"at"`
		Cells []cell `json:"cells"`
	}
	// Every /weights document seen while polling, by cycle: the page
	// refreshes on its own timer, so on a loaded machine it can trail the
	// newest cycle by one at every read; it must show one that /weights
	// served, with that cycle's shares.
	seen := map[string]weightsDoc{}
	fetch := func() string {
		var d weightsDoc
		rig.get(t, "/weights", &d)
		seen[d.At] = d
		return d.At
	}
	var pub weightsDoc
	if err := envoytest.Poll(ctx, 30*time.Second, 200*time.Millisecond, func() error {
		before := fetch()
		page.At, page.Cells = "", nil
		raw, err := chromedp.Run(tab, chromedp.Evaluate[[]byte](`({
			at: document.querySelector("#heatmaps").dataset.at,
			cells: [...document.querySelectorAll("table.heatmap td.cell")].map(td => ({
				Node: td.dataset.node, Class: td.dataset.class, Engine: td.dataset.engine,
				Weight: td.dataset.weight, Text: td.textContent})),
		})`))
		if err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return err
		}
		after := fetch()
		d, ok := seen[page.At]
		if !ok {
			return fmt.Errorf("the page shows the cycle at %s, /weights served %s and then %s", page.At, before, after)
		}
		pub = d
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := map[[3]string]float64{}
	for n, nd := range pub.Nodes {
		for c, cd := range nd.Classes {
			for e, w := range cd.Weights {
				want[[3]string{n, c, e}] = w
			}
		}
	}
	if len(page.Cells) != len(want) || len(want) != 8 {
		t.Errorf("the heatmap has %d cells, /weights %d weights (want 2 frontends × 4 engines)", len(page.Cells), len(want))
	}
	best := page.Cells[0]
	bestW := -1.0
	for _, c := range page.Cells {
		w, ok := want[[3]string{c.Node, c.Class, c.Engine}]
		got, err := strconv.ParseFloat(c.Weight, 64)
		if !ok || err != nil || got != w {
			t.Errorf("cell %s/%s/%s: share %q, /weights %v (listed %v)", c.Node, c.Class, c.Engine, c.Weight, w, ok)
			continue
		}
		if w == 0 {
			if c.Text != "·" {
				t.Errorf("cell %s/%s/%s: shows %q for a zero share, want ·", c.Node, c.Class, c.Engine, c.Text)
			}
		} else if pct, err := strconv.ParseFloat(strings.TrimSuffix(c.Text, "%"), 64); err != nil || math.Abs(pct-100*w) > 0.05+1e-9 {
			t.Errorf("cell %s/%s/%s: shows %q for share %v", c.Node, c.Class, c.Engine, c.Text, w)
		}
		if c.Node == "fe-east" && w > bestW {
			best, bestW = c, w
		}
	}
	sort.Slice(page.Cells, func(i, j int) bool { return fmt.Sprint(page.Cells[i]) < fmt.Sprint(page.Cells[j]) })
	t.Logf("heatmap (cycle %s): %v", page.At, page.Cells)
	if bestW <= 0 {
		t.Fatalf("fe-east has no engine with weight: %v", page.Cells)
	}

	// 1b. Beside the planned shed, what ext_proc shed (its guardrail too).
	checkObservedShed(ctx, t, tab, rig)

	// 2. The engine table has every engine; the charts are drawn.
	counts, err := chromedp.Run(tab, chromedp.Evaluate[[]int](`[
		document.querySelectorAll("#engines tbody tr").length,
		document.querySelectorAll(".chart .uplot canvas").length]`))
	if err != nil {
		t.Fatal(err)
	}
	if counts[0] != 4 || counts[1] != 3 {
		t.Errorf("%d engine rows (want 4), %d charts (want 3)", counts[0], counts[1])
	}

	// 3. A click on the heaviest cell of fe-east opens its explanation: the
	// optimizer's terms and the flow's price, as /explain gives them.
	sel := fmt.Sprintf(`td.cell[data-node=%q][data-class=%q][data-engine=%q]`, best.Node, best.Class, best.Engine)
	if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS(sel)),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#explain[data-engine=%q] table.terms tr.price`, best.Engine)))); err != nil {
		t.Fatalf("clicking %s: no explanation: %v", sel, err)
	}
	var ex struct {
		At, Title, Text, Price string
	}
	var pubEx struct {
		At    string `json:"at"`
		Nodes map[string]map[string]struct {
			Flow struct {
				PriceMs float64 `json:"price_ms"`
			} `json:"flow"`
		} `json:"nodes"`
	}
	if err := envoytest.Poll(ctx, 30*time.Second, 200*time.Millisecond, func() error {
		raw, err := chromedp.Run(tab, chromedp.Evaluate[[]byte](`({
			At: document.querySelector("#explain").dataset.at,
			Title: document.querySelector("#explain-title").textContent,
			Text: document.querySelector("#explain-body").textContent,
			Price: document.querySelector("#explain tr.price").dataset.price})`))
		if err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &ex); err != nil {
			return err
		}
		pubEx.Nodes = nil
		rig.get(t, "/explain?node="+best.Node+"&class="+best.Class, &pubEx)
		if ex.At != pubEx.At {
			return fmt.Errorf("the explanation is of the cycle at %s, /explain's of %s", ex.At, pubEx.At)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("explanation: %s: %s", ex.Title, ex.Text)
	price, err := strconv.ParseFloat(ex.Price, 64)
	if want := pubEx.Nodes[best.Node][best.Class].Flow.PriceMs; err != nil || price != want || !(want > 0) {
		t.Errorf("the explanation's price is %q, /explain's %v", ex.Price, want)
	}
	for _, w := range []string{best.Engine, best.Node, "round trip", "latency", "capacity price", "= marginal cost", "flow price"} {
		if !strings.Contains(ex.Title+ex.Text, w) {
			t.Errorf("the explanation lacks %q: %s %s", w, ex.Title, ex.Text)
		}
	}

	// 4. The explanation is in the address: loading it opens the same one.
	url, err := chromedp.Run(tab, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(url, "#explain/"+best.Node+"/"+best.Class+"/"+best.Engine) {
		t.Errorf("after the click the address is %s, want it to name the explained weight", url)
	}
	if err := chromedp.Do(tab, chromedp.Navigate("about:blank"), chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#explain[data-engine=%q] table.terms tr.price`, best.Engine)))); err != nil {
		t.Fatalf("loading %s: no explanation: %v", url, err)
	}

	if *dashboardScreenshot != "" {
		png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*dashboardScreenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cancelTab()
	cwg.Wait()
	cmu.Lock()
	defer cmu.Unlock()
	for _, e := range consoleErrs {
		t.Errorf("the page logged an error: %s", e)
	}
}
