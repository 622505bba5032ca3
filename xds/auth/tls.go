package auth

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc/credentials"
)

// keyPair watches a certificate and its key: the pair is re-read when
// either file changes, and taken only when both parse and match.
func keyPair(cert, key file, r *Reloads) (*watched[tls.Certificate], error) {
	w, err := newWatched([]file{cert, key}, func(b [][]byte) (tls.Certificate, error) {
		return parseKeyPair(cert, key, b[0], b[1])
	}, r)
	if err != nil {
		return nil, err
	}
	watch(r, w, func(c tls.Certificate) *x509.Certificate { return c.Leaf })
	return w, nil
}

// parseKeyPair is tls.X509KeyPair with errors that say which file is bad:
// the certificate, the key, or neither alone (they do not match: the middle
// of a rotation that writes one file, then the other).
func parseKeyPair(cert, key file, certPEM, keyPEM []byte) (tls.Certificate, error) {
	n := 0
	for rest := certPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return tls.Certificate{}, fmt.Errorf("%s %s: certificate %d: %w", cert.flag, cert.path, n+1, err)
		}
		n++
	}
	if n == 0 {
		return tls.Certificate{}, fmt.Errorf("%s %s: no PEM certificate in the file", cert.flag, cert.path)
	}
	if err := checkKey(keyPEM); err != nil {
		return tls.Certificate{}, fmt.Errorf("%s %s: %w", key.flag, key.path, err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s %s and %s %s do not go together (%w): a rotation writing one, then the other, passes through this; "+
			"the last good pair stays until they match", cert.flag, cert.path, key.flag, key.path, err)
	}
	return c, nil
}

// checkKey reports whether keyPEM holds a private key tls.X509KeyPair can
// use (PKCS #8, PKCS #1 or SEC 1, as it tries them).
func checkKey(keyPEM []byte) error {
	for rest := keyPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return errors.New("no PEM private key in the file")
		}
		if b.Type != "PRIVATE KEY" && !strings.HasSuffix(b.Type, " PRIVATE KEY") {
			continue
		}
		var k crypto.PrivateKey
		var err error
		if k, err = x509.ParsePKCS8PrivateKey(b.Bytes); err != nil {
			if k, err = x509.ParsePKCS1PrivateKey(b.Bytes); err != nil {
				k, err = x509.ParseECPrivateKey(b.Bytes)
			}
		}
		if err != nil || k == nil {
			return fmt.Errorf("unparsable private key (%s block)", b.Type)
		}
		return nil
	}
}

// certPool watches a CA file.
func certPool(ca file, r *Reloads) (*watched[*x509.CertPool], error) {
	w, err := newWatched([]file{ca}, func(b [][]byte) (*x509.CertPool, error) {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b[0]) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in the file", ca.flag, ca.path)
		}
		return pool, nil
	}, r)
	if err != nil {
		return nil, err
	}
	watch(r, w, nil)
	return w, nil
}

// reloadingTLS is a client's TLS transport credentials whose configuration
// (the CA, the client certificate) is made anew for each handshake from the
// watched files: new connections use rotated material, established ones
// are not touched. (A tls.Config has GetClientCertificate but no hook for
// the roots a client verifies with; building the config per handshake keeps
// gRPC's own verification and ALPN handling.)
type reloadingTLS struct {
	credentials.TransportCredentials // Info, and a server side never used
	config                           func() *tls.Config
}

func (c *reloadingTLS) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.config()).ClientHandshake(ctx, authority, conn)
}

func (c *reloadingTLS) Clone() credentials.TransportCredentials {
	return &reloadingTLS{TransportCredentials: c.TransportCredentials.Clone(), config: c.config}
}

// OverrideServerName is deprecated in gRPC and unused here: the server
// name is Client.ServerName, or the address dialled.
func (c *reloadingTLS) OverrideServerName(string) error {
	return errors.New("auth: OverrideServerName is not supported; set Client.ServerName")
}
