package drills

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/api/fleet"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/internal/childproc"
	"github.com/inferlb/inferlb/internal/envoyrun"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/tools/enginesim"
	"github.com/inferlb/inferlb/tools/llamacpp"
	"github.com/inferlb/inferlb/xds/auth/authtest"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// The drills' engine: a small GPU so that overload costs the test machine
// little. A request of ~40 prompt and 16 output tokens takes about 0.4 s
// with 4 running, so one engine serves about 10 requests/s.
const drillProfile = `{gpu: G, model: m, prefill_tokens_per_s: 20000, overhead_ms: 5, decode_step_ms: 20, decode_step_per_seq_ms: 1, max_running: 4, kv_capacity_tokens: 200000}`

const nodeID = "fe-east"

// stackOptions describe one drill's stack.
type stackOptions struct {
	engines int
	// profile is the fleet profile (YAML flow map); default drillProfile.
	profile string
	// replicas is the number of control-plane processes (default 1).
	replicas int
	// cpArgs and extArgs are extra flags for every control plane and for
	// ext_proc.
	cpArgs, extArgs []string
	// variant is the bootstrap's (default fail-closed).
	variant string
	// auth is "insecure" (default), "token" or "mtls": how the xDS/Reports
	// port is secured, for Envoy and ext_proc alike.
	auth string
	// frontendMaxRPS, if set, is the fleet spec's bound on the frontend.
	frontendMaxRPS float64
	// timeScale of the engines (default 1).
	timeScale float64
	// envoy edits the bootstrap parameters.
	envoy func(*envoyconfigs.Params)
	// onAuth sees the credentials (mtls: the PKI) before anything starts.
	onAuth func(*authtest.PKI)
	// noWait skips waiting for a first successful request.
	noWait bool
	// envoyWorkers is Envoy's worker count (default 1).
	envoyWorkers int
	// llama, if set, puts llama.cpp servers behind the stack instead of
	// simulated engines (llamacpp_test.go).
	llama *llamaOptions
}

// stack is a running drill stack.
type stack struct {
	t         *testing.T
	dir       string
	spec      *fleet.Spec
	fleetPath string
	engines   []*enginesim.Server
	llamas    []*llamacpp.Server
	addrs     []string         // every engine's address, e0 first
	procs     *childproc.Group // the control planes and ext_proc
	cps       []*childproc.Proc
	cpXDS     []string // xDS/Reports address per replica
	cpAdmin   []string // admin base URL per replica
	ext       *childproc.Proc
	extGRPC   string
	extHTTP   string
	envoy     *envoytest.Envoy
	url       string
	auth      *authFiles
	bootstrap string
}

func startStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	t.Cleanup(leaktest.AfterTest(t))
	if _, err := envoytest.Binary(); err != nil {
		t.Skipf("no Envoy: %v", err)
	}
	if o.llama != nil {
		requireLlama(t)
	}
	bin := inferlbBinary(t)
	if o.engines == 0 {
		o.engines = 3
	}
	if o.profile == "" {
		o.profile = drillProfile
	}
	if o.replicas == 0 {
		o.replicas = 1
	}
	if o.variant == "" {
		o.variant = envoyconfigs.FailClosed
	}
	if o.auth == "" {
		o.auth = "insecure"
	}
	if o.timeScale == 0 {
		o.timeScale = 1
	}
	s := &stack{t: t, dir: t.TempDir()}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var prof fleet.Profile
	probe, err := fleet.Parse([]byte(fleetYAML(o.profile, []string{"127.0.0.1:1"}, 0)))
	if err != nil {
		t.Fatalf("drill fleet: %v", err)
	}
	prof = probe.Profiles[0]
	var addrs []string
	if o.llama != nil {
		s.llamas = startLlamas(t, s.dir, o.llama)
		for _, l := range s.llamas {
			addrs = append(addrs, l.Addr())
		}
		o.engines = 0
	}
	for i := 0; i < o.engines; i++ {
		e, err := enginesim.Start(context.Background(), enginesim.Options{ID: fmt.Sprintf("e%d", i), Model: "m",
			Profile: prof, TimeScale: o.timeScale, Seed: uint64(i + 1), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		s.engines = append(s.engines, e)
		addrs = append(addrs, e.Addr())
	}
	s.addrs = addrs
	y := fleetYAML(o.profile, addrs, o.frontendMaxRPS)
	if o.llama != nil {
		y = o.llama.fleet(addrs)
	}
	if s.spec, err = fleet.Parse([]byte(y)); err != nil {
		t.Fatalf("drill fleet: %v\n%s", err, y)
	}
	s.fleetPath = filepath.Join(s.dir, "fleet.yaml")
	if err := os.WriteFile(s.fleetPath, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	s.auth = newAuthFiles(t, s.dir, o.auth)
	if o.onAuth != nil {
		o.onAuth(s.auth.pki)
	}

	s.procs = &childproc.Group{Dir: s.dir}
	t.Cleanup(func() {
		s.procs.StopAll()
		if t.Failed() {
			for _, p := range append(slices.Clone(s.cps), s.ext) {
				if p != nil {
					t.Logf("%s log tail:\n%s", p.Name, p.Tail(40))
				}
			}
		}
	})
	// Control plane replicas on fixed (free) ports, so that a killed one
	// comes back where Envoy and ext_proc look for it.
	for k := 0; k < o.replicas; k++ {
		xds, admin := freeAddr(t), freeAddr(t)
		args := []string{"control-plane", "--fleet", s.fleetPath, "--xds-listen", xds, "--admin-listen", admin,
			"--interval", "1s", "--scrape-interval", "250ms", "--scrape-timeout", "500ms", "--stale-after", "2s",
			"--smoothing", "1s", "--demand-window", "4s", "--warmup", "500ms", "--log-level", "info",
			"--time-scale", fmt.Sprint(o.timeScale)}
		args = append(args, s.auth.serverFlags()...)
		args = append(args, o.cpArgs...)
		s.cps = append(s.cps, s.startProc(fmt.Sprintf("control-plane-%d", k), bin, args...))
		s.cpXDS = append(s.cpXDS, xds)
		s.cpAdmin = append(s.cpAdmin, "http://"+admin)
	}
	for k := range s.cps {
		s.waitCP(k)
	}

	s.extGRPC, s.extHTTP = freeAddr(t), freeAddr(t)
	args := []string{"extproc", "--listen", s.extGRPC, "--http-listen", s.extHTTP,
		"--control-plane", strings.Join(s.cpXDS, ","), "--node-id", nodeID, "--region", "east",
		"--instance", "drill", "--report-interval", "250ms", "--log-level", "info"}
	args = append(args, s.auth.clientFlags()...)
	args = append(args, o.extArgs...)
	s.ext = s.startProc("extproc", bin, args...)

	// The listen port was free a moment ago; an outgoing connection of
	// another process may take it (ephemeral ports share the range)
	// before Envoy binds it. Envoy then exits with "Address already in
	// use", and the stack is tried again on another port (a clean-clone CI
	// run lost TestDrillMutualTLS to this once).
	var listen int
	for attempt := 1; ; attempt++ {
		listen = envoytest.FreePort(t)
		p := envoyconfigs.Params{Variant: o.variant, NodeID: nodeID, Region: "east", ListenPort: listen,
			ExtProcPort: port(t, s.extGRPC), XDSPort: port(t, s.cpXDS[0]), XDSAddresses: s.cpXDS,
			BodyLimit: 1 << 20, FallbackCluster: "inferlb_chat", XDSAuth: s.auth.envoyAuth(), ExtProcToken: s.auth.extToken,
			// No drill is about ext_proc's round-trip bound (ExtProcDeath
			// kills it: refused at once). With the 1-s default, one decision
			// of a starved race-built ext_proc is a 504, which every drill's
			// zero-failure check counts as lost.
			MessageTimeout: "10s"}
		if o.envoy != nil {
			o.envoy(&p)
		}
		if s.bootstrap, err = envoyconfigs.Render(p); err != nil {
			t.Fatal(err)
		}
		e, err := envoyrun.Start(envoytest.Options{Bootstrap: s.bootstrap, Concurrency: o.envoyWorkers}, t.TempDir())
		if err != nil && attempt < 3 && strings.Contains(err.Error(), "Address already in use") {
			t.Logf("envoy start, attempt %d: listen port %d taken meanwhile; another port", attempt, listen)
			continue
		}
		if err != nil {
			t.Fatalf("envoy: %v", err)
		}
		s.envoy = e
		t.Cleanup(func() {
			e.Stop()
			if t.Failed() {
				t.Logf("envoy log tail:\n%s", e.LogTail(60))
			}
		})
		break
	}
	s.url = fmt.Sprintf("http://127.0.0.1:%d", listen)
	if !o.noWait {
		s.waitServing()
	}
	return s
}

// fleetYAML is the drills' fleet: one region, one frontend, engines e0.. at
// addrs, one class, two priorities.
func fleetYAML(profile string, addrs []string, maxRPS float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, `name: drill
regions: [{name: east, residency: us}]
network: {same_region_rtt_ms: 1}
`)
	if maxRPS > 0 {
		fmt.Fprintf(&b, "frontends: [{name: fe-east, region: east, node_id: %s, max_requests_per_s: %g}]\n", nodeID, maxRPS)
	} else {
		fmt.Fprintf(&b, "frontends: [{name: fe-east, region: east, node_id: %s}]\n", nodeID)
	}
	fmt.Fprintf(&b, `models: [{name: m, max_context_tokens: 8192}]
profiles: [%s]
classes: [{name: chat, model: m, mean_prompt_tokens: 40, mean_output_tokens: 16}]
priorities: [{name: high, level: 0, shed_cost: 10000}, {name: low, level: 1, shed_cost: 100}]
engines:
`, profile)
	for i, a := range addrs {
		fmt.Fprintf(&b, "  - {id: e%d, address: %q, region: east, gpu: G, model: m}\n", i, a)
	}
	return b.String()
}

func freeAddr(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", envoytest.FreePort(t)) }

func port(t *testing.T, addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

var adminClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// get GETs a URL and returns the body; non-2xx is an error.
func get(url string) ([]byte, error) {
	resp, err := adminClient.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return b, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, b)
	}
	return b, nil
}

func getJSON(url string, v any) error {
	b, err := get(url)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// waitCP waits for replica k's admin endpoint.
func (s *stack) waitCP(k int) {
	s.t.Helper()
	if err := envoytest.Poll(context.Background(), 30*time.Second, 50*time.Millisecond, func() error {
		if !s.cps[k].Running() {
			return fmt.Errorf("control plane %d exited:\n%s", k, s.cps[k].Tail(20))
		}
		_, err := get(s.cpAdmin[k] + "/healthz")
		return err
	}); err != nil {
		s.t.Fatal(err)
	}
}

// waitServing waits until ext_proc has a policy, Envoy has the class
// cluster's engines and a request succeeds end to end.
func (s *stack) waitServing() {
	s.t.Helper()
	c := newClient(s.url)
	defer c.close()
	if err := envoytest.Poll(context.Background(), 60*time.Second, 100*time.Millisecond, func() error {
		if !s.ext.Running() {
			return fmt.Errorf("ext_proc exited:\n%s", s.ext.Tail(20))
		}
		if _, err := get("http://" + s.extHTTP + "/healthz"); err != nil {
			return fmt.Errorf("ext_proc: %w", err)
		}
		cs, err := xdstest.Clusters(s.envoy)
		if err != nil {
			return err
		}
		if n := len(cs["inferlb_chat"]); n != len(s.addrs) {
			return fmt.Errorf("envoy has %d of %d engines in inferlb_chat", n, len(s.addrs))
		}
		r := c.do(context.Background(), request{prompt: "ready?", maxTokens: 2})
		if r.outcome != outcomeOK {
			return fmt.Errorf("first request: %s", r)
		}
		return nil
	}); err != nil {
		s.t.Fatalf("stack not serving: %v", err)
	}
}

// engineView is one engine of the control plane's last cycle (/signals).
type engineView struct {
	ID           string  `json:"id"`
	State        string  `json:"state"`
	Penalty      float64 `json:"penalty"`
	PenaltyWhy   string  `json:"penalty_why"`
	TTFTResidual float64 `json:"ttft_residual"`
	TBOTResidual float64 `json:"tbot_residual"`
	E2EResidual  float64 `json:"e2e_residual"`
	ErrorRate    float64 `json:"error_rate"`
	Utilization  float64 `json:"observed_utilization"`
	Background   float64 `json:"background_load"`
	Own          float64 `json:"own_utilization"`
	OwnWindow    float64 `json:"own_window_utilization"`
	Planned      float64 `json:"planned_utilization"`
	Correction   float64 `json:"profile_correction"`
	TTFTPredMs   float64 `json:"ttft_predicted_ms"`
	Window       struct {
		TTFTCount   float64 `json:"ttft_count"`
		TTFTMeanMs  float64 `json:"ttft_mean_ms"`
		QueueCount  float64 `json:"queue_count"`
		QueueMeanMs float64 `json:"queue_mean_ms"`
		Running     float64 `json:"running"`
		Waiting     float64 `json:"waiting"`
		Completions float64 `json:"completions_per_s"`
	} `json:"evidence_window"`
}

// cycleView returns replica k's engine views by id.
func (s *stack) cycleView(k int) (map[string]engineView, error) {
	var sig struct {
		CycleView []engineView `json:"cycle_view"`
	}
	if err := getJSON(s.cpAdmin[k]+"/signals", &sig); err != nil {
		return nil, err
	}
	out := map[string]engineView{}
	for _, v := range sig.CycleView {
		out[v.ID] = v
	}
	return out, nil
}

// latencyResets returns how many times replica 0's tracker cleared the
// engine's latency memory, and why it did the last time.
func (s *stack) latencyResets(t *testing.T, id string) (int, string) {
	t.Helper()
	var sig struct {
		Engines []struct {
			ID        string `json:"id"`
			Resets    int    `json:"latency_resets"`
			LastReset string `json:"last_reset"`
		} `json:"engines"`
	}
	if err := getJSON(s.cpAdmin[0]+"/signals", &sig); err != nil {
		t.Fatal(err)
	}
	for _, e := range sig.Engines {
		if e.ID == id {
			return e.Resets, e.LastReset
		}
	}
	t.Fatalf("engine %s is not in the tracker's signals", id)
	return 0, ""
}

// published is replica k's published decision for the drill's class: its
// shares and its shed fractions by priority.
type published struct {
	Weights map[string]float64 `json:"weights"`
	Shed    map[string]float64 `json:"shed_by_priority"`
}

func (s *stack) published(k int) (published, error) {
	var w struct {
		Nodes map[string]struct {
			Classes map[string]published `json:"classes"`
		} `json:"nodes"`
	}
	if err := getJSON(s.cpAdmin[k]+"/weights", &w); err != nil {
		return published{}, err
	}
	return w.Nodes[nodeID].Classes["chat"], nil
}

// weights returns replica k's published shares for the drill's class.
func (s *stack) weights(k int) (map[string]float64, error) {
	p, err := s.published(k)
	return p.Weights, err
}

// envoyShares returns each engine's share of the class's priority-0 weight
// in Envoy's /clusters (0 for an engine at priority 1), by engine id.
func (s *stack) envoyShares() (map[string]float64, error) {
	cs, err := xdstest.Clusters(s.envoy)
	if err != nil {
		return nil, err
	}
	hosts := cs["inferlb_chat"]
	sum := 0.0
	for _, h := range hosts {
		if h.Priority == 0 {
			sum += float64(h.Weight)
		}
	}
	out := map[string]float64{}
	for i, a := range s.addrs {
		h, ok := hosts[a]
		if !ok || sum == 0 {
			return nil, fmt.Errorf("engine e%d not in Envoy's inferlb_chat (%d hosts)", i, len(hosts))
		}
		if h.Priority == 0 {
			out[fmt.Sprintf("e%d", i)] = float64(h.Weight) / sum
		} else {
			out[fmt.Sprintf("e%d", i)] = 0
		}
	}
	return out, nil
}

// metric returns the sum of a Prometheus counter or gauge's samples whose
// labels contain every given label="value" pair, from a /metrics URL.
func metric(url, name string, labels ...string) (float64, error) {
	b, err := get(url)
	if err != nil {
		return 0, err
	}
	sum, found := 0.0, false
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %v", name, line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0, fmt.Errorf("no %s%v in %s", name, labels, url)
	}
	return sum, nil
}
