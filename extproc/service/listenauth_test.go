package service

import (
	"strings"
	"testing"

	"github.com/inferlb/inferlb/xds/auth"
)

// ext_proc's port takes Envoy's access logs, evidence that moves weights:
// with a control plane that takes credentials it is never open (issue
// 27). Which token file it checks, by configuration.
func TestListenToken(t *testing.T) {
	mtls := auth.Client{CAFile: "ca", CertFile: "c", KeyFile: "k"}
	for _, c := range []struct {
		name string
		cfg  Config
		want string
		err  string
	}{
		{"no control plane", Config{}, "", ""},
		{"insecure", Config{ControlPlane: "cp:1", Auth: auth.Client{Insecure: true}}, "", ""},
		{"the control-plane token", Config{ControlPlane: "cp:1", Auth: auth.Client{TokenFile: "cp-token"}}, "cp-token", ""},
		{"its own token", Config{ControlPlane: "cp:1", Auth: auth.Client{TokenFile: "cp-token"}, ListenTokenFile: "own"}, "own", ""},
		{"mutual TLS and its own token", Config{ControlPlane: "cp:1", Auth: mtls, ListenTokenFile: "own"}, "own", ""},
		{"mutual TLS alone", Config{ControlPlane: "cp:1", Auth: mtls}, "", "--listen-token-file"},
	} {
		got, err := c.cfg.ListenToken()
		if got != c.want || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: %q, %v; want %q and an error containing %q", c.name, got, err, c.want, c.err)
		}
	}
}
