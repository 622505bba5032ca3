package drills

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/tools/demo"
)

// The demo's Envoy admin must not take POST /healthcheck/fail (or
// /quitquitquit, /runtime_modify) from anyone who reaches it. The demo's
// bootstrap serves a read-only admin on its port (GET of /clusters,
// /stats, /ready, /server_info; the real admin on a unix socket of mode
// 0600): the mutations are refused 403, the frontend stays LIVE and
// serving, and the reads the dashboard needs still work.
//
// With Envoy's own admin block on the port, POST /healthcheck/fail is
// answered 200 and /ready turns 503.
func TestDrillDemoAdminReadOnly(t *testing.T) {
	s := startStack(t, stackOptions{})
	bin, err := envoytest.Binary()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	listen, admin := envoytest.FreePort(t), envoytest.FreePort(t)
	boot, err := demo.FrontendBootstrap(nodeID, "east", listen, port(t, s.extGRPC), port(t, s.cpXDS[0]), admin, filepath.Join(dir, "admin.sock"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, []byte(boot), 0o600); err != nil {
		t.Fatal(err)
	}
	envoy := s.startProc("envoy-demo", bin, "-c", cfg, "--concurrency", "1", "--disable-hot-restart", "--use-dynamic-base-id",
		"--log-level", "warning", "--drain-time-s", "1")

	base := fmt.Sprintf("http://127.0.0.1:%d", admin)
	do := func(method, path string) (int, string) {
		req, _ := http.NewRequest(method, base+path, nil)
		resp, err := adminClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if err := envoytest.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
		if code, body := do("GET", "/ready"); code != 200 {
			return fmt.Errorf("GET /ready: %d %s", code, body)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, logOf(envoy))
	}
	refused := 0
	for _, m := range []struct{ method, path string }{{"POST", "/healthcheck/fail"}, {"POST", "/quitquitquit"},
		{"POST", "/runtime_modify?x=1"}, {"POST", "/logging?level=trace"}, {"GET", "/config_dump"}, {"POST", "/clusters"}} {
		if code, body := do(m.method, m.path); code != http.StatusForbidden {
			t.Errorf("%s %s: %d %q, want 403", m.method, m.path, code, body)
		} else {
			refused++
		}
	}
	for _, p := range []string{"/ready", "/clusters?format=json", "/stats?filter=^cluster.inferlb_xds", "/server_info"} {
		if code, body := do("GET", p); code != 200 {
			t.Errorf("GET %s: %d %.200s", p, code, body)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "admin.sock")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the real admin's socket: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	// Still serving.
	c := newClient(fmt.Sprintf("http://127.0.0.1:%d", listen))
	defer c.close()
	if err := envoytest.Poll(context.Background(), 30*time.Second, 200*time.Millisecond, func() error {
		if r := c.do(context.Background(), request{prompt: "still there?", maxTokens: 2}); r.outcome != outcomeOK {
			return fmt.Errorf("request through the demo's Envoy: %s", r)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	code, body := do("GET", "/ready")
	t.Logf("%d admin mutations refused 403; afterwards GET /ready: %d %s", refused, code, strings.TrimSpace(body))
	if code != 200 {
		t.Errorf("Envoy no longer ready after the refused mutations: %d", code)
	}
}
