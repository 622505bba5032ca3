package picker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"google.golang.org/grpc"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/picker"
	"github.com/inferlb/inferlb/extproc/service"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/translate"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// engine is a stand-in model server: it answers with its id.
type engine struct {
	id      string
	srv     *httptest.Server
	arrived atomic.Int64
}

func newEngine(t *testing.T, id string) *engine {
	e := &engine{id: id}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		e.arrived.Add(1)
		w.Header().Set("content-type", "application/json")
		fmt.Fprintf(w, `{"engine":%q}`, id)
	}))
	return e
}

func (e *engine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

// deadAddr is an address where nothing listens (a port bound a moment and
// closed).
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

const nodeID = "gateway-test"

// pool is a class's engines with their weights, translated the way the
// control plane translates them: the CDS/EDS inferlb's frontend Envoys get
// and the RoutingPolicy (with the same endpoints) the picker gets.
type pool struct {
	engines []*engine
	addrs   []string // every endpoint, dead ones too, in weight order
	res     *translate.Resources
	policy  *policyv1.RoutingPolicy
}

func (p *pool) close() {
	for _, e := range p.engines {
		e.srv.Close()
	}
}

const model = "llama-3-8b"

func newPool(t *testing.T, weights []float64, dead int, hbf uint32) *pool {
	p := &pool{}
	var eps []translate.FixedEngine
	for i, w := range weights {
		var a string
		id := fmt.Sprintf("e%d", i)
		if i < dead {
			a = deadAddr(t)
		} else {
			e := newEngine(t, id)
			p.engines = append(p.engines, e)
			a = e.addr()
		}
		p.addrs = append(p.addrs, a)
		eps = append(eps, translate.FixedEngine{ID: id, Address: a, Weight: w})
	}
	o := translate.DefaultOptions()
	o.ClusterPrefix, o.HashBalanceFactor = xdstest.ClusterPrefix, hbf
	r, err := translate.Translate(translate.FixedNode(nodeID, "eu-west", []translate.FixedClass{{Name: "llama", Engines: eps}}), o)
	if err != nil {
		t.Fatal(err)
	}
	p.res = r
	pol := r.Policy
	pol.Version = "1"
	pol.Priorities = []*policyv1.Priority{{Name: "interactive", Level: 0}, {Name: "standard", Level: 1}}
	pol.DefaultPriority = "standard"
	pol.Classes[0].Model = model
	pol.Classes[0].RetryBudgetFraction, pol.Classes[0].MaxRetries = 1, 2
	p.policy = pol
	return p
}

// server is an ext_proc server (either mode) on a loopback port.
type server struct {
	ext  *extproc.Server
	pk   *picker.Picker
	addr string
	g    *grpc.Server
	done chan struct{}
}

func startServer(t *testing.T, pol *policyv1.RoutingPolicy, asPicker bool, fallbacks int) *server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := &server{ext: extproc.New(extproc.Options{Logger: log}), done: make(chan struct{})}
	if pol != nil {
		if err := s.ext.SetPolicy(pol); err != nil {
			t.Fatal(err)
		}
	}
	s.g = grpc.NewServer(service.ServerOptions(extproc.DefaultBodyLimit)...)
	if asPicker {
		s.pk = picker.New(s.ext, picker.Options{Logger: log, Fallbacks: fallbacks})
		s.pk.Register(s.g)
	} else {
		s.ext.Register(s.g)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	go func() { defer close(s.done); _ = s.g.Serve(lis) }()
	return s
}

func (s *server) stop() { s.g.Stop(); <-s.done }

// gateway is a gateway-style Envoy (envoy-configs/endpoint-picker.yaml.tmpl).
type gateway struct {
	envoy *envoytest.Envoy
	url   string
}

func startGateway(t *testing.T, p envoyconfigs.PickerParams) *gateway {
	t.Helper()
	p.ListenPort = envoytest.FreePort(t)
	boot, err := envoyconfigs.RenderEndpointPicker(p)
	if err != nil {
		t.Fatal(err)
	}
	return &gateway{envoy: envoytest.Start(t, envoytest.Options{Bootstrap: boot}), url: fmt.Sprintf("http://127.0.0.1:%d", p.ListenPort)}
}

type reply struct {
	status int
	engine string
	body   string
	header http.Header
}

var client = &http.Client{Timeout: 20 * time.Second}

func post(url string, body []byte, hdr map[string]string) reply {
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, body: string(b), header: resp.Header}
	var v struct {
		Engine string `json:"engine"`
	}
	if resp.StatusCode == 200 && json.Unmarshal(b, &v) == nil {
		r.engine = v.Engine
	}
	return r
}

// conversation i's first turn: distinct system prompts, so distinct keys.
func conversation(i int) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 8, "messages": []map[string]string{
		{"role": "system", "content": fmt.Sprintf("You are assistant number %d of the fleet.", i)},
		{"role": "user", "content": "hello"}}})
	return b
}

// waitServing polls until a request is answered 200.
func waitServing(t *testing.T, url string) {
	t.Helper()
	err := envoytest.Poll(context.Background(), 20*time.Second, 20*time.Millisecond, func() error {
		if r := post(url, conversation(-1), nil); r.status != 200 {
			return fmt.Errorf("status %d: %s", r.status, r.body)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("not serving: %v", err)
	}
}

var variants = []string{envoyconfigs.OriginalDst, envoyconfigs.OverrideHost}

// fallbacks is the picker's fallback count for a gateway variant: an
// ORIGINAL_DST cluster takes one address, override_host a list.
func fallbacks(variant string) int {
	if variant == envoyconfigs.OverrideHost {
		return 2
	}
	return 0
}

// TestEndpointPickerRoutesLikeEnvoy: the same requests through inferlb's
// own frontend (ext_proc mode: the affinity key to Envoy's Maglev cluster
// with the control plane's EDS weights) and through a gateway's Envoy with
// the endpoint picker (both ways gateways route to its pick) land on the
// same engine, request by request.
func TestEndpointPickerRoutesLikeEnvoy(t *testing.T) {
	defer leaktest.AfterTest(t)()
	p := newPool(t, []float64{5, 3, 1, 1}, 0, 0)
	defer p.close()

	// inferlb's own frontend: control plane (CDS/EDS), ext_proc, Envoy.
	cp := xdstest.StartControlPlane(t, "")
	defer cp.Stop()
	if err := cp.Server.Publish(context.Background(), p.res); err != nil {
		t.Fatal(err)
	}
	classic := startServer(t, p.policy, false, 0)
	defer classic.stop()
	_, xp, _ := net.SplitHostPort(cp.Addr)
	_, ep, _ := net.SplitHostPort(classic.addr)
	xport, _ := strconv.Atoi(xp)
	eport, _ := strconv.Atoi(ep)
	listen := envoytest.FreePort(t)
	boot, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: nodeID, Region: "eu-west",
		ListenPort: listen, ExtProcPort: eport, XDSPort: xport, BodyLimit: extproc.DefaultBodyLimit, FallbackCluster: xdstest.ClusterPrefix + "llama"})
	if err != nil {
		t.Fatal(err)
	}
	front := envoytest.Start(t, envoytest.Options{Bootstrap: boot})
	defer front.Stop()
	frontURL := fmt.Sprintf("http://127.0.0.1:%d", listen)
	waitServing(t, frontURL)

	const n = 60
	want := make([]string, n)
	spread := map[string]int{}
	for i := range want {
		r := post(frontURL, conversation(i), nil)
		if r.status != 200 {
			t.Fatalf("frontend: conversation %d: %d %s", i, r.status, r.body)
		}
		want[i] = r.engine
		spread[r.engine]++
	}
	if len(spread) < 3 {
		t.Fatalf("the frontend used %d engines for %d conversations (%v): too few to compare picks", len(spread), n, spread)
	}

	for _, v := range variants {
		t.Run(v, func(t *testing.T) {
			pk := startServer(t, p.policy, true, fallbacks(v))
			defer pk.stop()
			gw := startGateway(t, envoyconfigs.PickerParams{Variant: v, PickerAddress: pk.addr, Endpoints: p.addrs, Retries: 2})
			defer gw.envoy.Stop()
			waitServing(t, gw.url)
			for i := range want {
				r := post(gw.url, conversation(i), nil)
				if r.status != 200 || r.engine != want[i] {
					t.Errorf("conversation %d: gateway %d %q (%s), frontend %q", i, r.status, r.engine, r.body, want[i])
				}
			}
		})
	}
}

// TestEndpointPickerFallbackOnDeadEndpoint: an engine the control plane
// still thinks healthy is down; the requests the picker sends there go to
// their fallback (the next host on the table) on the gateway's retry, and
// none fails. The gateway's served endpoint tells the picker who served.
func TestEndpointPickerFallbackOnDeadEndpoint(t *testing.T) {
	defer leaktest.AfterTest(t)()
	p := newPool(t, []float64{5, 3, 1, 1}, 1, 0) // e0, the heaviest, is dead
	defer p.close()
	pk := startServer(t, p.policy, true, 2)
	defer pk.stop()
	gw := startGateway(t, envoyconfigs.PickerParams{Variant: envoyconfigs.OverrideHost, PickerAddress: pk.addr, Endpoints: p.addrs, Retries: 2})
	defer gw.envoy.Stop()
	waitServing(t, gw.url)
	before := counter(t, pk, "inferlb_picker_served_total", `by="fallback"`)
	failed := 0
	for i := 0; i < 40; i++ {
		if r := post(gw.url, conversation(i), nil); r.status != 200 {
			failed++
			t.Errorf("conversation %d: %d %s", i, r.status, r.body)
		}
	}
	fb := counter(t, pk, "inferlb_picker_served_total", `by="fallback"`) - before
	// e0 has half the weight: about half the conversations have it first.
	if fb < 5 {
		t.Errorf("%v requests served by a fallback, want the dead engine's share (about 20 of 40)", fb)
	}
	t.Logf("40 requests, %d failed, %v served by a fallback", failed, fb)
}

// counter reads a counter of the picker's registry (summed over the series
// whose labels contain match).
func counter(t *testing.T, s *server, name, match string) float64 {
	t.Helper()
	mfs, err := s.ext.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if strings.Contains(strings.Join(ls, ","), match) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
