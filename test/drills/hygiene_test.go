package drills

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
)

// jwtIssuer signs ES256 tokens for the drill's Envoy JWT filter.
type jwtIssuer struct {
	key  *ecdsa.PrivateKey
	jwks string
}

func newJWTIssuer(t *testing.T) *jwtIssuer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	pad := func(b []byte) []byte { return append(make([]byte, 32-len(b)), b...) }
	jwks, _ := json.Marshal(map[string]any{"keys": []any{map[string]string{"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": "drill",
		"x": b64(pad(k.X.Bytes())), "y": b64(pad(k.Y.Bytes()))}}})
	return &jwtIssuer{key: k, jwks: string(jwks)}
}

func (j *jwtIssuer) token(t *testing.T, sub string) string {
	b64 := base64.RawURLEncoding.EncodeToString
	hdr, _ := json.Marshal(map[string]string{"alg": "ES256", "typ": "JWT", "kid": "drill"})
	claims, _ := json.Marshal(map[string]any{"iss": "drill-issuer", "sub": sub, "exp": time.Now().Add(time.Hour).Unix()})
	signing := b64(hdr) + "." + b64(claims)
	sum := sha256.Sum256([]byte(signing))
	r, s, err := ecdsa.Sign(rand.Reader, j.key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signing + "." + b64(sig)
}

// authFilter is the bootstrap's authentication filter: Envoy's JWT filter
// verifying the issuer's tokens, putting the token's subject in
// x-client-id; requests without a token pass (with no client).
func (j *jwtIssuer) authFilter() string {
	return fmt.Sprintf(`- name: envoy.filters.http.jwt_authn
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
    providers:
      drill:
        issuer: drill-issuer
        local_jwks: { inline_string: %q }
        claim_to_headers: [{ header_name: x-client-id, claim_name: sub }]
    rules:
    - match: { prefix: "/" }
      requires: { requires_any: { requirements: [{ provider_name: drill }, { allow_missing: {} }] } }
`, j.jwks)
}

// rawStatus sends a raw HTTP/1.1 request and returns the status line.
func rawStatus(t *testing.T, url, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return err.Error()
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "no status: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// Item 6: what clients send that they should not. Too many headers, or
// one huge header, get 431 (not a closed connection); a Content-Length
// larger than the body gets 408 after the request timeout (not a stream
// held open); priorities are what the client's verified identity allows
// (Envoy's JWT filter sets it; a client's own header is stripped);
// ext_proc's admin port does not take POST.
func TestDrillRequestHygiene(t *testing.T) {
	iss := newJWTIssuer(t)
	dir := t.TempDir()
	clients := filepath.Join(dir, "clients.yaml")
	if err := os.WriteFile(clients, []byte("header: x-client-id\nclients:\n  gold: [high, low]\ndefault: [low]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startStack(t, stackOptions{extArgs: []string{"--client-priorities", clients}, envoy: func(p *envoyconfigs.Params) {
		p.RequestTimeout = "2s"
		p.ClientHeader = "x-client-id"
		p.AuthFilters = iss.authFilter()
	}})
	body := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hygiene"}]}`
	post := func(extra string, cl int, b string) string {
		return rawStatus(t, s.url, fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: drill\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", extra, cl, b))
	}

	var many strings.Builder
	for i := 0; i < 101; i++ {
		fmt.Fprintf(&many, "x-h%d: v\r\n", i)
	}
	if got := post(many.String(), len(body), body); !strings.Contains(got, " 431 ") {
		t.Errorf("101 headers: %q, want 431", got)
	}
	if got := post("x-big: "+strings.Repeat("a", 100<<10)+"\r\n", len(body), body); !strings.Contains(got, " 431 ") {
		t.Errorf("a 100 KB header: %q, want 431", got)
	}
	t0 := time.Now()
	got := post("", len(body)+100, body)
	held := time.Since(t0)
	if !strings.Contains(got, " 408 ") || held > 5*time.Second {
		t.Errorf("Content-Length 100 bytes over the body: %q after %.1f s, want 408 after the 2 s request timeout", got, held.Seconds())
	}
	t.Logf("431 for 101 headers and for a 100 KB header; short body: %q after %.1f s", got, held.Seconds())

	// Priorities by verified identity.
	hc := &http.Client{Timeout: 20 * time.Second}
	defer hc.CloseIdleConnections()
	ask := func(token, prio string, hdr map[string]string) (int, string) {
		req, _ := http.NewRequest("POST", s.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("content-type", "application/json")
		if token != "" {
			req.Header.Set("authorization", "Bearer "+token)
		}
		if prio != "" {
			req.Header.Set("x-priority", prio)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	gold, bulk := iss.token(t, "gold"), iss.token(t, "bulk")
	for _, tc := range []struct {
		name, token, prio string
		hdr               map[string]string
		want              int
	}{
		{"gold asks high", gold, "high", nil, 200},
		{"gold asks nothing", gold, "", nil, 200},
		{"bulk asks high", bulk, "high", nil, 403},
		{"bulk asks low", bulk, "low", nil, 200},
		{"anonymous asks high", "", "high", nil, 403},
		{"anonymous asks nothing", "", "", nil, 200},
		{"forged identity asks high", "", "high", map[string]string{"x-client-id": "gold"}, 403},
		{"bulk forges gold", bulk, "high", map[string]string{"x-client-id": "gold"}, 403},
		{"invalid token", gold[:len(gold)-4] + "AAAA", "high", nil, 401},
	} {
		code, b := ask(tc.token, tc.prio, tc.hdr)
		if code != tc.want {
			t.Errorf("%s: %d %.200s, want %d", tc.name, code, b, tc.want)
		}
		if code == 403 && !strings.Contains(b, "priority_not_allowed") {
			t.Errorf("%s: 403 without the reason: %s", tc.name, b)
		}
	}

	// ext_proc's admin port is read-only.
	resp, err := http.Post("http://"+s.extHTTP+"/policy", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST to ext_proc's admin port: %d, want 405", resp.StatusCode)
	}
}
