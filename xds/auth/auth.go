// Package auth secures the control plane's gRPC port (ADS and Reports):
// whoever can open an ADS stream reads every node's configuration, and
// whoever can call Reports steers the optimizer (a forged demand report
// sheds real traffic). Two mechanisms, alone or together:
//
//   - mutual TLS: the server presents a certificate, and clients must
//     present one signed by the configured client CA;
//   - a shared bearer token: clients send "authorization: Bearer <token>"
//     as gRPC metadata (per-RPC credentials; Envoy sets it as the ADS
//     stream's initial metadata). The token file may hold several tokens,
//     one per line, for rotation.
//
// Every credential file (token, certificate, key, CA) is re-read when it
// changes, so credentials rotate without a restart: new handshakes and
// calls use the new material, established connections and streams go on.
// A changed file that is bad (unparsable, half-written, a key that does not
// match its certificate) keeps the last good material and is reported
// (Reloads); it is taken once it is good.
//
// Turning both off takes an explicit Insecure, for local demos.
package auth

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Server is the control plane's side: what its gRPC port requires.
type Server struct {
	// CertFile and KeyFile are the server's certificate and key (PEM): TLS
	// on the port.
	CertFile, KeyFile string
	// ClientCAFile (PEM) turns on mutual TLS: a client must present a
	// certificate that chains to it.
	ClientCAFile string
	// TokenFile holds the accepted bearer tokens, one per line ('#'
	// comments and blank lines ignored).
	TokenFile string
	// Insecure serves without TLS and without tokens: anyone who reaches
	// the port can read configurations and send reports.
	Insecure bool
	// Reject, if set, is called for every refused call or TLS handshake
	// (metrics, logs); peer is the client's address.
	Reject func(peer, method, reason string)
	// Reloads, if set, logs and counts the reloads of the credential files
	// (and looks at them when scraped).
	Reloads *Reloads
	// TokenFlag names TokenFile in errors and metrics (default
	// "--token-file", the control plane's flag).
	TokenFlag string
	// Open lists full-method prefixes served without a token, for calls
	// that reveal and move nothing (gRPC health checks, which kubelet's
	// probes and gateways make without credentials). TLS still applies.
	Open []string
}

// Validate checks that the configuration says something coherent. The
// names are the control-plane command's flags.
func (c Server) Validate() error {
	tls := c.CertFile != "" || c.KeyFile != "" || c.ClientCAFile != ""
	switch {
	case c.Insecure && (tls || c.TokenFile != ""):
		return errors.New("--insecure turns authentication off; it cannot go with --tls-cert, --tls-key, --tls-client-ca or --token-file")
	case c.Insecure:
		return nil
	case (c.CertFile == "") != (c.KeyFile == ""):
		return errors.New("--tls-cert and --tls-key go together")
	case c.ClientCAFile != "" && c.CertFile == "":
		return errors.New("--tls-client-ca (mutual TLS) needs the server's own --tls-cert and --tls-key")
	case c.ClientCAFile == "" && c.TokenFile == "":
		if c.CertFile != "" {
			return errors.New("TLS alone authenticates no client: add --tls-client-ca (mutual TLS) or --token-file, or pass --insecure")
		}
		return errors.New("the xDS/Reports port needs authentication: --tls-cert, --tls-key and --tls-client-ca (mutual TLS), or --token-file " +
			"(a shared bearer token), or both; --insecure turns it off (local demos only)")
	}
	return nil
}

// Options returns the gRPC server options: transport credentials and the
// token check on every call.
func (c Server) Options() ([]grpc.ServerOption, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var opts []grpc.ServerOption
	if c.CertFile != "" {
		pair, err := keyPair(file{"--tls-cert", c.CertFile}, file{"--tls-key", c.KeyFile}, c.Reloads)
		if err != nil {
			return nil, err
		}
		var cas *watched[*x509.CertPool]
		if c.ClientCAFile != "" {
			if cas, err = certPool(file{"--tls-client-ca", c.ClientCAFile}, c.Reloads); err != nil {
				return nil, err
			}
		}
		// Each handshake takes the material current then: a rotated
		// certificate or CA serves the next connection, and established
		// ones (ADS and Reports streams) are not cut.
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			out := &tls.Config{Certificates: []tls.Certificate{pair.current()}, MinVersion: tls.VersionTLS12}
			if cas != nil {
				out.ClientCAs, out.ClientAuth = cas.current(), tls.RequireAndVerifyClientCert
			}
			return out, nil
		}}
		opts = append(opts, grpc.Creds(rejectingCreds{TransportCredentials: credentials.NewTLS(cfg), reject: c.Reject}))
	}
	if c.TokenFile != "" {
		flag := c.TokenFlag
		if flag == "" {
			flag = "--token-file"
		}
		tf, err := newTokenFile(c.TokenFile, flag, c.Reloads)
		if err != nil {
			return nil, err
		}
		check := func(ctx context.Context, method string) error {
			for _, p := range c.Open {
				if strings.HasPrefix(method, p) {
					return nil
				}
			}
			if err := tf.check(ctx); err != nil {
				if c.Reject != nil {
					addr := ""
					if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
						addr = p.Addr.String()
					}
					c.Reject(addr, method, err.Error())
				}
				return status.Error(codes.Unauthenticated, err.Error())
			}
			return nil
		}
		opts = append(opts,
			grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				if err := check(ctx, info.FullMethod); err != nil {
					return nil, err
				}
				return h(ctx, req)
			}),
			grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if err := check(ss.Context(), info.FullMethod); err != nil {
					return err
				}
				return h(srv, ss)
			}))
	}
	return opts, nil
}

// rejectingCreds reports failed TLS handshakes (a client without a
// certificate of the client CA never reaches an interceptor).
type rejectingCreds struct {
	credentials.TransportCredentials
	reject func(peer, method, reason string)
}

func (c rejectingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil && c.reject != nil {
		c.reject(conn.RemoteAddr().String(), "tls-handshake", err.Error())
	}
	return out, info, err
}

func (c rejectingCreds) Clone() credentials.TransportCredentials {
	return rejectingCreds{TransportCredentials: c.TransportCredentials.Clone(), reject: c.reject}
}

// Client is the side of a client of the control plane (ext_proc).
type Client struct {
	// CAFile (PEM) verifies the control plane's certificate: TLS on.
	CAFile string
	// CertFile and KeyFile are the client's certificate (mutual TLS).
	CertFile, KeyFile string
	// ServerName is the name the server's certificate must carry (default:
	// the host of the address dialled).
	ServerName string
	// TokenFile holds the bearer token sent on every call (its first
	// token line); re-read when it changes.
	TokenFile string
	// Insecure dials without TLS and without a token.
	Insecure bool
	// Reloads is Server.Reloads for the client's files.
	Reloads *Reloads
}

// Validate checks the configuration; the names are ext_proc's flags.
func (c Client) Validate() error {
	tlsOn := c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != ""
	switch {
	case c.Insecure && (tlsOn || c.TokenFile != ""):
		return errors.New("--insecure turns authentication off; it cannot go with --control-plane-ca, --control-plane-cert, --control-plane-key, --control-plane-server-name or --control-plane-token-file")
	case c.Insecure:
		return nil
	case (c.CertFile == "") != (c.KeyFile == ""):
		return errors.New("--control-plane-cert and --control-plane-key go together")
	case tlsOn && c.CAFile == "":
		return errors.New("TLS to the control plane needs --control-plane-ca to verify its certificate")
	case c.CertFile == "" && c.TokenFile == "":
		return errors.New("the control plane needs credentials: --control-plane-ca, --control-plane-cert and --control-plane-key (mutual TLS), " +
			"or --control-plane-token-file (its shared token), or both; --insecure turns them off (local demos only)")
	}
	return nil
}

// TLS reports whether the client dials with TLS.
func (c Client) TLS() bool { return c.CAFile != "" }

// DialOptions returns the gRPC dial options.
func (c Client) DialOptions() ([]grpc.DialOption, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var opts []grpc.DialOption
	if c.CAFile != "" {
		cas, err := certPool(file{"--control-plane-ca", c.CAFile}, c.Reloads)
		if err != nil {
			return nil, err
		}
		var pair *watched[tls.Certificate]
		if c.CertFile != "" {
			if pair, err = keyPair(file{"--control-plane-cert", c.CertFile}, file{"--control-plane-key", c.KeyFile}, c.Reloads); err != nil {
				return nil, err
			}
		}
		config := func() *tls.Config {
			cfg := &tls.Config{RootCAs: cas.current(), ServerName: c.ServerName, MinVersion: tls.VersionTLS12}
			if pair != nil {
				cfg.Certificates = []tls.Certificate{pair.current()}
			}
			return cfg
		}
		opts = append(opts, grpc.WithTransportCredentials(&reloadingTLS{TransportCredentials: credentials.NewTLS(config()), config: config}))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if c.TokenFile != "" {
		tf, err := newTokenFile(c.TokenFile, "--control-plane-token-file", c.Reloads)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithPerRPCCredentials(tokenCreds{tf: tf}))
	}
	return opts, nil
}

// Token returns the client's bearer token ("" without a token file), for
// writing it into an Envoy bootstrap.
func (c Client) Token() (string, error) {
	if c.TokenFile == "" {
		return "", nil
	}
	tf, err := newTokenFile(c.TokenFile, "--control-plane-token-file", nil)
	if err != nil {
		return "", err
	}
	return tf.first()
}

// tokenFile is a file of tokens, watched so that tokens rotate without a
// restart.
type tokenFile struct {
	path, flag string
	w          *watched[[][]byte]
}

func newTokenFile(path, flag string, r *Reloads) (*tokenFile, error) {
	w, err := newWatched([]file{{flag, path}}, func(b [][]byte) ([][]byte, error) { return parseTokens(flag, path, b[0]) }, r)
	if err != nil {
		return nil, err
	}
	watch(r, w, nil)
	return &tokenFile{path: path, flag: flag, w: w}, nil
}

// parseTokens reads a token file: one token per line, '#' comments and
// blank lines ignored.
func parseTokens(flag, path string, b []byte) ([][]byte, error) {
	var toks [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.ContainsAny(line, " \t") {
			return nil, fmt.Errorf("%s %s:%d: a token is one word without spaces", flag, path, n)
		}
		if len(line) < 16 {
			return nil, fmt.Errorf("%s %s:%d: token of %d characters; use at least 16 (e.g. openssl rand -hex 24)", flag, path, n, len(line))
		}
		toks = append(toks, []byte(line))
	}
	if len(toks) == 0 {
		return nil, fmt.Errorf("%s %s: no token in the file", flag, path)
	}
	return toks, nil
}

func (tf *tokenFile) current() [][]byte { return tf.w.current() }

func (tf *tokenFile) first() (string, error) {
	toks := tf.current()
	if len(toks) == 0 {
		return "", fmt.Errorf("%s %s: no token", tf.flag, tf.path)
	}
	return string(toks[0]), nil
}

// check accepts a call whose metadata carries one of the tokens.
func (tf *tokenFile) check(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return errors.New("missing bearer token (authorization metadata)")
	}
	got, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok {
		return errors.New("authorization metadata is not \"Bearer <token>\"")
	}
	match := 0
	for _, t := range tf.current() {
		match |= subtle.ConstantTimeCompare([]byte(got), t)
	}
	if match != 1 {
		return errors.New("invalid bearer token")
	}
	return nil
}

// tokenCreds sends the token on every call.
type tokenCreds struct{ tf *tokenFile }

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	t, err := c.tf.first()
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + t}, nil
}

// RequireTransportSecurity is false: a token over plaintext is accepted for
// a control plane on the same host or a trusted network (the command warns).
func (c tokenCreds) RequireTransportSecurity() bool { return false }
