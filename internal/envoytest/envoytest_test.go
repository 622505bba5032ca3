package envoytest

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/internal/envoyrun"
)

// The setup script's promise: the Envoy it installed runs, and is 1.40.x.
func TestEnvoyVersion(t *testing.T) {
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	if !strings.Contains(string(out), "/1.40.") {
		t.Fatalf("want Envoy 1.40.x, got %s", out)
	}
}

// A static Envoy answers a direct response on its listener: the harness
// starts a real Envoy and knows when it is ready.
func TestStartServesDirectResponse(t *testing.T) {
	port := FreePort(t)
	e := Start(t, Options{Bootstrap: fmt.Sprintf(`
static_resources:
  listeners:
  - name: l
    address: { socket_address: { address: 127.0.0.1, port_value: %d } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: t
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                direct_response: { status: 200, body: { inline_string: "pong" } }
          http_filters:
          - name: envoy.filters.http.router
            typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
`, port)})
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "pong" {
		t.Fatalf("got %d %q", resp.StatusCode, b)
	}
	if st, err := e.ServerState(); err != nil || st != "LIVE" {
		t.Fatalf("state %q %v", st, err)
	}
}

// An Envoy that refuses its bootstrap fails Start with the end of its log,
// which holds what Envoy writes to stderr as well as its own log.
func TestStartFailureShowsEnvoysLog(t *testing.T) {
	if _, err := Binary(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	_, err := envoyrun.Start(Options{Bootstrap: "static_resources: {no_such_field: 1}\n"}, dir)
	if err == nil || !strings.Contains(err.Error(), "envoy exited during start") || !strings.Contains(err.Error(), "no_such_field") {
		t.Fatalf("err = %v, want Envoy's exit with its complaint about no_such_field", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "envoy.log")); err != nil || !strings.Contains(string(b), "no_such_field") {
		t.Fatalf("envoy.log (%v): %q", err, b)
	}
}
