package rivalbench

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/inferlb/inferlb/api/headers"
	"github.com/inferlb/inferlb/internal/childproc"
	"github.com/inferlb/inferlb/internal/envoybin"
	"github.com/inferlb/inferlb/tools/loadgen"
)

// rig is one run's processes: the engine simulator and every router.
type rig struct {
	routers []*routerRig
}

// routerRig is one router under test: its engines, the URL its clients
// send to in each region, and its processes (whose CPU is its cost).
type routerRig struct {
	router  Router
	engines []engine
	urls    map[string]string // region → the router's client-facing URL
	procs   []*childproc.Proc
	// ready are the SGLang routers' readiness checks: they answer ready
	// with one worker registered, so the bench waits for all.
	ready []readyCheck
}

type readyCheck struct {
	url     string
	workers int
}

// client is a load-generator client for this router: requests go to their
// region's router.
func (r *routerRig) client() *loadgen.Client {
	c := &loadgen.Client{HTTP: loadgen.NewHTTPClient(1024), MaxIdleConns: 1024, Model: ModelName,
		Headers: loadgen.DefaultHeaderNames(), IgnoreEOS: true, Timeout: 5 * time.Minute}
	for region, u := range r.urls {
		if c.BaseURL == "" || region == "local" {
			c.BaseURL = u
		}
	}
	if len(r.urls) > 1 {
		c.RegionURLs = r.urls
	}
	return c
}

// cpu is the CPU time the router's processes have used.
func (r *routerRig) cpu() time.Duration {
	var total time.Duration
	for _, p := range r.procs {
		if c, err := p.CPU(); err == nil {
			total += c
		}
	}
	return total
}

// startRig starts the engines, then every router, and waits until each
// serves a request.
func startRig(ctx context.Context, o Options, g *childproc.Group, dir string) (*rig, error) {
	regions := o.regionNames()
	per := len(regions) * o.EnginesPerRegion
	ports, err := freePorts(len(o.Routers) * per)
	if err != nil {
		return nil, err
	}
	rg := &rig{}
	var all []engine
	for i, r := range o.Routers {
		rr := &routerRig{router: r, urls: map[string]string{}}
		for k, region := range regions {
			for e := 0; e < o.EnginesPerRegion; e++ {
				rr.engines = append(rr.engines, engine{ID: fmt.Sprintf("r%d-%s-%d", i, region, e), Region: region,
					Port: ports[i*per+k*o.EnginesPerRegion+e]})
			}
		}
		all = append(all, rr.engines...)
		rg.routers = append(rg.routers, rr)
	}
	union := filepath.Join(dir, "fleet-engines.yaml")
	if err := os.WriteFile(union, []byte(fleetYAML("rivalbench-engines", regions, all)), 0o644); err != nil {
		return nil, err
	}
	if _, err := g.Start("engine-sim", o.Self, "engine-sim", "--fleet", union); err != nil {
		return nil, err
	}
	for _, e := range all {
		if err := waitOK(ctx, g, e.url()+"/health", 30*time.Second); err != nil {
			return nil, fmt.Errorf("engine %s: %w", e.ID, err)
		}
	}
	for _, rr := range rg.routers {
		var err error
		if rr.router.Binary == "inferlb" {
			err = startInferlb(ctx, o, g, dir, rr)
		} else {
			err = startRival(o, g, rr)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rr.router.ID, err)
		}
	}
	for _, rr := range rg.routers {
		for _, c := range rr.ready {
			if err := waitWorkers(ctx, g, c, 60*time.Second); err != nil {
				return nil, fmt.Errorf("%s: %w", rr.router.ID, err)
			}
		}
	}
	for _, rr := range rg.routers {
		for region, u := range rr.urls {
			if err := waitServes(ctx, g, u, region, 90*time.Second); err != nil {
				return nil, fmt.Errorf("%s in %s: %w", rr.router.ID, region, err)
			}
		}
	}
	return rg, nil
}

// startRival starts one router per region, each in front of its region's
// engines.
func startRival(o Options, g *childproc.Group, rr *routerRig) error {
	prog, err := rr.router.program(o.RivalDir)
	if err != nil {
		return err
	}
	for _, region := range o.regionNames() {
		var workers []string
		for _, e := range rr.engines {
			if e.Region == region {
				workers = append(workers, e.url())
			}
		}
		ports, err := freePorts(2)
		if err != nil {
			return err
		}
		cmd := exec.Command(prog, rr.router.args(ports[0], ports[1], workers)...)
		if rr.router.Binary == "sglang-router" {
			// sglang-router loads the tokenizer its workers name (the model,
			// llama-3.1-8b) when it registers them, from a directory of that
			// name if there is one, else from the Hugging Face hub, which
			// cannot be reached here. It routes HTTP requests by their text
			// and never uses it; a local one spares the failed download.
			if cmd.Dir, err = tokenizerDir(g.Dir); err != nil {
				return err
			}
		}
		p, err := g.StartCmd(rr.router.ID+"-"+region, cmd)
		if err != nil {
			return err
		}
		if rr.router.Binary == "smg" || rr.router.Binary == "sglang-router" {
			rr.ready = append(rr.ready, readyCheck{url: fmt.Sprintf("http://127.0.0.1:%d/readiness", ports[0]), workers: len(workers)})
		}
		rr.procs = append(rr.procs, p)
		rr.urls[region] = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	}
	return nil
}

// startInferlb starts inferlb as its users run it: the control plane at its
// defaults with the router's fleet, and per region an ext_proc service and
// an Envoy whose bootstrap `inferlb extproc --print-bootstrap` printed.
func startInferlb(ctx context.Context, o Options, g *childproc.Group, dir string, rr *routerRig) error {
	regions := o.regionNames()
	spec := filepath.Join(dir, "fleet-inferlb.yaml")
	if err := os.WriteFile(spec, []byte(fleetYAML("rivalbench-inferlb", regions, rr.engines)), 0o644); err != nil {
		return err
	}
	ports, err := freePorts(2 + 3*len(regions))
	if err != nil {
		return err
	}
	xds := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cp, err := g.Start("inferlb-control-plane", o.Self, "control-plane", "--fleet", spec,
		"--xds-listen", xds, "--admin-listen", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--insecure")
	if err != nil {
		return err
	}
	rr.procs = append(rr.procs, cp)
	for k, region := range regions {
		extprocPort, httpPort, envoyPort := ports[2+3*k], ports[3+3*k], ports[4+3*k]
		node := "frontend-" + region
		ep, err := g.Start("inferlb-extproc-"+region, o.Self, "extproc",
			"--listen", fmt.Sprintf("127.0.0.1:%d", extprocPort), "--http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort),
			"--control-plane", xds, "--node-id", node, "--region", region, "--insecure")
		if err != nil {
			return err
		}
		rr.procs = append(rr.procs, ep)
		var boot, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, o.Self, "extproc", "--print-bootstrap", "fail-closed",
			"--listen", fmt.Sprintf("127.0.0.1:%d", extprocPort), "--control-plane", xds,
			"--node-id", node, "--region", region, "--envoy-port", strconv.Itoa(envoyPort), "--insecure")
		cmd.Stdout, cmd.Stderr = &boot, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("extproc --print-bootstrap: %v: %s", err, stderr.String())
		}
		cfg := filepath.Join(dir, "envoy-"+region+".yaml")
		if err := os.WriteFile(cfg, boot.Bytes(), 0o644); err != nil {
			return err
		}
		env, err := g.Start("inferlb-envoy-"+region, o.Envoy, "-c", cfg, "--concurrency", "1",
			"--disable-hot-restart", "--use-dynamic-base-id", "--log-level", "warning")
		if err != nil {
			return err
		}
		rr.procs = append(rr.procs, env)
		rr.urls[region] = fmt.Sprintf("http://127.0.0.1:%d", envoyPort)
	}
	return nil
}

// tokenizerDir makes dir/sglang-router/llama-3.1-8b/tokenizer.json from a
// tokenizer the repository ships (any will do) and returns
// dir/sglang-router; "" (the router's default) when there is none.
func tokenizerDir(dir string) (string, error) {
	root, err := envoybin.RepoRoot()
	if err != nil {
		return "", nil
	}
	f, err := os.Open(filepath.Join(root, "internal", "tokens", "hf", "testdata", "qwen3.tokenizer.json.gz"))
	if err != nil {
		return "", nil
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return "", err
	}
	wd := filepath.Join(dir, "sglang-router")
	if err := os.MkdirAll(filepath.Join(wd, ModelName), 0o755); err != nil {
		return "", err
	}
	out, err := os.Create(filepath.Join(wd, ModelName, "tokenizer.json"))
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(out, zr); err != nil {
		out.Close()
		return "", err
	}
	return wd, out.Close()
}

// waitWorkers polls an SGLang router's /readiness until it counts every
// worker healthy.
func waitWorkers(ctx context.Context, g *childproc.Group, c readyCheck, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	for {
		if err := g.Exited(); err != nil {
			return err
		}
		var st struct {
			Healthy int `json:"healthy_workers"`
		}
		resp, err := client.Get(c.url)
		if err == nil {
			err = json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&st)
			resp.Body.Close()
			if err == nil && st.Healthy >= c.workers {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("%d of %d workers healthy", st.Healthy, c.workers)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %v", c.url, timeout, err)
		}
		// Sparingly: sglang-router logs every 503 it answers as an error.
		if err := pause(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitOK polls url until it answers 200.
func waitOK(ctx context.Context, g *childproc.Group, url string, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	for {
		if err := g.Exited(); err != nil {
			return err
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %v", url, timeout, err)
		}
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitServes polls the router with a one-token chat request until one
// succeeds: the router is up and knows its workers (a cache-aware router
// that has not yet registered them answers 503). The prompt is a word no
// workload uses, so it caches nothing the traffic meets.
func waitServes(ctx context.Context, g *childproc.Group, base, region string, timeout time.Duration) error {
	client := &http.Client{Timeout: 10 * time.Second}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"readiness"}],"max_tokens":1}`, ModelName)
	deadline := time.Now().Add(timeout)
	for {
		if err := g.Exited(); err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewBufferString(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if region != "local" {
			req.Header.Set(headers.SourceRegion, region)
		}
		resp, err := client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no request served after %v: %v", timeout, err)
		}
		if err := pause(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
