package extproc_test

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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferlb/inferlb/api/headers"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/cpclient"
	"github.com/inferlb/inferlb/extproc/service"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/internal/tokens/hf"
	"github.com/inferlb/inferlb/xds/translate"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// engine is a stand-in upstream: it answers with its id and the internal
// headers it received, can fail a share of its requests, and can hold
// requests until released.
type engine struct {
	id  string
	srv *httptest.Server

	mu        sync.Mutex
	failEvery int // fail every n-th request with 500 (0 = never)
	n         int
	hold      chan struct{} // non-nil: block until closed
	keys      []string      // the affinity key of every attempt, in arrival order
	arrived   atomic.Int64
	failed    atomic.Int64
	warmup    int64 // requests of the rig's readiness check (before arrived was reset)
}

type engineReply struct {
	Engine  string            `json:"engine"`
	Headers map[string]string `json:"headers"`
}

func newEngine(t *testing.T, id string) *engine {
	e := &engine{id: id}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" { // Envoy's active health check: not a request
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		e.arrived.Add(1)
		e.mu.Lock()
		e.keys = append(e.keys, r.Header.Get(headers.AffinityKey))
		e.n++
		fail := e.failEvery > 0 && e.n%e.failEvery == 0
		hold := e.hold
		e.mu.Unlock()
		if hold != nil {
			<-hold
		}
		if fail {
			e.failed.Add(1)
			http.Error(w, `{"error":{"message":"engine failure"}}`, http.StatusInternalServerError)
			return
		}
		rep := engineReply{Engine: id, Headers: map[string]string{}}
		for k, v := range r.Header {
			lk := strings.ToLower(k)
			if strings.HasPrefix(lk, "x-inferlb-") || strings.HasPrefix(lk, "x-envoy-max-retries") {
				rep.Headers[lk] = v[0]
			}
		}
		w.Header().Set("content-type", "application/json")
		_ = json.NewEncoder(w).Encode(rep)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

// rig is one frontend: engines, a test control plane, the ext_proc service
// (policy over ADS, reports), and a real Envoy with the envoy-configs
// bootstrap.
type rig struct {
	t       *testing.T
	engines []*engine
	cp      *xdstest.ControlPlane
	ext     *extproc.Server
	envoy   *envoytest.Envoy
	url     string
	grpcSrv *grpc.Server
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

type rigOptions struct {
	variant   string
	engines   int
	weights   []uint32
	balance   uint32
	policy    func(*policyv1.RoutingPolicy)
	bodyLimit int
	noExtProc bool   // point Envoy at a port where nothing listens
	bodyMode  string // the bootstrap's (envoyconfigs.BodyMode; "": buffered)
	// streamAbove is the bootstrap's envoyconfigs.Params.StreamAbove.
	streamAbove int
	reportInt   time.Duration
	// tokenizers are ext_proc's loaded tokenizers (by SHA-256).
	tokenizers map[string]*hf.Tokenizer
	// cachePlacement turns ext_proc's cache-aware placement on; registry,
	// if set, receives its metrics.
	cachePlacement bool
	registry       *prometheus.Registry
}

const nodeID = "frontend-test"

func basePolicy() *policyv1.RoutingPolicy {
	return &policyv1.RoutingPolicy{
		NodeId: nodeID, Region: "eu-west", Version: "1",
		Priorities: []*policyv1.Priority{
			{Name: "interactive", Level: 0}, {Name: "standard", Level: 1}, {Name: "batch", Level: 2},
		},
		DefaultPriority: "standard",
		Classes: []*policyv1.ClassPolicy{
			{Name: "llama", Cluster: "class-llama", Model: "llama-3-8b", RetryBudgetFraction: 0.2, MaxRetries: 1},
			{Name: "qwen", Cluster: "class-qwen", Model: "qwen-2-7b"},
		},
	}
}

func startRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	if o.variant == "" {
		o.variant = envoyconfigs.FailClosed
	}
	if o.engines == 0 {
		o.engines = 3
	}
	if o.bodyLimit == 0 {
		o.bodyLimit = extproc.DefaultBodyLimit
	}
	if o.reportInt == 0 {
		o.reportInt = 100 * time.Millisecond
	}
	r := &rig{t: t}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	var eps []translate.FixedEngine
	for i := 0; i < o.engines; i++ {
		e := newEngine(t, fmt.Sprintf("e%d", i))
		r.engines = append(r.engines, e)
		w := uint32(1)
		if i < len(o.weights) {
			w = o.weights[i]
		}
		eps = append(eps, translate.FixedEngine{ID: e.id, Address: e.addr(), Weight: float64(w)})
	}
	other := newEngine(t, "qwen0")
	r.cp = xdstest.StartControlPlane(t, "")
	if err := r.cp.SetClusters(nodeID, o.balance,
		translate.FixedClass{Name: "llama", Engines: eps},
		translate.FixedClass{Name: "qwen", Engines: []translate.FixedEngine{{ID: other.id, Address: other.addr(), Weight: 1}}},
	); err != nil {
		t.Fatal(err)
	}
	pol := basePolicy()
	for _, e := range r.engines {
		pol.Engines = append(pol.Engines, &policyv1.EngineRef{Id: e.id, Address: e.addr()})
	}
	if o.cachePlacement {
		// Placement picks from the class's endpoints as the EDS assignment
		// has them (the control plane's translation fills them).
		for _, e := range eps {
			pol.Classes[0].Endpoints = append(pol.Classes[0].Endpoints, &policyv1.Endpoint{EngineId: e.ID, Address: e.Address,
				Weight: uint32(e.Weight), Healthy: true, Exclusive: true})
		}
	}
	if o.policy != nil {
		o.policy(pol)
	}
	if err := r.cp.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r.ext = extproc.New(extproc.Options{BodyLimit: o.bodyLimit, Logger: log, Tokenizers: o.tokenizers,
		CachePlacement: o.cachePlacement, Registry: o.registry})
	conn, err := grpc.NewClient(r.cp.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	sub := &cpclient.Subscriber{Conn: conn, NodeID: nodeID, Apply: r.ext.SetPolicy, Logger: log, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	rep := &cpclient.Reporter{Conn: conn, NodeID: nodeID, Instance: "test", Interval: o.reportInt, Flush: r.ext.Observer().Flush, Logger: log}
	r.wg.Add(2)
	go func() { defer r.wg.Done(); _ = sub.Run(ctx) }()
	go func() { defer r.wg.Done(); _ = rep.Run(ctx) }()

	extPort := envoytest.FreePort(t)
	if !o.noExtProc {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		extPort = lis.Addr().(*net.TCPAddr).Port
		// The service's own gRPC options, codec included.
		r.grpcSrv = grpc.NewServer(service.ServerOptions(o.bodyLimit)...)
		r.ext.Register(r.grpcSrv)
		r.wg.Add(1)
		go func() { defer r.wg.Done(); _ = r.grpcSrv.Serve(lis) }()
	}
	_, xdsPort, _ := net.SplitHostPort(r.cp.Addr)
	var xp int
	fmt.Sscan(xdsPort, &xp)
	listen := envoytest.FreePort(t)
	boot, err := envoyconfigs.Render(envoyconfigs.Params{
		Variant: o.variant, NodeID: nodeID, Region: "eu-west", ListenPort: listen,
		ExtProcPort: extPort, XDSPort: xp, BodyLimit: o.bodyLimit, FallbackCluster: "class-llama", BodyMode: o.bodyMode,
		StreamAbove: o.streamAbove,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Envoy first (envoytest's cleanup runs after this one, but stopping
		// twice is fine), then our goroutines.
		if r.envoy != nil {
			r.envoy.Stop()
		}
		if r.grpcSrv != nil {
			r.grpcSrv.Stop()
		}
		cancel()
		r.wg.Wait()
		conn.Close()
	})
	r.envoy = envoytest.Start(t, envoytest.Options{Bootstrap: boot})
	r.url = fmt.Sprintf("http://127.0.0.1:%d", listen)
	if !o.noExtProc {
		// Ready when the policy arrived and Envoy has the class clusters.
		err = envoytest.Poll(context.Background(), 20*time.Second, 20*time.Millisecond, func() error {
			if p := r.ext.Policy(); p == nil || p.Version != pol.Version {
				return fmt.Errorf("policy not applied")
			}
			res := r.post(chat("ready", "hello"), nil)
			if res.status != 200 {
				return fmt.Errorf("status %d: %s", res.status, res.body)
			}
			return nil
		})
	} else {
		err = envoytest.Poll(context.Background(), 20*time.Second, 20*time.Millisecond, func() error {
			b, err := r.envoy.Admin("/clusters")
			if err != nil {
				return err
			}
			if !bytes.Contains(b, []byte("class-llama::"+r.engines[0].addr())) {
				return fmt.Errorf("no endpoints yet")
			}
			return nil
		})
	}
	if err != nil {
		t.Fatalf("rig not ready: %v", err)
	}
	for _, e := range r.engines {
		e.warmup = e.arrived.Swap(0)
	}
	return r
}

type result struct {
	status int
	body   string
	header http.Header
	engine string
	seen   map[string]string
}

var client = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

func (r *rig) post(body []byte, hdr map[string]string) result {
	return r.postPath("/v1/chat/completions", body, hdr)
}

func (r *rig) postPath(path string, body []byte, hdr map[string]string) result {
	req, _ := http.NewRequest("POST", r.url+path, bytes.NewReader(body))
	req.Header.Set("content-type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return result{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	res := result{status: resp.StatusCode, body: string(b), header: resp.Header}
	var rep engineReply
	if resp.StatusCode == 200 && json.Unmarshal(b, &rep) == nil {
		res.engine, res.seen = rep.Engine, rep.Headers
	}
	return res
}

type msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func chatMsgs(model string, msgs []msg, extra map[string]any) []byte {
	m := map[string]any{"model": model, "messages": msgs, "max_tokens": 16}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return b
}

// chat is a one-turn conversation with a system prompt.
func chat(system, user string) []byte {
	return chatMsgs("llama-3-8b", []msg{{"system", system}, {"user", user}}, nil)
}

// parallel runs f(i) for i in [0,n) on w workers.
func parallel(n, w int, f func(i int)) {
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for k := 0; k < w; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}

// openAIError decodes an OpenAI-format error body.
func openAIError(t *testing.T, body string) (msg, typ, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not an OpenAI error body: %q (%v)", body, err)
	}
	c := ""
	if e.Error.Code != nil {
		c = *e.Error.Code
	}
	return e.Error.Message, e.Error.Type, c
}

// postChunked sends a body without content-length.
func (r *rig) postChunked(path string, body []byte) result {
	req, _ := http.NewRequest("POST", r.url+path, io.MultiReader(bytes.NewReader(body)))
	req.ContentLength = -1
	req.Header.Set("content-type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return result{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, body: string(b), header: resp.Header}
}
