package auth_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"gopkg.in/yaml.v3"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/auth"
	"github.com/inferlb/inferlb/xds/auth/authtest"
)

// Every flag combination gets a verdict naming the flags: nothing is the
// insecure default.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    auth.Server
		want string // "" = valid
	}{
		{"nothing", auth.Server{}, "needs authentication"},
		{"insecure", auth.Server{Insecure: true}, ""},
		{"insecure and token", auth.Server{Insecure: true, TokenFile: "t"}, "cannot go with"},
		{"token", auth.Server{TokenFile: "t"}, ""},
		{"tls alone", auth.Server{CertFile: "c", KeyFile: "k"}, "TLS alone authenticates no client"},
		{"cert without key", auth.Server{CertFile: "c", TokenFile: "t"}, "go together"},
		{"client ca without cert", auth.Server{ClientCAFile: "ca"}, "needs the server's own"},
		{"mtls", auth.Server{CertFile: "c", KeyFile: "k", ClientCAFile: "ca"}, ""},
	} {
		if err := tc.s.Validate(); (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("server %s: %v, want %q", tc.name, err, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		c    auth.Client
		want string
	}{
		{"nothing", auth.Client{}, "needs credentials"},
		{"insecure", auth.Client{Insecure: true}, ""},
		{"insecure and ca", auth.Client{Insecure: true, CAFile: "ca"}, "cannot go with"},
		{"token", auth.Client{TokenFile: "t"}, ""},
		{"server name without ca", auth.Client{ServerName: "x", TokenFile: "t"}, "needs --control-plane-ca"},
		{"ca alone", auth.Client{CAFile: "ca"}, "needs credentials"},
		{"mtls", auth.Client{CAFile: "ca", CertFile: "c", KeyFile: "k"}, ""},
		{"key without cert", auth.Client{CAFile: "ca", KeyFile: "k"}, "go together"},
	} {
		if err := tc.c.Validate(); (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("client %s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// serve runs a gRPC server (the health service stands for ADS and Reports)
// with the server options, and returns its address.
func serve(t *testing.T, s auth.Server) string {
	t.Helper()
	return serveWith(t, s, health.NewServer())
}

func serveWith(t *testing.T, s auth.Server, hs *health.Server) string {
	t.Helper()
	opts, err := s.Options()
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(g, hs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(l) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return l.Addr().String()
}

// call makes one unary and one streaming call with the client's
// credentials and returns the first error.
func call(t *testing.T, addr string, c auth.Client) error {
	t.Helper()
	opts, err := c.DialOptions()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		return err
	}
	st, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	_, err = st.Recv()
	return err
}

// Mutual TLS: a client with a certificate of the client CA gets through;
// one without a certificate, with another CA's, or not speaking TLS does
// not, and every refused handshake is reported.
func TestMutualTLS(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	pki := authtest.NewPKI(t, t.TempDir())
	var mu sync.Mutex
	var rejected []string
	addr := serve(t, auth.Server{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, ClientCAFile: pki.CA,
		Reject: func(_, method, reason string) {
			mu.Lock()
			rejected = append(rejected, method+": "+reason)
			mu.Unlock()
		}})
	good := auth.Client{CAFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey, ServerName: authtest.ServerName}
	if err := call(t, addr, good); err != nil {
		t.Fatalf("client with the CA's certificate: %v", err)
	}
	// 127.0.0.1 is in the certificate too: the default server name works.
	byIP := good
	byIP.ServerName = ""
	if err := call(t, addr, byIP); err != nil {
		t.Fatalf("client verifying the server by IP: %v", err)
	}
	for name, c := range map[string]auth.Client{
		"no certificate":      {CAFile: pki.CA, TokenFile: writeToken(t, "0123456789abcdef0123")},
		"another CA's":        {CAFile: pki.CA, CertFile: pki.OtherCert, KeyFile: pki.OtherKey},
		"plaintext":           {Insecure: true},
		"wrong server name":   {CAFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey, ServerName: "evil.example"},
		"untrusted server CA": {CAFile: pki.OtherCert, CertFile: pki.ClientCert, KeyFile: pki.ClientKey},
	} {
		if err := call(t, addr, c); status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want the connection refused (Unavailable)", name, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rejected) < 3 {
		t.Errorf("refused handshakes reported: %v", rejected)
	}
}

func writeToken(t *testing.T, tok string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A bearer token: the right one passes on unary and streaming calls, a
// missing or wrong one is Unauthenticated (and reported); the server's
// file may list several tokens and is re-read when it changes.
func TestToken(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	dir := t.TempDir()
	serverFile, tok := authtest.TokenFile(t, dir, "server-tokens")
	var mu sync.Mutex
	var rejected []string
	addr := serve(t, auth.Server{TokenFile: serverFile,
		Reject: func(_, method, reason string) {
			mu.Lock()
			rejected = append(rejected, method+": "+reason)
			mu.Unlock()
		}})
	if err := call(t, addr, auth.Client{TokenFile: writeToken(t, tok)}); err != nil {
		t.Fatalf("right token: %v", err)
	}
	for name, c := range map[string]auth.Client{
		"no token":    {Insecure: true},
		"wrong token": {TokenFile: writeToken(t, "not-the-token-0123456789")},
	} {
		if err := call(t, addr, c); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
	mu.Lock()
	if len(rejected) != 2 || !strings.Contains(rejected[0], "grpc.health.v1.Health/Check") {
		t.Errorf("refused calls reported: %v", rejected)
	}
	mu.Unlock()
	// Rotation: add a new token (the old one still valid), then drop the old.
	next := "rotated-token-0123456789abcdef"
	if err := os.WriteFile(serverFile, []byte("# rotation\n"+tok+"\n"+next+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := envoytest.Poll(context.Background(), 5*time.Second, 50*time.Millisecond, func() error {
		return call(t, addr, auth.Client{TokenFile: writeToken(t, next)})
	}); err != nil {
		t.Fatalf("new token after rotation: %v", err)
	}
	if err := os.WriteFile(serverFile, []byte(next+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := envoytest.Poll(context.Background(), 5*time.Second, 50*time.Millisecond, func() error {
		err := call(t, addr, auth.Client{TokenFile: writeToken(t, tok)})
		if status.Code(err) != codes.Unauthenticated {
			return fmt.Errorf("old token: %v, want Unauthenticated", err)
		}
		return nil
	}); err != nil {
		t.Fatalf("after dropping the old token from the file: %v", err)
	}
	// The new token still passes once the old one is gone.
	if err := call(t, addr, auth.Client{TokenFile: writeToken(t, next)}); err != nil {
		t.Fatalf("new token after dropping the old: %v", err)
	}
	// Bad token files are refused with the path and line.
	for content, want := range map[string]string{"": "no token", "short\n": ":1: token of 5 characters", "a b c d e f g h i j\n": "one word"} {
		if _, err := (auth.Server{TokenFile: writeToken(t, content)}).Options(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("token file %q: %v, want %q", content, err, want)
		}
	}
}

// The bootstrap carries the client's credentials for Envoy's ADS
// connection: the token as initial metadata, TLS with the client
// certificate and the server name on the ADS cluster, every replica as an
// endpoint. (Envoy connecting with them is tested in test/drills.)
func TestBootstrapCarriesCredentials(t *testing.T) {
	pki := authtest.NewPKI(t, t.TempDir())
	y, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: "n", ListenPort: 10000,
		ExtProcPort: 9002, XDSAddresses: []string{"127.0.0.1:18000", "127.0.0.1:18001"}, BodyLimit: 1 << 20,
		XDSAuth: envoyconfigs.XDSAuth{Token: "0123456789abcdef", CAFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey, ServerName: authtest.ServerName}})
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Dynamic struct {
			ADS struct {
				Services []struct {
					Meta []struct{ Key, Value string } `yaml:"initial_metadata"`
				} `yaml:"grpc_services"`
			} `yaml:"ads_config"`
		} `yaml:"dynamic_resources"`
		Static struct {
			Clusters []struct {
				Name      string
				Transport struct {
					Config struct {
						SNI    string `yaml:"sni"`
						Common struct {
							Certs []struct {
								Chain struct{ Filename string } `yaml:"certificate_chain"`
							} `yaml:"tls_certificates"`
							Validation struct {
								CA struct{ Filename string } `yaml:"trusted_ca"`
							} `yaml:"validation_context"`
						} `yaml:"common_tls_context"`
					} `yaml:"typed_config"`
				} `yaml:"transport_socket"`
				LoadAssignment struct {
					Endpoints []struct {
						LB []any `yaml:"lb_endpoints"`
					}
				} `yaml:"load_assignment"`
			}
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal([]byte(y), &doc); err != nil {
		t.Fatal(err)
	}
	if m := doc.Dynamic.ADS.Services[0].Meta; len(m) != 1 || m[0].Key != "authorization" || m[0].Value != "Bearer 0123456789abcdef" {
		t.Errorf("ADS initial metadata %v", m)
	}
	found := false
	for _, c := range doc.Static.Clusters {
		if c.Name != "inferlb_xds" {
			continue
		}
		found = true
		tc := c.Transport.Config
		if tc.SNI != authtest.ServerName || tc.Common.Validation.CA.Filename != pki.CA || len(tc.Common.Certs) != 1 || tc.Common.Certs[0].Chain.Filename != pki.ClientCert {
			t.Errorf("inferlb_xds TLS %+v", tc)
		}
		if n := len(c.LoadAssignment.Endpoints[0].LB); n != 2 {
			t.Errorf("inferlb_xds has %d endpoints, want both replicas", n)
		}
	}
	if !found {
		t.Fatal("no inferlb_xds cluster")
	}
	if _, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: "n", ListenPort: 1, ExtProcPort: 1, XDSPort: 1,
		BodyLimit: 1, XDSAuth: envoyconfigs.XDSAuth{CertFile: pki.ClientCert, KeyFile: pki.ClientKey}}); err == nil || !strings.Contains(err.Error(), "needs CAFile") {
		t.Errorf("client certificate without a CA: %v", err)
	}
}

// Open methods are served without a token (the endpoint picker's health
// checks come from kubelet and gateways without one); every other method
// still needs it.
func TestOpenMethodsNeedNoToken(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	serverFile, _ := authtest.TokenFile(t, t.TempDir(), "server-tokens")
	addr := serve(t, auth.Server{TokenFile: serverFile, Open: []string{"/grpc.health.v1.Health/Check"}})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("open method without a token: %v, want served", err)
	}
	st, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("other method without a token: %v, want Unauthenticated", err)
	}
}
