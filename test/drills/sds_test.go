package drills

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/auth/authtest"
)

// secretVolume is a directory laid out as the kubelet lays out a mounted
// Kubernetes Secret: each key a symlink to ..data/key, ..data a symlink to
// a timestamped directory, and an update an atomic swap of ..data.
type secretVolume struct {
	dir string
	gen int
}

func newSecretVolume(t *testing.T, dir string, files map[string][]byte) *secretVolume {
	t.Helper()
	v := &secretVolume{dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	v.update(t, files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// update writes the files into a new directory and swaps ..data to it in
// one rename, as the kubelet's atomic writer does.
func (v *secretVolume) update(t *testing.T, files map[string][]byte) {
	t.Helper()
	v.gen++
	ts := fmt.Sprintf("..%d", v.gen)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(v.dir, ts, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// envoyCertSerials reads Envoy's /certs: the serial numbers of the
// certificate chains and of the CA certificates in use.
func envoyCertSerials(s *stack) (chain, ca []string, err error) {
	var doc struct {
		Certificates []struct {
			CACert []struct {
				SerialNumber string `json:"serial_number"`
			} `json:"ca_cert"`
			CertChain []struct {
				SerialNumber string `json:"serial_number"`
			} `json:"cert_chain"`
		} `json:"certificates"`
	}
	b, err := s.envoy.Admin("/certs")
	if err != nil {
		return nil, nil, err
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, nil, fmt.Errorf("/certs: %w", err)
	}
	for _, c := range doc.Certificates {
		for _, x := range c.CertChain {
			chain = append(chain, strings.TrimLeft(strings.ToLower(x.SerialNumber), "0"))
		}
		for _, x := range c.CACert {
			ca = append(ca, strings.TrimLeft(strings.ToLower(x.SerialNumber), "0"))
		}
	}
	return chain, ca, nil
}

// TestDrillEnvoyCredentialsRotateLive: Envoy's own certificate, key and CA
// for the control plane come from file-based SDS over a Kubernetes-style
// Secret volume. Under traffic the Secret moves Envoy to a certificate of
// a new CA (the control plane trusting both meanwhile); Envoy takes it
// without a restart; then the control plane trusts the new CA alone and
// restarts, and Envoy's new ADS connection is accepted: it presented the
// new certificate. No request fails.
func TestDrillEnvoyCredentialsRotateLive(t *testing.T) {
	dir := t.TempDir()
	clientCA := filepath.Join(dir, "cp-client-ca.pem") // the control plane's --tls-client-ca
	var vol *secretVolume
	var pki *authtest.PKI
	s := startStack(t, stackOptions{auth: "mtls", cpArgs: []string{"--tls-client-ca", clientCA},
		onAuth: func(p *authtest.PKI) { pki = p; writeFile(t, clientCA, readFile(t, p.CA)) },
		envoy: func(p *envoyconfigs.Params) {
			caPEM, certPEM, keyPEM := readFile(t, pki.CA), readFile(t, pki.ClientCert), readFile(t, pki.ClientKey)
			vol = newSecretVolume(t, filepath.Join(dir, "envoy-tls"), map[string][]byte{"ca.crt": caPEM, "tls.crt": certPEM, "tls.key": keyPEM})
			p.XDSAuth.CAFile = filepath.Join(vol.dir, "ca.crt")
			p.XDSAuth.CertFile = filepath.Join(vol.dir, "tls.crt")
			p.XDSAuth.KeyFile = filepath.Join(vol.dir, "tls.key")
			p.XDSAuth.SDSDir = filepath.Join(dir, "envoy-sds")
			if err := envoyconfigs.WriteSDS(p.XDSAuth); err != nil {
				t.Fatal(err)
			}
		},
	})
	if !strings.Contains(s.bootstrap, "path_config_source") {
		t.Fatal("the bootstrap does not serve Envoy's credentials through SDS")
	}
	tr := s.startTraffic(trafficOptions{rate: 4, maxTokens: 8})
	tr.waitSent(t, 8, 20*time.Second)

	// The new CA, and Envoy's certificate from it. The control plane
	// trusts both CAs first (its files are re-read live), and ext_proc
	// moves to a certificate of the new CA too (its files are live too).
	next := authtest.NewCA(t, "inferlb test CA 2")
	writeFile(t, clientCA, append(readFile(t, pki.CA), next.PEM()...))
	certPEM, keyPEM, serial := next.Client(t, "frontend")
	extCert, extKey, _ := next.Client(t, "ext_proc")
	renameOver(t, pki.ClientCert, extCert)
	renameOver(t, pki.ClientKey, extKey)
	vol.update(t, map[string][]byte{"ca.crt": readFile(t, pki.CA), "tls.crt": certPEM, "tls.key": keyPEM})
	rotated := time.Now()
	if err := envoytest.Poll(context.Background(), 20*time.Second, 50*time.Millisecond, func() error {
		chain, _, err := envoyCertSerials(s)
		if err != nil {
			return err
		}
		for _, c := range chain {
			if c == serial {
				return nil
			}
		}
		return fmt.Errorf("Envoy's certificates %v, not yet the new one %s", chain, serial)
	}); err != nil {
		t.Fatalf("Envoy did not take the rotated Secret: %v", err)
	}
	t.Logf("Envoy took the new certificate %.2f s after the Secret changed, without a restart", time.Since(rotated).Seconds())

	// Only the new CA now; the control plane restarts, so every client
	// connects anew: Envoy's ADS connection is accepted only with the new
	// certificate.
	writeFile(t, clientCA, next.PEM())
	cxBefore := envoyStat(t, s, "cluster.inferlb_xds.upstream_cx_total")
	s.procs.Stop(s.cps[0])
	if err := s.procs.Restart(s.cps[0]); err != nil {
		t.Fatal(err)
	}
	s.waitCP(0)
	if err := envoytest.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
		if k, err := s.adsReplica(); err != nil || k != 0 {
			return fmt.Errorf("Envoy's ADS stream is not on the restarted control plane (%v)", err)
		}
		if c := envoyStat(t, s, "cluster.inferlb_xds.upstream_cx_total"); c == cxBefore {
			return fmt.Errorf("no new ADS connection yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("Envoy did not reconnect with its new certificate: %v", err)
	}
	if n, err := metric(s.cpAdmin[0]+"/metrics", "inferlb_xds_auth_failures_total", `method="tls-handshake"`); err == nil && n > 0 {
		t.Errorf("the restarted control plane refused %v handshakes: someone presented an old certificate", n)
	}
	tr.waitSent(t, 30, 30*time.Second)
	tally := tr.stop()
	t.Logf("traffic across Envoy's credential rotation and the control plane's restart: %s", tally)
	if tally.all.ok != tally.sent {
		t.Errorf("requests failed: %s", tally)
	}
}

func envoyStat(t *testing.T, s *stack, name string) string {
	t.Helper()
	b, err := s.envoy.Admin("/stats?filter=^" + name + "$")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeFile writes aside and renames over (a reader never sees half).
func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	renameOver(t, p, b)
}

func renameOver(t *testing.T, p string, b []byte) {
	t.Helper()
	tmp := p + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}
