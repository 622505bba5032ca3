package drills

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
)

// serverName is the DNS name in the test control plane's certificate.
const serverName = "control-plane.inferlb.test"

// authFiles are the credentials of one drill stack, generated in the test
// (never committed): a CA, the control plane's server certificate, a
// client certificate for Envoy and ext_proc, and a shared token.
type authFiles struct {
	mode                       string
	ca, serverCert, serverKey  string
	clientCert, clientKey      string
	token, tokenFile           string
	otherCA, otherCert, otherK string // a client certificate from another CA
}

func newAuthFiles(t *testing.T, dir, mode string) *authFiles {
	t.Helper()
	a := &authFiles{mode: mode}
	switch mode {
	case "insecure":
		return a
	case "token":
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		a.token = hex.EncodeToString(b)
		a.tokenFile = filepath.Join(dir, "xds-token")
		if err := os.WriteFile(a.tokenFile, []byte(a.token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return a
	case "mtls":
	default:
		t.Fatalf("auth mode %q", mode)
	}
	caCert, caKey := newCA(t, "inferlb drill CA")
	a.ca = writePEM(t, dir, "ca.crt", "CERTIFICATE", caCert.Raw)
	sc, sk := newLeaf(t, caCert, caKey, "control plane", []string{serverName}, []net.IP{net.IPv4(127, 0, 0, 1)}, x509.ExtKeyUsageServerAuth)
	a.serverCert, a.serverKey = writePEM(t, dir, "server.crt", "CERTIFICATE", sc), writeKey(t, dir, "server.key", sk)
	cc, ck := newLeaf(t, caCert, caKey, nodeID, nil, nil, x509.ExtKeyUsageClientAuth)
	a.clientCert, a.clientKey = writePEM(t, dir, "client.crt", "CERTIFICATE", cc), writeKey(t, dir, "client.key", ck)
	oca, ocaKey := newCA(t, "someone else's CA")
	a.otherCA = writePEM(t, dir, "other-ca.crt", "CERTIFICATE", oca.Raw)
	oc, ok := newLeaf(t, oca, ocaKey, "intruder", nil, nil, x509.ExtKeyUsageClientAuth)
	a.otherCert, a.otherK = writePEM(t, dir, "other.crt", "CERTIFICATE", oc), writeKey(t, dir, "other.key", ok)
	return a
}

func (a *authFiles) serverFlags() []string {
	switch a.mode {
	case "token":
		return []string{"--token-file", a.tokenFile}
	case "mtls":
		return []string{"--tls-cert", a.serverCert, "--tls-key", a.serverKey, "--tls-client-ca", a.ca}
	}
	return []string{"--insecure"}
}

func (a *authFiles) clientFlags() []string {
	switch a.mode {
	case "token":
		return []string{"--control-plane-token-file", a.tokenFile}
	case "mtls":
		return []string{"--control-plane-ca", a.ca, "--control-plane-cert", a.clientCert, "--control-plane-key", a.clientKey,
			"--control-plane-server-name", serverName}
	}
	return []string{"--insecure"}
}

func (a *authFiles) envoyAuth(t *testing.T) envoyconfigs.XDSAuth {
	switch a.mode {
	case "token":
		return envoyconfigs.XDSAuth{Token: a.token}
	case "mtls":
		return envoyconfigs.XDSAuth{CAFile: a.ca, CertFile: a.clientCert, KeyFile: a.clientKey, ServerName: serverName}
	}
	return envoyconfigs.XDSAuth{}
}

func newCA(t *testing.T, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func newLeaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, dns []string, ips []net.IP, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: dns, IPAddresses: ips, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func serial(t *testing.T) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeKey(t *testing.T, dir, name string, k *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, name, "PRIVATE KEY", der)
}
