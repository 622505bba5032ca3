package auth_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/internal/syncbuf"
	"github.com/inferlb/inferlb/xds/auth"
	"github.com/inferlb/inferlb/xds/auth/authtest"
)

// The control plane's certificate rotates to one of a new CA (which the
// clients trust already) without a restart: cert and key written one after
// the other (the mismatched middle keeps the old pair and is reported, then
// the pair is taken), an established stream goes on over its connection, a
// garbage file keeps the current certificate and is logged and counted, and
// a rotated client CA refuses the old clients' next connections.
func TestServerTLSRotation(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	auth.SetCheckEvery(t, 10*time.Millisecond)
	old, next := authtest.NewPKI(t, t.TempDir()), authtest.NewPKI(t, t.TempDir())
	files := stage(t, old.ServerCert, old.ServerKey, old.CA)
	cert, key, clientCA := files[0], files[1], files[2]
	reg, logs, reloads := newReloads(t)
	addr, hs := serveHealth(t, auth.Server{CertFile: cert, KeyFile: key, ClientCAFile: clientCA, Reloads: reloads})
	// The clients trust both CAs: the new one is distributed before the
	// server's certificate rotates.
	bundle := filepath.Join(t.TempDir(), "cas.crt")
	writeFile(t, bundle, append(readFile(t, old.CA), readFile(t, next.CA)...))
	client := auth.Client{CAFile: bundle, CertFile: old.ClientCert, KeyFile: old.ClientKey, ServerName: authtest.ServerName}
	opts := dialOptions(t, client)

	conn := dial(t, addr, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("stream before the rotation: %v %v", r, err)
	}
	if leaf, err := serverLeaf(conn); err != nil || !bytes.Equal(leaf, certDER(t, old.ServerCert)) {
		t.Fatalf("first connection: leaf %x, %v; want the old certificate", leaf, err)
	}
	const pair = "--tls-cert/--tls-key"

	// The certificate lands first: the pair does not match, the old one
	// stays (new connections see it) and the mismatch is reported once.
	copyFile(t, next.ServerCert, cert)
	poll(t, "the mismatched pair reported", func() error {
		if leaf, err := serverLeaf(dial(t, addr, opts)); err != nil || !bytes.Equal(leaf, certDER(t, old.ServerCert)) {
			t.Fatalf("new connection while cert and key do not match: leaf %x, %v; want the old certificate", leaf, err)
		}
		if n := value(reg, "inferlb_auth_reload_errors_total", pair); n < 1 {
			return fmt.Errorf("%g errors reported", n)
		}
		return nil
	})
	if !logs.contains("do not go together", cert, key) {
		t.Errorf("mismatch log: %s", logs)
	}
	if n := value(reg, "inferlb_auth_reload_failing", pair); n != 1 {
		t.Errorf("inferlb_auth_reload_failing = %g while the pair does not match, want 1", n)
	}
	// Then the key (renamed into place, as an atomic writer does): the new
	// pair serves the next connections.
	renameInto(t, next.ServerKey, key)
	poll(t, "the new certificate on a new connection", func() error {
		leaf, err := serverLeaf(dial(t, addr, opts))
		if err == nil && !bytes.Equal(leaf, certDER(t, next.ServerCert)) {
			err = errors.New("still the old certificate")
		}
		return err
	})
	if n := value(reg, "inferlb_auth_reload_failing", pair); n != 0 {
		t.Errorf("inferlb_auth_reload_failing = %g once the pair is taken, want 0", n)
	}
	if n, want := value(reg, "inferlb_auth_certificate_expiry_timestamp_seconds", pair), leafOf(t, next.ServerCert).NotAfter.Unix(); n != float64(want) {
		t.Errorf("certificate expiry %g, want the new leaf's %d", n, want)
	}
	// The established connection was not cut: the same handshake's leaf,
	// and the stream still delivers.
	if leaf, err := serverLeaf(conn); err != nil || !bytes.Equal(leaf, certDER(t, old.ServerCert)) {
		t.Errorf("established connection after the rotation: leaf %x, %v; want the old certificate (no reconnection)", leaf, err)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if r, err := stream.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("stream opened before the rotation: %v %v; want the status change delivered", r, err)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)

	// A half-written certificate keeps the current one; it is counted and
	// logged naming the file, then taken once whole.
	before := value(reg, "inferlb_auth_reload_errors_total", pair)
	writeFile(t, cert, []byte("-----BEGIN CERTIFICATE-----\nMIIB"))
	poll(t, "the garbage certificate reported", func() error {
		if n := value(reg, "inferlb_auth_reload_errors_total", pair); n <= before {
			return fmt.Errorf("%g errors reported", n)
		}
		return nil
	})
	if leaf, err := serverLeaf(dial(t, addr, opts)); err != nil || !bytes.Equal(leaf, certDER(t, next.ServerCert)) {
		t.Errorf("new connection after a garbage certificate: leaf %x, %v; want the last good one", leaf, err)
	}
	if !logs.contains("--tls-cert " + cert + ": no PEM certificate") {
		t.Errorf("garbage log: %s", logs)
	}
	copyFile(t, next.ServerCert, cert)
	poll(t, "the whole certificate taken", func() error {
		if n := value(reg, "inferlb_auth_reload_failing", pair); n != 0 {
			return fmt.Errorf("inferlb_auth_reload_failing = %g", n)
		}
		return nil
	})

	// The client CA rotates: a client of the old CA is refused on its next
	// connection, one of the new CA accepted.
	renameInto(t, next.CA, clientCA)
	poll(t, "the old CA's client refused", func() error {
		if err := check(dial(t, addr, opts)); status.Code(err) != codes.Unavailable {
			return fmt.Errorf("client of the old CA: %v, want Unavailable", err)
		}
		return nil
	})
	newClient := client
	newClient.CertFile, newClient.KeyFile = next.ClientCert, next.ClientKey
	if err := check(dial(t, addr, dialOptions(t, newClient))); err != nil {
		t.Errorf("client of the new CA: %v", err)
	}
	cancel()
}

// ext_proc's side: its client certificate and CA are re-read for new
// connections. A certificate rotated to one the server does not trust is
// refused on the next connection while the established stream goes on; a
// CA rotated to the server's new CA is taken; a garbage CA file keeps the
// last good one and is counted.
func TestClientTLSRotation(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	auth.SetCheckEvery(t, 10*time.Millisecond)
	old, next := authtest.NewPKI(t, t.TempDir()), authtest.NewPKI(t, t.TempDir())
	files := stage(t, old.ClientCert, old.ClientKey, old.CA)
	cert, key, ca := files[0], files[1], files[2]
	reg, logs, reloads := newReloads(t)
	var mu sync.Mutex
	handshakesRefused := 0
	oldAddr, hs := serveHealth(t, auth.Server{CertFile: old.ServerCert, KeyFile: old.ServerKey, ClientCAFile: old.CA,
		Reject: func(_, method, _ string) {
			if method == "tls-handshake" {
				mu.Lock()
				handshakesRefused++
				mu.Unlock()
			}
		}})
	newAddr, _ := serveHealth(t, auth.Server{CertFile: next.ServerCert, KeyFile: next.ServerKey, ClientCAFile: next.CA})
	opts := dialOptions(t, auth.Client{CAFile: ca, CertFile: cert, KeyFile: key, ServerName: authtest.ServerName, Reloads: reloads})

	conn := dial(t, oldAddr, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("stream with the first certificate: %v", err)
	}

	// The client certificate rotates to the new CA's, which the old server
	// does not trust: its next connection is refused.
	copyFile(t, next.ClientCert, cert)
	copyFile(t, next.ClientKey, key)
	poll(t, "the untrusted client certificate refused", func() error {
		if err := check(dial(t, oldAddr, opts)); status.Code(err) != codes.Unavailable {
			return fmt.Errorf("new connection: %v, want Unavailable", err)
		}
		return nil
	})
	// The server's side of the failed handshake may end after the client's.
	poll(t, "the refused handshake reported", func() error {
		mu.Lock()
		defer mu.Unlock()
		if handshakesRefused == 0 {
			return errors.New("the server reported no refused handshake")
		}
		return nil
	})
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if r, err := stream.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("stream opened before the rotation: %v %v; want the status change delivered", r, err)
	}

	// The new server's certificate is of the new CA: refused until the
	// client's CA file says so.
	if err := check(dial(t, newAddr, opts)); status.Code(err) != codes.Unavailable {
		t.Fatalf("new server before the CA rotation: %v, want Unavailable", err)
	}
	copyFile(t, next.CA, ca)
	poll(t, "the new server trusted", func() error { return check(dial(t, newAddr, opts)) })

	// A garbage CA file keeps the last good CA; it is counted and logged.
	before := value(reg, "inferlb_auth_reload_errors_total", "--control-plane-ca")
	writeFile(t, ca, []byte("garbage\n"))
	poll(t, "the garbage CA reported", func() error {
		if n := value(reg, "inferlb_auth_reload_errors_total", "--control-plane-ca"); n <= before {
			return fmt.Errorf("%g errors reported", n)
		}
		return nil
	})
	if err := check(dial(t, newAddr, opts)); err != nil {
		t.Errorf("new connection after a garbage CA file: %v", err)
	}
	if !logs.contains("--control-plane-ca " + ca + ": no PEM certificate") {
		t.Errorf("garbage log: %s", logs)
	}
	cancel()
}

// A key file that is not a key, or gone, is reported naming that file;
// the token file's failures are reported the same way.
func TestReloadErrorsNameTheFile(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	auth.SetCheckEvery(t, 10*time.Millisecond)
	pki := authtest.NewPKI(t, t.TempDir())
	key := stage(t, pki.ServerKey)[0]
	tokens, _ := authtest.TokenFile(t, t.TempDir(), "tokens")
	reg, logs, reloads := newReloads(t)
	s := auth.Server{CertFile: pki.ServerCert, KeyFile: key, ClientCAFile: pki.CA, TokenFile: tokens, Reloads: reloads}
	// At start a bad file is an error, not a report.
	bad := s
	bad.KeyFile = pki.ServerCert
	if _, err := bad.Options(); err == nil || !strings.Contains(err.Error(), "--tls-key "+pki.ServerCert+": no PEM private key") {
		t.Errorf("a certificate as the key at start: %v", err)
	}
	bad.KeyFile = pki.OtherKey
	if _, err := bad.Options(); err == nil || !strings.Contains(err.Error(), "do not go together") {
		t.Errorf("another certificate's key at start: %v", err)
	}
	addr, _ := serveHealth(t, s)
	tok := readFile(t, tokens)
	client := auth.Client{CAFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey, TokenFile: writeToken(t, strings.TrimSpace(string(tok)))}
	opts := dialOptions(t, client)
	if err := os.Remove(key); err != nil {
		t.Fatal(err)
	}
	writeFile(t, tokens, []byte("short\n"))
	// No handshake or call comes: a scrape looks at the files.
	poll(t, "both reported", func() error {
		if value(reg, "inferlb_auth_reload_failing", "--tls-cert/--tls-key") != 1 || value(reg, "inferlb_auth_reload_failing", "--token-file") != 1 {
			return errors.New("not failing yet")
		}
		return nil
	})
	if !logs.contains("level=ERROR", "--tls-key: open "+key) || !logs.contains("level=ERROR", "--token-file "+tokens+":1: token of 5 characters") {
		t.Errorf("logs: %s", logs)
	}
	// The last good key and token still serve.
	if err := check(dial(t, addr, opts)); err != nil {
		t.Errorf("call after the bad rotation: %v", err)
	}
}

// newReloads is a Reloads with its own registry, logging into a buffer.
func newReloads(t *testing.T) (*prometheus.Registry, *syncBuffer, *auth.Reloads) {
	t.Helper()
	reg, logs := prometheus.NewRegistry(), &syncBuffer{}
	r, err := auth.NewReloads(reg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return reg, logs, r
}

// stage copies the files into a directory of the test's, the files a
// rotation then writes over, and returns their paths.
func stage(t *testing.T, from ...string) []string {
	t.Helper()
	dir := t.TempDir()
	out := make([]string, len(from))
	for i, f := range from {
		out[i] = filepath.Join(dir, filepath.Base(f))
		copyFile(t, f, out[i])
	}
	return out
}

// serveHealth is serve with the health server returned, to drive a Watch
// stream.
func serveHealth(t *testing.T, s auth.Server) (string, *health.Server) {
	t.Helper()
	hs := health.NewServer()
	return serveWith(t, s, hs), hs
}

func dialOptions(t *testing.T, c auth.Client) []grpc.DialOption {
	t.Helper()
	opts, err := c.DialOptions()
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

// dial makes a new connection (closed at the test's end) with opts, the
// same options (and so the same watched files) every time.
func dial(t *testing.T, addr string, opts []grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func check(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// serverLeaf makes a call on conn and returns the certificate the server
// presented on its connection.
func serverLeaf(conn *grpc.ClientConn) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return nil, err
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return nil, fmt.Errorf("no TLS peer certificate (%T)", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].Raw, nil
}

func poll(t *testing.T, what string, f func() error) {
	t.Helper()
	if err := envoytest.Poll(context.Background(), 10*time.Second, 20*time.Millisecond, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// value is a counter's or gauge's value for a files label (0 when absent).
func value(reg *prometheus.Registry, name, files string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	got := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "files" && l.GetValue() == files {
					got = m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return got
}

func leafOf(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(certDER(t, path))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func certDER(t *testing.T, path string) []byte {
	t.Helper()
	b, _ := pem.Decode(readFile(t, path))
	if b == nil {
		t.Fatalf("%s: no PEM", path)
	}
	return b.Bytes
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeFile writes in place (the file's identity stays; a reader may see
// it half-written).
func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	writeFile(t, to, readFile(t, from))
}

// renameInto replaces to with a copy of from by a rename: another file
// under the same name.
func renameInto(t *testing.T, from, to string) {
	t.Helper()
	tmp := to + ".tmp"
	copyFile(t, from, tmp)
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a log destination safe for concurrent handlers.
type syncBuffer struct{ syncbuf.Buffer }

// contains reports whether one line holds every part.
func (s *syncBuffer) contains(parts ...string) bool {
	for _, line := range strings.Split(s.String(), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}
