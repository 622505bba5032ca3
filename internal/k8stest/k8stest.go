// Package k8stest starts a real etcd and a real kube-apiserver on loopback
// for a test, and stops them when the test ends. The Kubernetes tests use it
// instead of a fake clientset: what they create goes through the real API
// server's validation, defaulting, admission and watch machinery.
//
// The binaries are built from the Go module proxy by scripts/setup-k8s.sh
// (scripts/setup.sh --k8s; make test runs it) into a cache keyed by version;
// Binaries finds them there, or where $INFERLB_ETCD and
// $INFERLB_KUBE_APISERVER point.
package k8stest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/childproc"
)

// The versions scripts/setup-k8s.sh builds: the nested modules'
// (tools/k8srig/etcd and tools/k8srig/apiserver) pins. TestVersionsMatchModules
// keeps them in step.
const (
	EtcdVersion = "v3.7.3"
	KubeVersion = "v1.37.2"
)

// ErrNoBinaries is returned by Binaries when etcd or kube-apiserver has not
// been built.
var ErrNoBinaries = errors.New("etcd or kube-apiserver not built: run scripts/setup.sh --k8s (make test does)")

// CacheDir is where scripts/setup-k8s.sh puts the binaries:
// $INFERLB_K8S_CACHE, else $XDG_CACHE_HOME/inferlb/k8s, else
// ~/.cache/inferlb/k8s.
func CacheDir() string {
	if d := os.Getenv("INFERLB_K8S_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "inferlb", "k8s")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "inferlb", "k8s")
}

// Binaries returns the etcd and kube-apiserver to run: $INFERLB_ETCD and
// $INFERLB_KUBE_APISERVER when set, else the cached builds.
func Binaries() (etcd, apiserver string, err error) {
	etcd = os.Getenv("INFERLB_ETCD")
	if etcd == "" {
		etcd = filepath.Join(CacheDir(), "etcd-"+EtcdVersion, "etcd")
	}
	apiserver = os.Getenv("INFERLB_KUBE_APISERVER")
	if apiserver == "" {
		apiserver = filepath.Join(CacheDir(), "kube-apiserver-"+KubeVersion, "kube-apiserver")
	}
	for _, p := range []string{etcd, apiserver} {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return "", "", fmt.Errorf("%w (looked for %s)", ErrNoBinaries, p)
		}
	}
	return etcd, apiserver, nil
}

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	// Host is the API server's URL (https://127.0.0.1:port); Token a
	// bearer token in system:masters; Kubeconfig a kubeconfig file naming
	// both (insecure-skip-tls-verify: the server's certificate is
	// self-signed, on loopback).
	Host, Token, Kubeconfig string

	procs           *childproc.Group
	etcd, apiserver *childproc.Proc
	stopOnce        sync.Once
}

// Start runs etcd and kube-apiserver in the test's temporary directory,
// waits until the API server's /readyz answers ok, and stops both when the
// test ends. It fails the test when the binaries are missing (skips it
// with -short) or either process does not come up within two minutes.
func Start(t testing.TB) *Cluster {
	t.Helper()
	etcdBin, apiBin, err := Binaries()
	if err != nil && testing.Short() {
		// make test-short's setup does not build them (minutes the first
		// time); make test's does, and there a missing binary fails.
		t.Skipf("k8stest: %v", err)
	}
	if err != nil {
		t.Fatalf("k8stest: %v", err)
	}
	dir := t.TempDir()
	c, err := start(dir, etcdBin, apiBin)
	if c != nil {
		t.Cleanup(func() {
			c.Stop()
			if t.Failed() {
				t.Logf("etcd log tail:\n%s\nkube-apiserver log tail:\n%s", tailOf(c.etcd, 30), tailOf(c.apiserver, 60))
			}
		})
	}
	if err != nil {
		t.Fatalf("k8stest: %v", err)
	}
	return c
}

func tailOf(p *childproc.Proc, n int) string {
	if p == nil {
		return "(not started)"
	}
	return p.Tail(n)
}

func start(dir, etcdBin, apiBin string) (*Cluster, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	// The servers die with the test binary (SIGKILL when it dies) even if
	// it is killed before its cleanups run: no etcd or API server outlives
	// a test.
	c := &Cluster{procs: &childproc.Group{Dir: dir, DeathSignal: syscall.SIGKILL}}
	// --unsafe-no-fsync: a test's etcd holds nothing worth a disk flush,
	// and fsyncs on a shared machine's disk make the API server slow.
	c.etcd, err = c.procs.Start("etcd", etcdBin,
		"--name", "test", "--data-dir", filepath.Join(dir, "etcd-data"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "test="+peerURL, "--log-level", "warn", "--unsafe-no-fsync")
	if err != nil {
		return c, err
	}
	if err := c.waitFor(c.etcd, clientURL+"/health", nil, func(body string) bool { return strings.Contains(body, `"health":"true"`) }); err != nil {
		return c, fmt.Errorf("etcd: %w", err)
	}

	keyFile, pubFile, err := serviceAccountKeys(dir)
	if err != nil {
		return c, err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return c, err
	}
	c.Token = hex.EncodeToString(tok)
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(c.Token+`,admin,admin-uid,"system:masters"`+"\n"), 0o600); err != nil {
		return c, err
	}
	c.Host = fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	// On loopback: the advertise address is 127.0.0.1 and the endpoint
	// reconciler is off (it would publish that address as the kubernetes
	// Service's endpoint, which EndpointSlice validation refuses). The
	// ServiceAccount admission plugin is off: no controller manager runs to
	// create each namespace's default service account, and without it
	// every pod would be refused.
	c.apiserver, err = c.procs.Start("kube-apiserver", apiBin,
		"--etcd-servers", clientURL,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(ports[2]),
		"--advertise-address", "127.0.0.1", "--endpoint-reconciler-type", "none",
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--cert-dir", filepath.Join(dir, "certs"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", pubFile, "--service-account-signing-key-file", keyFile,
		"--token-auth-file", tokens, "--authorization-mode", "RBAC",
		"--disable-admission-plugins", "ServiceAccount",
		"--enable-priority-and-fairness=false")
	if err != nil {
		return c, err
	}
	hdr := http.Header{"Authorization": {"Bearer " + c.Token}}
	if err := c.waitFor(c.apiserver, c.Host+"/readyz", hdr, func(body string) bool { return body == "ok" }); err != nil {
		return c, fmt.Errorf("kube-apiserver: %w", err)
	}
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
`, c.Host, c.Token)
	if err := os.WriteFile(c.Kubeconfig, []byte(kc), 0o600); err != nil {
		return c, err
	}
	return c, nil
}

// waitFor polls url until ok(body) with a 200, the process exits, or two
// minutes pass (kube-apiserver takes seconds on a quiet machine; a shared
// one under a build is slower).
func (c *Cluster) waitFor(p *childproc.Proc, url string, hdr http.Header, ok func(string) bool) error {
	cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// The API server's certificate is the self-signed one it made at
		// start, on loopback: nothing to verify it against.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
	}}
	defer cl.CloseIdleConnections()
	deadline := time.Now().Add(2 * time.Minute)
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case <-p.Done():
			return fmt.Errorf("exited before it was ready (%v)", p.Err())
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header = hdr
		resp, err := cl.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && ok(strings.TrimSpace(string(b))) {
				return nil
			}
			last = fmt.Sprintf("%s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(b)))
		} else {
			last = err.Error()
		}
		select {
		case <-p.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("not ready after two minutes; last: %s", last)
}

// Stop stops the API server, then etcd: SIGTERM, then SIGKILL after ten
// seconds. Safe to call more than once.
func (c *Cluster) Stop() {
	c.stopOnce.Do(c.procs.StopAll)
}

// serviceAccountKeys writes an ECDSA P-256 key pair for the API server's
// service-account tokens.
func serviceAccountKeys(dir string) (keyFile, pubFile string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return "", "", err
	}
	keyFile, pubFile = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return "", "", err
	}
	return keyFile, pubFile, nil
}

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago (all held open together, so they differ).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Poll calls f every interval until it returns nil or timeout passes, and
// returns f's last error then.
func Poll(ctx context.Context, timeout, every time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %v: %w", timeout, err)
		case <-time.After(every):
		}
	}
}
