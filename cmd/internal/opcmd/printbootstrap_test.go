package opcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/extproc/service"
	"github.com/inferlb/inferlb/xds/auth"
)

// --print-bootstrap offers the two frontend variants only: the template's
// direct variant (no ext_proc) is for measurements and tests.
func TestPrintBootstrapVariants(t *testing.T) {
	cfg := service.Config{Listen: "127.0.0.1:9002", ControlPlane: "127.0.0.1:18000", NodeID: "fe", Region: "r",
		BodyLimit: 1 << 20, Auth: auth.Client{Insecure: true}}
	for _, c := range []struct {
		variant, fallback, bodyMode string
		streamAbove                 int
		want, notWant               string
	}{
		{"fail-closed", "", "", 1 << 20, "failure_mode_allow: false", ""},
		{"fail-open", "inferlb_chat", "", 1 << 20, "failure_mode_allow: true", ""},
		{"direct", "inferlb_chat", "", 1 << 20, `--print-bootstrap "direct": want fail-closed or fail-open`, ""},
		{"fail-closed", "", "buffered", 1 << 20, "request_body_mode: BUFFERED", ""},
		// The upload timeout (default 20 s) is how far Envoy lets ext_proc
		// extend its timer.
		{"fail-closed", "", "streamed", 1 << 20, `max_message_timeout: "20s"`, ""},
		{"fail-closed", "", "whole", 1 << 20, `--envoy-body-mode "whole": want buffered or streamed`, ""},
		// Buffered, the bodies from --envoy-stream-above on are streamed
		// by a route of their own; 0 streams none.
		{"fail-closed", "", "", 1 << 20, "range_match: { start: 1048576, end: 9223372036854775807 }", ""},
		{"fail-closed", "", "", 0, "request_body_mode: BUFFERED", "ExtProcPerRoute"},
		{"fail-closed", "", "", -1, "--envoy-stream-above -1: want a size in bytes, or 0 for none", ""},
	} {
		var out bytes.Buffer
		cmd := &cobra.Command{}
		cmd.SetOut(&out)
		err := printFrontendBootstrap(cmd, cfg, c.variant, c.fallback, "", "", c.bodyMode, 10000, c.streamAbove)
		got := out.String()
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, c.want) || c.notWant != "" && strings.Contains(got, c.notWant) {
			t.Errorf("%s, stream above %d: got %.200q, want %q and not %q", c.variant, c.streamAbove, got, c.want, c.notWant)
		}
	}
}

// TestPrintBootstrapSDS: --envoy-sds-dir writes the SDS resource files
// naming Envoy's credential files (absolute) and the bootstrap reads them
// from there; without TLS credentials it is refused.
func TestPrintBootstrapSDS(t *testing.T) {
	dir := t.TempDir()
	// Mutual TLS alone leaves ext_proc's own port without a credential:
	// Envoy gets the listen token to send there.
	tok := filepath.Join(dir, "listen-token")
	if err := os.WriteFile(tok, []byte("listen-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := service.Config{Listen: "127.0.0.1:9002", ControlPlane: "127.0.0.1:18000", NodeID: "fe", Region: "r",
		BodyLimit: 1 << 20, ListenTokenFile: tok, Auth: auth.Client{CAFile: "tls/ca.crt", CertFile: "tls/tls.crt", KeyFile: "tls/tls.key"}}
	var out bytes.Buffer
	cmd := &cobra.Command{}
	cmd.SetOut(&out)
	sds := filepath.Join(dir, "sds")
	if err := printFrontendBootstrap(cmd, cfg, "fail-closed", "", "", sds, "", 10000, 1<<20); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), filepath.Join(sds, "xds-client-cert.yaml")) || strings.Contains(out.String(), "tls_certificates:") {
		t.Errorf("the bootstrap does not read Envoy's certificate through SDS:\n%s", out.String())
	}
	b, err := os.ReadFile(filepath.Join(sds, "xds-client-cert.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs("tls/tls.crt")
	if !strings.Contains(string(b), `"`+abs+`"`) || !strings.Contains(string(b), "watched_directory") {
		t.Errorf("SDS file:\n%s\nwant the certificate's absolute path %s, watched", b, abs)
	}
	cfg.Auth = auth.Client{Insecure: true}
	if err := printFrontendBootstrap(cmd, cfg, "fail-closed", "", "", sds, "", 10000, 1<<20); err == nil || !strings.Contains(err.Error(), "--envoy-sds-dir") {
		t.Errorf("SDS without TLS credentials: %v, want an error naming --envoy-sds-dir", err)
	}
}
