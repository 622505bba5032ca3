// Package authtest generates the credentials tests need for package auth's
// mechanisms: a CA, a server certificate, client certificates (one from the
// CA, one from another CA) and a token file, written to a test's directory.
// Keys are made in the test and never committed.
package authtest

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
)

// ServerName is the DNS name in the server certificate (with IP 127.0.0.1).
const ServerName = "control-plane.inferlb.test"

// PKI holds the paths of the generated files.
type PKI struct {
	CA                    string // the CA's certificate
	ServerCert, ServerKey string
	ClientCert, ClientKey string // signed by CA
	OtherCert, OtherKey   string // signed by another CA

	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

// NewPKI writes a fresh PKI into dir.
func NewPKI(t testing.TB, dir string) *PKI {
	t.Helper()
	caCert, caKey := newCA(t, "inferlb test CA")
	p := &PKI{CA: writePEM(t, dir, "ca.crt", "CERTIFICATE", caCert.Raw), caCert: caCert, caKey: caKey}
	sc, sk := newLeaf(t, caCert, caKey, "control plane", []string{ServerName}, []net.IP{net.IPv4(127, 0, 0, 1)}, x509.ExtKeyUsageServerAuth)
	p.ServerCert, p.ServerKey = writePEM(t, dir, "server.crt", "CERTIFICATE", sc), writeKey(t, dir, "server.key", sk)
	cc, ck := newLeaf(t, caCert, caKey, "frontend", nil, nil, x509.ExtKeyUsageClientAuth)
	p.ClientCert, p.ClientKey = writePEM(t, dir, "client.crt", "CERTIFICATE", cc), writeKey(t, dir, "client.key", ck)
	oca, ocaKey := newCA(t, "someone else's CA")
	oc, ok := newLeaf(t, oca, ocaKey, "intruder", nil, nil, x509.ExtKeyUsageClientAuth)
	p.OtherCert, p.OtherKey = writePEM(t, dir, "other.crt", "CERTIFICATE", oc), writeKey(t, dir, "other.key", ok)
	return p
}

// RenewServer issues a new server certificate and key from the same CA
// and puts them in place of ServerCert and ServerKey, each written aside
// and renamed over the old one (as a rotation tool does). It returns the
// new certificate (DER).
func (p *PKI) RenewServer(t testing.TB) []byte {
	t.Helper()
	sc, sk := newLeaf(t, p.caCert, p.caKey, "control plane", []string{ServerName}, []net.IP{net.IPv4(127, 0, 0, 1)}, x509.ExtKeyUsageServerAuth)
	dir := filepath.Dir(p.ServerCert)
	for _, f := range []struct{ tmp, to string }{
		{writePEM(t, dir, "server.crt.new", "CERTIFICATE", sc), p.ServerCert},
		{writeKey(t, dir, "server.key.new", sk), p.ServerKey},
	} {
		if err := os.Rename(f.tmp, f.to); err != nil {
			t.Fatal(err)
		}
	}
	return sc
}

// TokenFile writes a fresh random token to dir/name and returns the path
// and the token.
func TokenFile(t testing.TB, dir, name string) (path, token string) {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	token = hex.EncodeToString(b)
	path = filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, token
}

func newCA(t testing.TB, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	der, key := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: cn},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, nil, nil)
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func newLeaf(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, dns []string, ips []net.IP, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	return issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: cn},
		DNSNames: dns, IPAddresses: ips, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}, ca, caKey)
}

// issue makes a P-256 key and a certificate for it from tmpl, valid from an
// hour ago for a day, signed by parent (self-signed when parent is nil).
func issue(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial(t)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeKey(t testing.TB, dir, name string, k *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, name, "PRIVATE KEY", der)
}

// CA is a certificate authority that issues client certificates, for
// rotation drills that move clients to a new CA.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a new CA.
func NewCA(t testing.TB, cn string) *CA {
	t.Helper()
	c, k := newCA(t, cn)
	return &CA{cert: c, key: k}
}

// Authority returns the PKI's own CA (the one its certificates chain to).
func (p *PKI) Authority() *CA { return &CA{cert: p.caCert, key: p.caKey} }

// PEM is the CA's certificate, PEM-encoded.
func (c *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw})
}

// Client issues a client certificate: the certificate and key PEM-encoded,
// and the certificate's serial number in lower-case hex (as Envoy's
// /certs shows it).
func (c *CA) Client(t testing.TB, cn string) (certPEM, keyPEM []byte, serialHex string) {
	t.Helper()
	der, k := newLeaf(t, c.cert, c.key, cn, nil, nil, x509.ExtKeyUsageClientAuth)
	kd, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}), leaf.SerialNumber.Text(16)
}
