package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/lni/goutils/leaktest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/service"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/auth"
	"github.com/inferlb/inferlb/xds/xdstest"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// startService writes rp as the policy file and runs the service with cfg
// (Listen, PolicyFile, Logger and Ready filled in here) until it serves. stop
// cancels it and returns Run's error.
func startService(t *testing.T, rp *policyv1.RoutingPolicy, cfg service.Config) (grpcAddr, httpAddr string, stop func() error) {
	t.Helper()
	pf := filepath.Join(t.TempDir(), "p.json")
	b, err := protojson.Marshal(rp)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.PolicyFile = "127.0.0.1:0", pf
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ready := make(chan [2]string, 1)
	cfg.Ready = func(g, h string) { ready <- [2]string{g, h} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, cfg) }()
	select { // a Run that fails at start never calls Ready: fail, don't hang
	case a := <-ready:
		return a[0], a[1], func() error {
			http.DefaultClient.CloseIdleConnections()
			cancel()
			return <-done
		}
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	}
	return "", "", nil
}

// The service starts with the policy file, switches to the control plane's
// policy, serves metrics and health, and stops cleanly when cancelled.
func TestRun(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	cp := xdstest.StartControlPlane(t, "")
	_, h, stop := startService(t, &policyv1.RoutingPolicy{NodeId: "n1", Version: "file",
		Classes: []*policyv1.ClassPolicy{{Name: "c", Cluster: "cl", Model: "m"}}},
		service.Config{HTTPListen: "127.0.0.1:0", ControlPlane: cp.Addr, NodeID: "n1", BodyLimit: 1 << 20,
			ReportInterval: 50 * time.Millisecond, Auth: auth.Client{Insecure: true}})
	if code, body := get(t, "http://"+h+"/policy"); code != 200 || !strings.Contains(body, `"version":"file"`) {
		t.Fatalf("policy: %d %s", code, body)
	}
	if err := cp.SetPolicy(&policyv1.RoutingPolicy{NodeId: "n1", Version: "cp-7",
		Classes: []*policyv1.ClassPolicy{{Name: "c", Cluster: "cl", Model: "m"}}}); err != nil {
		t.Fatal(err)
	}
	if err := envoytest.Poll(context.Background(), 5*time.Second, 10*time.Millisecond, func() error {
		if _, body := get(t, "http://"+h+"/policy"); !strings.Contains(body, `"version":"cp-7"`) || !strings.Contains(body, `"control_plane_connected":true`) {
			return fmt.Errorf("control plane policy not applied: %s", body)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, "http://"+h+"/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	if _, m := get(t, "http://"+h+"/metrics"); !strings.Contains(m, "inferlb_extproc_policy_version_hash "+strconv.FormatFloat(extproc.VersionHash("cp-7"), 'g', -1, 64)+"\n") {
		t.Fatalf("metrics lack the policy version")
	}
	// The admin port is read-only: POST and friends are 405, not GET.
	for _, path := range []string{"/healthz", "/metrics", "/policy"} {
		resp, err := http.Post("http://"+h+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST %s: %d, want 405", path, resp.StatusCode)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestBadPolicyFile(t *testing.T) {
	pf := filepath.Join(t.TempDir(), "p.json")
	_ = os.WriteFile(pf, []byte(`{"classes":[{"name":"c"}]}`), 0o644)
	err := service.Run(context.Background(), service.Config{Listen: "127.0.0.1:0", PolicyFile: pf, BodyLimit: 1024})
	if err == nil || !strings.Contains(err.Error(), "empty model") {
		t.Fatalf("want a precise error, got %v", err)
	}
}

// A Config without BodyLimit accepts bodies up to extproc.DefaultBodyLimit
// end to end: gRPC's receive limit follows the same default, so a 2 MiB body
// gets a routing decision, not a failed stream.
func TestDefaultBodyLimit(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	addr, _, stop := startService(t, &policyv1.RoutingPolicy{Version: "file",
		Classes: []*policyv1.ClassPolicy{{Name: "c", Cluster: "cl", Model: "m"}}}, service.Config{})
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(sctx, grpc.MaxCallSendMsgSize(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	hdr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"}}}}}}
	if err := st.Send(hdr); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 2<<20) + `"}]}`
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
		Body: []byte(body), EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("2 MiB body under the default limit: %v", err)
	}
	if resp.GetRequestBody() == nil {
		t.Fatalf("want a routing decision, got %v", resp.GetImmediateResponse().GetStatus())
	}
	_ = st.CloseSend()
}

func TestNoListenAddress(t *testing.T) {
	err := service.Run(context.Background(), service.Config{})
	if err == nil || !strings.Contains(err.Error(), "listen address") {
		t.Fatalf("want an error naming the listen address, got %v", err)
	}
}

// A listen address that cannot be used names its flag and the address.
func TestBadListenAddressNamesTheFlag(t *testing.T) {
	for _, tc := range []struct {
		cfg  service.Config
		want string
	}{
		{service.Config{Listen: "bad", BodyLimit: 1024}, `--listen) "bad"`},
		{service.Config{Listen: "127.0.0.1:0", HTTPListen: "bad", BodyLimit: 1024}, `--http-listen) "bad"`},
	} {
		if err := service.Run(context.Background(), tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want it to contain %q", tc.cfg, err, tc.want)
		}
	}
}

// /policy is JSON whatever the control plane put in the version string.
func TestPolicyEndpointIsJSON(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	_, h, stop := startService(t, &policyv1.RoutingPolicy{Version: "v\x01\x7f é",
		Classes: []*policyv1.ClassPolicy{{Name: "c", Cluster: "cl", Model: "m"}}}, service.Config{HTTPListen: "127.0.0.1:0"})
	code, body := get(t, "http://"+h+"/policy")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var got struct {
		Version string `json:"version"`
		Classes int    `json:"classes"`
	}
	if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil {
		t.Fatalf("/policy: %d %q: %v", code, body, err)
	}
	if got.Version != "v\x01\x7f é" || got.Classes != 1 {
		t.Fatalf("/policy: %+v", got)
	}
}

func TestNegativeDurations(t *testing.T) {
	for _, cfg := range []service.Config{
		{Listen: "127.0.0.1:0", ReportInterval: -time.Second},
		{Listen: "127.0.0.1:0", ShutdownGrace: -time.Second},
	} {
		// Bounded: a Run that accepted the config would serve until cancelled.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		err := service.Run(ctx, cfg)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("%+v: want an error, got %v", cfg, err)
		}
	}
}

// Body-memory settings that cannot work are refused before anything
// listens: negative bounds, a body-memory bound below one body of the
// limit (every such body would be answered 503), and an upload timeout
// within ext_proc's upload grace.
func TestBadBodyMemory(t *testing.T) {
	for _, c := range []struct {
		cfg  service.Config
		want string
	}{
		{service.Config{Listen: "127.0.0.1:0", MaxBodyMemory: -1}, "negative body memory bound"},
		{service.Config{Listen: "127.0.0.1:0", IdleMemory: -1}, "negative body memory bound"},
		{service.Config{Listen: "127.0.0.1:0", BodyLimit: 1 << 20, MaxBodyMemory: 1 << 19}, "below the body limit"},
		// 0 is the default (512 MiB), below a 1 GiB body limit.
		{service.Config{Listen: "127.0.0.1:0", BodyLimit: 1 << 30}, "below the body limit"},
		// An upload timeout within the grace extends nothing.
		{service.Config{Listen: "127.0.0.1:0", UploadTimeout: 50 * time.Millisecond}, "upload timeout 50ms (--upload-timeout) must be longer than the upload grace 100ms"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c.cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		err := service.Run(ctx, c.cfg)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: want an error containing %q, got %v", c.cfg, c.want, err)
		}
	}
}

// --mode endpoint-picker: the service serves the picker (its health
// services; readiness follows the control plane's policy, applied live)
// and refuses an unknown mode or negative fallbacks.
func TestRunEndpointPicker(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	cp := xdstest.StartControlPlane(t, "")
	g, _, stop := startService(t, &policyv1.RoutingPolicy{NodeId: "n1", Version: "file",
		Classes: []*policyv1.ClassPolicy{{Name: "c", Cluster: "cl", Model: "m"}}},
		service.Config{Mode: service.ModeEndpointPicker, PickerFallbacks: 1, ControlPlane: cp.Addr, NodeID: "n1", BodyLimit: 1 << 20,
			Auth: auth.Client{Insecure: true}})
	conn, err := grpc.NewClient(g, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s: %v %v, want SERVING (a policy is held)", svc, r, err)
		}
	}
	conn.Close()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, c := range []service.Config{{Listen: "127.0.0.1:0", Mode: "sidecar"}, {Listen: "127.0.0.1:0", Mode: service.ModeEndpointPicker, PickerFallbacks: -1}} {
		if err := service.Run(context.Background(), c); err == nil || !strings.Contains(err.Error(), "--") {
			t.Errorf("%+v: %v, want an error naming the flag", c, err)
		}
	}
}
