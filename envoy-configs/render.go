// Package envoyconfigs holds the commented Envoy bootstrap of an inferlb
// frontend node (frontend.yaml.tmpl) and renders it in its two variants,
// fail-closed and fail-open, and a third without ext_proc (direct) for
// measurements and tests of xDS alone. `inferlb extproc --print-bootstrap`
// prints one; the tests, `inferlb-lab bench envoy` and the demo run Envoy from
// it: it is the project's one Envoy bootstrap.
package envoyconfigs

import (
	_ "embed"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"
)

//go:embed frontend.yaml.tmpl
var frontendTmpl string

var tmpl = template.Must(template.New("frontend").Option("missingkey=error").Parse(frontendTmpl))

// Variants of the frontend bootstrap.
const (
	FailClosed = "fail-closed"
	FailOpen   = "fail-open"
	// Direct has no ext_proc: every request takes the fallback route (the
	// FallbackCluster hashed on x-session-id). Not for production: no
	// admission, classes or retry budget. It is Envoy's own cost next to
	// the ext_proc variants (`inferlb-lab bench envoy`) and the frontend of
	// tests of xDS behaviour alone.
	Direct = "direct"
)

// HostSelectionRetryMaxAttempts is the route's
// host_selection_retry_max_attempts: how many times a retry re-picks a host
// when previous_hosts rejects the pick. Envoy's Maglev re-picks with the
// hash XORed with 2⁶⁴−a (a = 1, 2, …): the first re-picks look at a few
// neighbouring table slots, which for some host sets one host owns: with
// few re-picks, some address sets retry a share of a failing engine's keys
// on the same engine every time (internal/envoylb's model of Envoy's
// Maglev, checked against Envoy, shows it). 20 re-picks leave next to none
// in random address sets, and a re-pick is a table lookup, only on
// retries. The fleet simulator uses the same value.
const HostSelectionRetryMaxAttempts = 20

// Params fill the template.
type Params struct {
	// Variant is FailClosed, FailOpen or Direct.
	Variant string
	// NodeID and NodeCluster identify the frontend to the control plane;
	// Region is its locality region.
	NodeID, NodeCluster, Region string
	// ListenAddress and ListenPort: the client-facing HTTP listener.
	ListenAddress string
	ListenPort    int
	// ExtProcHost/Port: the ext_proc service; XDSHost/Port: the control plane.
	ExtProcHost string
	ExtProcPort int
	XDSHost     string
	XDSPort     int
	// BodyLimit is the request buffer limit in bytes (= ext_proc's).
	BodyLimit int
	// MessageTimeout bounds each ext_proc round trip (e.g. "1s").
	MessageTimeout string
	// FallbackCluster is the cluster of the fail-open route (fail-open and
	// direct only).
	FallbackCluster string
	// FallbackRetries is the fail-open route's retry count (0: none; no
	// ext_proc sets one there).
	FallbackRetries int
	// XDSAddresses are the control-plane replicas ("host:port"), all in
	// Envoy's ADS cluster; empty means XDSHost:XDSPort alone.
	XDSAddresses []string
	// XDSDelta selects incremental ADS (DELTA_GRPC) instead of state of
	// the world.
	XDSDelta bool
	// ExtProcToken is sent as "authorization: Bearer <ExtProcToken>" on the
	// ext_proc and access-log streams (ext_proc's --listen-token-file; ""
	// = none, for an ext_proc whose port is open).
	ExtProcToken string
	// XDSAuth is how Envoy authenticates to the control plane's ADS port
	// (zero: plaintext without a token, for a control plane run with
	// --insecure).
	XDSAuth XDSAuth
	// BodyMode is how Envoy sends ext_proc the request body: BodyBuffered
	// (default) or BodyStreamed (docs/extproc.md, "The body").
	BodyMode string
	// StreamAbove, with BodyMode buffered, streams the bodies whose
	// declared content-length is at least this many bytes (a route of
	// their own overrides the filter's body mode), so that ext_proc can
	// refuse one its first bytes prove over a limit before Envoy has read
	// the rest (0: DefaultStreamAbove; negative: none streamed).
	StreamAbove int
	// UploadTimeout is how far ext_proc may extend its message timer for a
	// slow upload (its --upload-timeout): the bootstrap's
	// max_message_timeout (0: RequestTimeout plus 5 s, ext_proc's default
	// with the default RequestTimeout).
	UploadTimeout time.Duration
	// RequestTimeout bounds receiving a request (headers and body; default
	// "15s"). It does not limit the response: a stream runs as long as it
	// keeps sending.
	RequestTimeout string
	// MaxRequestHeadersKB and MaxHeadersCount are the request header limits
	// (defaults 60 and 100, Envoy's); beyond them the client gets 431.
	MaxRequestHeadersKB, MaxHeadersCount int
	// ClientHeader names the header an authentication filter sets from a
	// verified credential (e.g. Envoy's JWT filter, claim_to_headers);
	// ext_proc maps it to the priorities the client may use. The header is
	// removed from client requests before any filter runs. "" = none.
	ClientHeader string
	// AuthFilters is YAML for HTTP filters placed before ext_proc (a list,
	// items at column 0), e.g. envoy.filters.http.jwt_authn setting
	// ClientHeader.
	AuthFilters string
	// ReadOnlyAdmin, if set, gives the bootstrap an admin interface that
	// changes nothing (nil: no admin section; the caller may add one).
	ReadOnlyAdmin *ReadOnlyAdmin
}

// ReadOnlyAdmin is an Envoy admin interface for dashboards and operators
// that cannot change Envoy: the real admin listens on a unix socket only
// its user can open (mode 0600), and a listener on 127.0.0.1:Port passes
// it GET requests of ReadOnlyAdminPaths alone; anything else is answered
// 403. Envoy's admin has no authentication, and a POST /healthcheck/fail,
// /quitquitquit or /runtime_modify from anyone who reaches it takes the
// frontend out.
type ReadOnlyAdmin struct {
	Port   int
	Socket string
}

// ReadOnlyAdminPaths are the admin paths the read-only listener passes
// (GET only). /config_dump is not one: it holds the bootstrap's tokens.
var ReadOnlyAdminPaths = []string{"/clusters", "/stats", "/ready", "/server_info"}

// XDSAuth is Envoy's credential for the control plane's ADS port.
type XDSAuth struct {
	// Token is sent as "authorization: Bearer <Token>" on the ADS stream.
	Token string
	// CAFile verifies the control plane's certificate (TLS on). CertFile
	// and KeyFile are Envoy's own certificate, for mutual TLS.
	CAFile, CertFile, KeyFile string
	// ServerName is the SNI and the DNS name the control plane's
	// certificate must carry ("" = the chain alone is checked).
	ServerName string
	// SDSDir, with CAFile, serves the certificate, key and CA to Envoy
	// through file-based SDS instead of static file names: the bootstrap
	// names SDS resource files in this directory (WriteSDS writes them),
	// whose secrets name CertFile, KeyFile and CAFile and watch their
	// directories, so Envoy takes rotated files live (a Kubernetes Secret
	// update needs no restart). "" keeps the static names, read once at
	// start.
	SDSDir string
}

type hostPort struct {
	Host string
	Port int
}

// The request body modes (Params.BodyMode).
const (
	// BodyBuffered: Envoy buffers the body and sends it a round trip after
	// the headers, whose answer is "continue"; the decision goes with the
	// body's answer. Four messages per request.
	BodyBuffered = "buffered"
	// BodyStreamed: Envoy sends the body's chunks right after the headers
	// (STREAMED, send_body_without_waiting_for_header_response); the
	// headers' answer waits for the body and carries the decision. One
	// wake-up of ext_proc per request instead of two: a round trip less
	// and less of ext_proc's CPU one request at a time, but one more
	// message for Envoy (HTTP/1's empty last chunk), which costs Envoy
	// more at load (the measurements are in
	// docs/decisions/body-mode-buffered-default.md).
	BodyStreamed = "streamed"
)

// DefaultStreamAbove is Params.StreamAbove's default: a body of 1 MiB is
// a prompt of about 250,000 tokens, past most models' context; a hostile
// one (a hundred thousand tiny messages) is proved over an 8,192-token
// context 250 KB in.
const DefaultStreamAbove = 1 << 20

// UploadGrace is extproc.UploadGrace (a test holds them equal): how long
// ext_proc waits for a streamed body within message_timeout before it
// extends the timer. MessageTimeout must be at least twice it.
const UploadGrace = 100 * time.Millisecond

// data is what the template sees.
type data struct {
	Params
	XDSEndpoints []hostPort
	// SelectAttempts is HostSelectionRetryMaxAttempts.
	SelectAttempts int
	// AdminPaths is ReadOnlyAdminPaths.
	AdminPaths []string
	// MaxMessageTimeout is UploadTimeout.
	MaxMessageTimeout string
	// StreamLarge: the buffered bootstrap streams bodies of StreamAbove
	// bytes and more (a body limit below it, or no ext_proc, leaves none).
	StreamLarge bool
}

// Render returns the bootstrap YAML (without an admin section unless
// ReadOnlyAdmin is set).
func Render(p Params) (string, error) {
	if p.Variant != FailClosed && p.Variant != FailOpen && p.Variant != Direct {
		return "", fmt.Errorf("envoyconfigs: variant %q: want %q, %q or %q", p.Variant, FailClosed, FailOpen, Direct)
	}
	if p.Variant != FailClosed && p.FallbackCluster == "" {
		return "", fmt.Errorf("envoyconfigs: %s needs a FallbackCluster", p.Variant)
	}
	if p.NodeID == "" || p.ListenPort <= 0 || (p.ExtProcPort <= 0 && p.Variant != Direct) || (p.XDSPort <= 0 && len(p.XDSAddresses) == 0) || p.BodyLimit <= 0 {
		return "", fmt.Errorf("envoyconfigs: NodeID, ListenPort, ExtProcPort (but for direct), XDSPort (or XDSAddresses) and BodyLimit are required")
	}
	// A port past 65535 renders a bootstrap Envoy refuses with a message
	// about its own schema; say which parameter is wrong instead.
	for _, port := range []struct {
		name string
		v    int
	}{{"ListenPort", p.ListenPort}, {"ExtProcPort", p.ExtProcPort}, {"XDSPort", p.XDSPort}} {
		if port.v > 65535 {
			return "", fmt.Errorf("envoyconfigs: %s %d is not a TCP port (1–65535)", port.name, port.v)
		}
	}
	if p.FallbackRetries < 0 {
		return "", fmt.Errorf("envoyconfigs: FallbackRetries %d is negative", p.FallbackRetries)
	}
	if p.NodeCluster == "" {
		p.NodeCluster = p.NodeID
	}
	if p.ListenAddress == "" {
		p.ListenAddress = "127.0.0.1"
	}
	if p.ExtProcHost == "" {
		p.ExtProcHost = "127.0.0.1"
	}
	if p.XDSHost == "" {
		p.XDSHost = "127.0.0.1"
	}
	if p.MessageTimeout == "" {
		p.MessageTimeout = "1s"
	}
	if p.RequestTimeout == "" {
		p.RequestTimeout = "15s"
	}
	switch p.BodyMode {
	case "":
		p.BodyMode = BodyBuffered
	case BodyBuffered, BodyStreamed:
	default:
		return "", fmt.Errorf("envoyconfigs: BodyMode %q: want %s or %s", p.BodyMode, BodyBuffered, BodyStreamed)
	}
	rt, err := time.ParseDuration(p.RequestTimeout)
	if err != nil || rt <= 0 {
		return "", fmt.Errorf("envoyconfigs: RequestTimeout %q: want a positive duration such as 15s", p.RequestTimeout)
	}
	mt, err := time.ParseDuration(p.MessageTimeout)
	if err != nil || mt <= 0 {
		return "", fmt.Errorf("envoyconfigs: MessageTimeout %q: want a positive duration such as 1s", p.MessageTimeout)
	}
	switch {
	case p.StreamAbove == 0:
		p.StreamAbove = DefaultStreamAbove
	case p.StreamAbove < 0:
		p.StreamAbove = 0 // none
	}
	// Streamed, ext_proc waits UploadGrace for a body within
	// message_timeout before it extends the timer.
	streamLarge := p.BodyMode == BodyBuffered && p.StreamAbove > 0 && p.StreamAbove <= p.BodyLimit && p.Variant != Direct
	if (p.BodyMode == BodyStreamed || streamLarge) && mt < 2*UploadGrace {
		return "", fmt.Errorf("envoyconfigs: MessageTimeout %q: with bodies streamed (BodyMode streamed, or StreamAbove), want at least %v (ext_proc waits %v for a streamed body before it extends the timer)", p.MessageTimeout, 2*UploadGrace, UploadGrace)
	}
	if p.MaxRequestHeadersKB == 0 {
		p.MaxRequestHeadersKB = 60
	}
	if p.MaxHeadersCount == 0 {
		p.MaxHeadersCount = 100
	}
	// Envoy's own bounds: 1–8192 KB, at least 1 header.
	if p.MaxRequestHeadersKB < 1 || p.MaxRequestHeadersKB > 8192 || p.MaxHeadersCount < 1 {
		return "", fmt.Errorf("envoyconfigs: MaxRequestHeadersKB %d (1–8192) or MaxHeadersCount %d (≥ 1) out of range", p.MaxRequestHeadersKB, p.MaxHeadersCount)
	}
	if err := p.XDSAuth.check(); err != nil {
		return "", err
	}
	if a := p.ReadOnlyAdmin; a != nil && (a.Port <= 0 || a.Port > 65535 || a.Socket == "" || len(a.Socket) > 100) {
		return "", fmt.Errorf("envoyconfigs: ReadOnlyAdmin: a port (1–65535) and a unix socket path (at most 100 bytes) are required, got %d and %q", a.Port, a.Socket)
	}
	if p.AuthFilters != "" && p.ClientHeader == "" {
		return "", fmt.Errorf("envoyconfigs: AuthFilters without a ClientHeader: name the header the filters set")
	}
	if p.UploadTimeout == 0 {
		p.UploadTimeout = rt + 5*time.Second
	}
	if p.UploadTimeout <= UploadGrace {
		return "", fmt.Errorf("envoyconfigs: UploadTimeout %v: want more than ext_proc's upload grace %v", p.UploadTimeout, UploadGrace)
	}
	d := data{Params: p, SelectAttempts: HostSelectionRetryMaxAttempts, AdminPaths: ReadOnlyAdminPaths,
		MaxMessageTimeout: p.UploadTimeout.String(),
		StreamLarge:       streamLarge}
	addrs := p.XDSAddresses
	if len(addrs) == 0 {
		addrs = []string{net.JoinHostPort(p.XDSHost, strconv.Itoa(p.XDSPort))}
	}
	for _, a := range addrs {
		h, ps, err := net.SplitHostPort(a)
		n, perr := strconv.Atoi(ps)
		if err != nil || perr != nil || n <= 0 || n > 65535 || h == "" {
			return "", fmt.Errorf("envoyconfigs: XDSAddresses: %q is not host:port", a)
		}
		d.XDSEndpoints = append(d.XDSEndpoints, hostPort{h, n})
	}
	if p.AuthFilters != "" {
		lines := strings.Split(strings.TrimRight(p.AuthFilters, "\n"), "\n")
		for i, l := range lines {
			if l != "" {
				lines[i] = "          " + l
			}
		}
		d.AuthFilters = strings.Join(lines, "\n")
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, d); err != nil {
		return "", err
	}
	return b.String(), nil
}

func (a XDSAuth) check() error {
	if (a.CertFile == "") != (a.KeyFile == "") {
		return fmt.Errorf("envoyconfigs: XDSAuth: CertFile and KeyFile go together (got %q and %q)", a.CertFile, a.KeyFile)
	}
	if a.CertFile != "" && a.CAFile == "" {
		return fmt.Errorf("envoyconfigs: XDSAuth: a client certificate needs CAFile to verify the control plane")
	}
	if a.ServerName != "" && a.CAFile == "" {
		return fmt.Errorf("envoyconfigs: XDSAuth: ServerName without CAFile (TLS is off)")
	}
	if a.SDSDir != "" && a.CAFile == "" {
		return fmt.Errorf("envoyconfigs: XDSAuth: SDSDir without CAFile (TLS is off)")
	}
	for _, f := range []string{a.CAFile, a.CertFile, a.KeyFile, a.SDSDir} {
		if a.SDSDir != "" && f != "" && !filepath.IsAbs(f) {
			// Envoy resolves an SDS file's names from its own working
			// directory, not the resource file's: relative names would
			// point elsewhere than the operator meant.
			return fmt.Errorf("envoyconfigs: XDSAuth: with SDSDir every file must be an absolute path, got %q", f)
		}
	}
	for _, c := range a.Token {
		if c <= ' ' || c > '~' {
			return fmt.Errorf("envoyconfigs: XDSAuth: the token must be printable ASCII without spaces")
		}
	}
	return nil
}
