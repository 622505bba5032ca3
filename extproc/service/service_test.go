package service_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"google.golang.org/protobuf/encoding/protojson"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/cpfake"
	"github.com/inferlb/inferlb/extproc/service"
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

// The service starts with the policy file, switches to the control plane's
// policy, serves metrics and health, and stops cleanly when cancelled.
func TestRun(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	cp := cpfake.Start(t, "")
	dir := t.TempDir()
	pf := filepath.Join(dir, "p.json")
	b, _ := protojson.Marshal(&policyv1.RoutingPolicy{NodeId: "n1", Version: "file",
		Classes: []*policyv1.ClassPolicy{{Name: "c", Cluster: "cl", Model: "m"}}})
	if err := os.WriteFile(pf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, service.Config{Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", ControlPlane: cp.Addr,
			NodeID: "n1", PolicyFile: pf, BodyLimit: 1 << 20, ReportInterval: 50 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready:  func(_, h string) { ready <- h }})
	}()
	h := <-ready
	if code, body := get(t, "http://"+h+"/policy"); code != 200 || !strings.Contains(body, `"version":"file"`) {
		t.Fatalf("policy: %d %s", code, body)
	}
	if err := cp.SetPolicy(&policyv1.RoutingPolicy{NodeId: "n1", Version: "cp-7",
		Classes: []*policyv1.ClassPolicy{{Name: "c", Cluster: "cl", Model: "m"}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, body := get(t, "http://"+h+"/policy")
		if strings.Contains(body, `"version":"cp-7"`) && strings.Contains(body, `"control_plane_connected":true`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("control plane policy not applied: %s", body)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	if code, _ := get(t, "http://"+h+"/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	if _, m := get(t, "http://"+h+"/metrics"); !strings.Contains(m, `inferlb_extproc_policy_info{version="cp-7"} 1`) {
		t.Fatalf("metrics lack the policy version")
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
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
