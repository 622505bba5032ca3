package main

import (
	"bytes"
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
		variant, fallback, want string
	}{
		{"fail-closed", "", "failure_mode_allow: false"},
		{"fail-open", "inferlb_chat", "failure_mode_allow: true"},
		{"direct", "inferlb_chat", `--print-bootstrap "direct": want fail-closed or fail-open`},
	} {
		var out bytes.Buffer
		cmd := &cobra.Command{}
		cmd.SetOut(&out)
		err := printFrontendBootstrap(cmd, cfg, c.variant, c.fallback, "", 10000)
		got := out.String()
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, c.want) {
			t.Errorf("%s: got %.200q, want %q", c.variant, got, c.want)
		}
	}
}
