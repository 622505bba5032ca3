// Package clitest helps the commands' tests (cmd/internal/opcmd,
// cmd/internal/labcmd, cmd/inferlb) run a command in the test's process.
package clitest

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/inferlb/inferlb/cmd/internal/cliconfig"
)

// ResetFlags puts a command's flags back to their defaults (a root built
// once for a package's tests keeps its flags' values between them).
func ResetFlags(t *testing.T, fs *pflag.FlagSet) {
	t.Helper()
	fs.VisitAll(func(f *pflag.Flag) {
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			_ = sv.Replace(nil)
		} else if err := f.Value.Set(f.DefValue); err != nil {
			t.Fatalf("resetting --%s: %v", f.Name, err)
		}
		f.Changed = false
		delete(f.Annotations, cliconfig.OriginAnnotation)
	})
}

// Refused runs root with args, a command that must refuse its settings
// before it serves (its context is cancelled: one that passes must not
// serve), from its flags' defaults, and checks the error contains want. It
// returns the error.
func Refused(t *testing.T, root *cobra.Command, want string, args ...string) error {
	t.Helper()
	cmd, _, err := root.Find(args[:1])
	if err != nil {
		t.Fatal(err)
	}
	// The command's flags keep their values between runs: back to the
	// defaults first, and after.
	ResetFlags(t, cmd.Flags())
	defer ResetFlags(t, cmd.Flags())
	root.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = root.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v\nwant it to contain %q", err, want)
	}
	return err
}
