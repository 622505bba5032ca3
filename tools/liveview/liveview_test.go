package liveview

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/tools/enginesim"
	"github.com/inferlb/inferlb/xds/translate"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// A real Envoy with a static weighted cluster over two simulated engines:
// the view shows the weights Envoy holds (3:1), the traffic each engine got,
// and the engines' own load and TTFT from their vLLM metrics.
func TestViewShowsEnvoyWeightsAndEngineLoad(t *testing.T) {
	const cluster = xdstest.ClusterPrefix + "engines"
	defer leaktest.AfterTest(t)()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	spec, err := fleet.Load("../../examples/fleet-minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fl, err := enginesim.StartFleet(ctx, spec, enginesim.FleetOptions{AnyPort: true, TimeScale: 0.05, DefaultMaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	e1, e2 := fl.Server("engine-1"), fl.Server("engine-2")

	// The frontend bootstrap (direct: no ext_proc) with one cluster of the
	// two engines at weights 3:1, over ADS from the xDS server. The view
	// must leave the bootstrap's own cluster (the control plane's) out of
	// the weight shares: it is not an engine.
	cp := xdstest.StartControlPlane(t, "")
	defer cp.Stop() // before leaktest's check, which runs ahead of t.Cleanup
	if err := cp.SetClusters("frontend-local", 0, translate.FixedClass{Name: "engines", Engines: []translate.FixedEngine{
		{ID: "engine-1", Address: e1.Addr(), Weight: 3}, {ID: "engine-2", Address: e2.Addr(), Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	port := envoytest.FreePort(t)
	env := envoytest.Start(t, envoytest.Options{Bootstrap: xdstest.Bootstrap(t, xdstest.BootstrapOptions{
		NodeID: "frontend-local", Region: "local", XDSAddress: cp.Addr, ListenerPort: port, Cluster: cluster})})
	defer env.Stop() // before leaktest's check, which runs ahead of t.Cleanup

	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	c := &Collector{Client: hc, Fleet: spec, EnvoyAdmin: map[string]string{"frontend-local": env.AdminURL},
		EngineURL: map[string]string{"engine-1": e1.URL(), "engine-2": e2.URL()}}
	// Ready: Envoy has the cluster's two hosts, health-checked.
	if err := envoytest.Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
		cs, err := env.Clusters()
		if err != nil {
			return err
		}
		for _, h := range cs[cluster] {
			if !h.Routable() || h.PendingHC {
				return fmt.Errorf("host %s not routable yet", h.Address)
			}
		}
		if len(cs[cluster]) != 2 {
			return fmt.Errorf("%d hosts in %s", len(cs[cluster]), cluster)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	first, err := c.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 3:1 Maglev over distinct session keys: P(engine-2 gets as many as
	// engine-1 of 120) is below 1e-12.
	const n = 120
	for i := 0; i < n; i++ {
		body := fmt.Sprintf(`{"model":"llama-3.1-8b","max_tokens":2,"messages":[{"role":"user","content":"hello number %d"}]}`, i)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), strings.NewReader(body))
		req.Header.Set("content-type", "application/json")
		req.Header.Set("x-session-id", fmt.Sprintf("s-%d", i))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	// Envoy's host counters are updated as responses complete; poll.
	var v View
	err = envoytest.Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
		cur, err := c.Collect(ctx)
		if err != nil {
			return err
		}
		v = c.Build(first, cur)
		got := 0.0
		for _, fs := range cur.Frontends {
			for _, hs := range fs.Hosts {
				for _, h := range hs {
					got += h.RqTotal
				}
			}
		}
		if got < n {
			return fmt.Errorf("envoy counted %v of %d requests", got, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]EngineRow{}
	for _, r := range v.Engines {
		rows[r.ID] = r
	}
	// A cluster not named after a fleet class is a class of its own name;
	// its weights are the cluster's, not averaged with any other cluster's.
	if w := rows["engine-1"].Weight[cluster]["frontend-local"]; math.Abs(w-0.75) > 1e-9 {
		t.Errorf("engine-1 weight share %v, want 0.75", w)
	}
	if w := rows["engine-2"].Weight[cluster]["frontend-local"]; math.Abs(w-0.25) > 1e-9 {
		t.Errorf("engine-2 weight share %v, want 0.25", w)
	}
	t1, t2 := rows["engine-1"].Traffic[cluster]["frontend-local"], rows["engine-2"].Traffic[cluster]["frontend-local"]
	if math.Abs(t1+t2-1) > 1e-9 || t1 <= t2 {
		t.Errorf("traffic shares %v + %v: want a sum of 1, engine-1 above engine-2 (weights 3:1)", t1, t2)
	}
	for id, r := range rows {
		if !r.Up || math.IsNaN(r.TTFTMs) || r.TTFTMs <= 0 {
			t.Errorf("%s: up %v, ttft %v ms: want up with a positive mean TTFT", id, r.Up, r.TTFTMs)
		}
	}
	var buf bytes.Buffer
	Render(&buf, v)
	for _, want := range []string{"engine-1", "engine-2", "frontend-local", "class " + cluster + ":", "   75 → ", "   25 → "} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("rendered view lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestParseEngineMetricsRejectsGarbage(t *testing.T) {
	if _, err := ParseEngineMetrics("vllm", []byte("vllm:num_requests_running{ 1\n")); err == nil {
		t.Fatal("want a parse error")
	}
}

// The live view reads engines as the control plane does: a target without
// vLLM's gauges is not shown as an idle engine, and a counter it does not
// export reads as 0.
func TestParseEngineMetricsReadsVLLMNames(t *testing.T) {
	text := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 40
vllm:generation_tokens_total{model_name="n"} 2
`
	s, err := ParseEngineMetrics("", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if s.Running != 3 || s.Waiting != 1 || s.KVUsage != 0.25 || s.GenerationToks != 42 || s.RequestsSuccess != 0 || s.TTFTCount != 0 {
		t.Errorf("parsed %+v", s)
	}
	if _, err := ParseEngineMetrics("vllm", []byte("# TYPE up gauge\nup 1\n")); err == nil || !strings.Contains(err.Error(), "vllm:num_requests_running") {
		t.Errorf("a non-vLLM /metrics: err = %v, want it to name the missing gauges", err)
	}
}

// An SGLang engine (the fleet's engines[].server) is read in SGLang's
// names, with the control plane's mapping: running, queued, KV use, TTFT
// and tokens show, as for vLLM. A real engine simulator serves SGLang's
// /metrics; an unknown server kind is an error naming the known ones.
func TestViewReadsSGLangEngines(t *testing.T) {
	defer leaktest.AfterTest(t)()
	ctx := context.Background()
	eng, err := enginesim.Start(ctx, enginesim.Options{ID: "sg", Model: "m", Profile: enginesim.H100Llama8B, Server: fleet.ServerSGLang, TimeScale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	spec, err := fleet.Parse([]byte(fmt.Sprintf(`name: sg
regions: [{name: east}]
frontends: [{name: fe, region: east}]
models: [{name: m, max_context_tokens: 8192}]
profiles:
  - {gpu: H100, model: m, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 450000}
classes: [{name: chat, model: m}]
engines:
  - {id: sg, address: %q, region: east, gpu: H100, model: m, server: sglang}
`, eng.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	c := &Collector{Client: hc, Fleet: spec}
	first, err := c.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		resp, err := hc.Post("http://"+eng.Addr()+"/v1/chat/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hello %d"}]}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	cur, err := c.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := cur.Engines["sg"]
	if !s.Up || s.TTFTCount-first.Engines["sg"].TTFTCount != 5 || s.GenerationToks < 15 || s.RequestsSuccess < 5 {
		t.Fatalf("SGLang engine sample %+v (before %+v): want it up, 5 first tokens, 15 tokens, 5 requests", s, first.Engines["sg"])
	}
	if r := c.Build(first, cur).Engines[0]; math.IsNaN(r.TTFTMs) || r.TTFTMs <= 0 {
		t.Fatalf("SGLang engine row %+v: want a mean TTFT", r)
	}
	if _, err := ParseEngineMetrics("tgi", nil); err == nil || !strings.Contains(err.Error(), "vllm, sglang or generic") {
		t.Fatalf("unknown server kind: %v", err)
	}
}

func TestParseEnvoyClustersRejectsGarbage(t *testing.T) {
	if _, err := ParseEnvoyClusters([]byte("{not json")); err == nil {
		t.Fatal("want a parse error")
	}
}

// Weights are shown per class: an engine that holds most of one class's
// weight and none of another's shows both, not their average, beside the
// share of each class's requests it got.
func TestBuildShowsWeightsPerClass(t *testing.T) {
	spec, err := fleet.Load("../../examples/fleet-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := &Collector{Fleet: spec, EnvoyAdmin: map[string]string{"frontend-eu-west": "x"}}
	host := func(cluster string, w uint32, rq float64) HostSample {
		return HostSample{Cluster: cluster, Weight: w, Healthy: true, RqTotal: rq}
	}
	sample := func(at time.Time, rqGeneral, rqEU float64) Sample {
		return Sample{At: at, Engines: map[string]EngineSample{}, Frontends: map[string]FrontendSample{"frontend-eu-west": {Up: true,
			Hosts: map[string][]HostSample{
				"127.0.0.1:18009": {host("inferlb_general", 70, rqGeneral), host("inferlb_eu", 10, rqEU)},
				"127.0.0.1:18001": {host("inferlb_general", 30, 0)},
				"127.0.0.1:18010": {host("inferlb_eu", 90, 3*rqEU)},
			},
			Retries: map[string]float64{"inferlb_general": rqGeneral / 10, "inferlb_extproc": 100}}}}
	}
	t0 := time.Now()
	v := c.Build(sample(t0, 0, 0), sample(t0.Add(2*time.Second), 20, 5))
	var eu1 EngineRow
	for _, r := range v.Engines {
		if r.ID == "eu-west-h100-1" {
			eu1 = r
		}
	}
	fe := "frontend-eu-west"
	for _, x := range []struct {
		what      string
		got, want float64
	}{
		{"general weight", eu1.Weight["general"][fe], 0.7},
		{"eu weight", eu1.Weight["eu"][fe], 0.1},
		{"general traffic", eu1.Traffic["general"][fe], 1},
		{"eu traffic", eu1.Traffic["eu"][fe], 0.25},
		{"req/s", v.FrontRPS[fe], (20 + 5 + 15) / 2.0},
		{"retries (engine clusters only)", v.FrontRetries[fe], 2},
	} {
		if math.Abs(x.got-x.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", x.what, x.got, x.want)
		}
	}
	var buf bytes.Buffer
	Render(&buf, v)
	for _, want := range []string{"class general:", "class eu:", "no traffic in the interval: class long-context", "   70 → 100", "   10 →  25"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("rendered view lacks %q:\n%s", want, buf.String())
		}
	}
}

// The client log is read as it grows, a torn last line waiting for its end;
// its records are summarized per frontend, 429s per priority.
func TestClientLogAndSummary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "requests.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cl := &ClientLog{Path: filepath.Join(t.TempDir(), "absent")}
	if recs, err := cl.Read(); err != nil || len(recs) != 0 {
		t.Fatalf("absent log: %v %v", recs, err)
	}
	cl = &ClientLog{Path: path}
	f.WriteString(`{"region":"eu-west","priority":"batch","outcome":"rejected","status":429}` + "\n" +
		`{"region":"eu-west","priority":"critical","outcome":"ok","ttft_ms":40}` + "\n" + `{"region":"us-ea`)
	recs, err := cl.Read()
	if err != nil || len(recs) != 2 {
		t.Fatalf("first read: %d records, %v", len(recs), err)
	}
	f.WriteString(`st","priority":"batch","outcome":"ok","ttft_ms":20}` + "\n" +
		`{"region":"eu-west","priority":"critical","outcome":"ok","ttft_ms":60}` + "\n")
	more, err := cl.Read()
	if err != nil || len(more) != 2 || more[0].Region != "us-east" {
		t.Fatalf("second read: %+v, %v", more, err)
	}
	st := SummarizeClients(append(recs, more...), map[string]string{"eu-west": "frontend-eu-west", "us-east": "frontend-us-east"})
	eu := st["frontend-eu-west"]
	if eu.Finished != 3 || eu.OK != 2 || eu.Rejected["batch"] != 1 || eu.TTFTP50 != 40 || eu.TTFTP90 != 60 {
		t.Errorf("eu-west: %+v", eu)
	}
	if us := st["frontend-us-east"]; us.OK != 1 || us.TTFTP50 != 20 {
		t.Errorf("us-east: %+v", us)
	}
}

func TestParseEnvoyRetries(t *testing.T) {
	got := ParseEnvoyRetries([]byte("cluster.inferlb_general.upstream_rq_retry: 7\ncluster.inferlb_eu.upstream_rq_retry: 0\nother: 3\ncluster.x.upstream_rq_retry_success: 2\n"))
	if len(got) != 2 || got["inferlb_general"] != 7 || got["inferlb_eu"] != 0 {
		t.Errorf("retries %v", got)
	}
}
