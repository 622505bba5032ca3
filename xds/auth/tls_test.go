package auth

import (
	"bytes"
	"crypto/tls"
	"os"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/xds/auth/authtest"
)

// parseKeyPair takes operator files that may be anything mid-rotation: it
// never panics, it accepts exactly what tls.X509KeyPair accepts, and its
// errors name the file at fault (or both when they do not match).
func FuzzParseKeyPair(f *testing.F) {
	pki := authtest.NewPKI(f, f.TempDir())
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	cert, key, other := read(pki.ServerCert), read(pki.ServerKey), read(pki.OtherKey)
	f.Add(cert, key)
	f.Add(cert, other)
	f.Add(cert[:len(cert)/2], key)
	f.Add(cert, key[:len(key)/2])
	f.Add(key, cert)
	f.Add([]byte{}, []byte{})
	c, k := file{"--tls-cert", "c.pem"}, file{"--tls-key", "k.pem"}
	f.Fuzz(func(t *testing.T, certPEM, keyPEM []byte) {
		got, err := parseKeyPair(c, k, certPEM, keyPEM)
		want, wantErr := tls.X509KeyPair(certPEM, keyPEM)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("parseKeyPair: %v; tls.X509KeyPair: %v", err, wantErr)
		}
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "--tls-cert c.pem") && !strings.HasPrefix(msg, "--tls-key k.pem") {
				t.Fatalf("error names no file: %v", err)
			}
			return
		}
		if !bytes.Equal(got.Certificate[0], want.Certificate[0]) || got.Leaf == nil {
			t.Fatal("a different certificate than tls.X509KeyPair's, or no leaf")
		}
	})
}

// The rotation's middle state is told apart from a bad file.
func TestParseKeyPairNamesTheFile(t *testing.T) {
	pki := authtest.NewPKI(t, t.TempDir())
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cert, key := read(pki.ServerCert), read(pki.ServerKey)
	c, k := file{"--tls-cert", "c.pem"}, file{"--tls-key", "k.pem"}
	for _, tc := range []struct {
		name      string
		cert, key []byte
		want      string
	}{
		{"good", cert, key, ""},
		{"half-written certificate", cert[:len(cert)/2], key, "--tls-cert c.pem: no PEM certificate"},
		{"corrupt certificate", bytes.Replace(cert, []byte("MII"), []byte("MIA"), 1), key, "--tls-cert c.pem: certificate 1:"},
		{"half-written key", cert, key[:len(key)/2], "--tls-key k.pem: no PEM private key"},
		{"certificate as key", cert, cert, "--tls-key k.pem: no PEM private key"},
		{"another certificate's key", cert, read(pki.OtherKey), "--tls-cert c.pem and --tls-key k.pem do not go together"},
	} {
		_, err := parseKeyPair(c, k, tc.cert, tc.key)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
