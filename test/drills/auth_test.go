package drills

import (
	"testing"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/xds/auth/authtest"
)

// authFiles are the credentials of one drill stack: a shared token, or a
// PKI for mutual TLS (both generated in the test, never committed).
type authFiles struct {
	mode             string
	token, tokenFile string
	pki              *authtest.PKI
	// extToken(File) is what Envoy sends to ext_proc's port: the shared
	// token (token mode), or one of its own (mutual TLS: ext_proc's port
	// takes a token).
	extToken, extTokenFile string
}

func newAuthFiles(t *testing.T, dir, mode string) *authFiles {
	t.Helper()
	a := &authFiles{mode: mode}
	switch mode {
	case "insecure":
	case "token":
		a.tokenFile, a.token = authtest.TokenFile(t, dir, "xds-token")
		a.extTokenFile, a.extToken = a.tokenFile, a.token
	case "mtls":
		a.pki = authtest.NewPKI(t, dir)
		a.extTokenFile, a.extToken = authtest.TokenFile(t, dir, "extproc-token")
	default:
		t.Fatalf("auth mode %q", mode)
	}
	return a
}

func (a *authFiles) serverFlags() []string {
	switch a.mode {
	case "token":
		return []string{"--token-file", a.tokenFile}
	case "mtls":
		return []string{"--tls-cert", a.pki.ServerCert, "--tls-key", a.pki.ServerKey, "--tls-client-ca", a.pki.CA}
	}
	return []string{"--insecure"}
}

func (a *authFiles) clientFlags() []string {
	switch a.mode {
	case "token":
		return []string{"--control-plane-token-file", a.tokenFile}
	case "mtls":
		return []string{"--control-plane-ca", a.pki.CA, "--control-plane-cert", a.pki.ClientCert, "--control-plane-key", a.pki.ClientKey,
			"--control-plane-server-name", authtest.ServerName, "--listen-token-file", a.extTokenFile}
	}
	return []string{"--insecure"}
}

func (a *authFiles) envoyAuth() envoyconfigs.XDSAuth {
	switch a.mode {
	case "token":
		return envoyconfigs.XDSAuth{Token: a.token}
	case "mtls":
		return envoyconfigs.XDSAuth{CAFile: a.pki.CA, CertFile: a.pki.ClientCert, KeyFile: a.pki.ClientKey, ServerName: authtest.ServerName}
	}
	return envoyconfigs.XDSAuth{}
}
