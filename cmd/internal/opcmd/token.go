package opcmd

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/spf13/cobra"
)

func newTokenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "token",
		Short: "Print a random bearer token for the control plane's --token-file",
		Long: `token prints 24 random bytes (crypto/rand) as 48 hex digits: a bearer token
for the control plane's xDS/Reports port. Give the file to the control plane
(--token-file) and to every ext_proc (--control-plane-token-file); the
bootstrap ext_proc prints carries it for Envoy. See docs/operations.md.`,
		Example: `  inferlb token > xds-token`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := make([]byte, 24)
			if _, err := rand.Read(b); err != nil {
				return err
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), hex.EncodeToString(b))
			return err
		},
	}
}
