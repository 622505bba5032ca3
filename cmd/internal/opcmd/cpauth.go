package opcmd

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/inferlb/inferlb/xds/auth"
)

// controlPlaneAuthFlags adds the flags of a control-plane client's
// credentials (ext_proc, explain-key): one of --insecure, mutual TLS, a
// bearer token, or TLS with a token.
func controlPlaneAuthFlags(f *pflag.FlagSet, a *auth.Client) {
	f.BoolVar(&a.Insecure, "insecure", false, "talk to the control plane without TLS or token (local demos only)")
	f.StringVar(&a.CAFile, "control-plane-ca", "", "CA (PEM) verifying the control plane's certificate: TLS on (re-read for new connections when it changes)")
	f.StringVar(&a.CertFile, "control-plane-cert", "", "client certificate (PEM) for mutual TLS with the control plane (re-read with --control-plane-key for new connections when either changes)")
	f.StringVar(&a.KeyFile, "control-plane-key", "", "the key (PEM) of --control-plane-cert")
	f.StringVar(&a.ServerName, "control-plane-server-name", "", "name the control plane's certificate must carry (default: the host dialled)")
	f.StringVar(&a.TokenFile, "control-plane-token-file", "", "file holding the control plane's shared bearer token (re-read when it changes)")
	for _, name := range []string{"control-plane-ca", "control-plane-cert", "control-plane-key", "control-plane-token-file"} {
		_ = cobra.MarkFlagFilename(f, name) // a config file's relative path is relative to it
	}
}
