// Package cli is what the two inferlb binaries share around their commands:
// the root command with its version, the process's main (signals, exit
// status), the logger every command configures with --log-level, and the
// serving commands' --keep-sysmon-awake. The commands themselves are in
// cmd/internal/opcmd (what an operator runs: cmd/inferlb) and
// cmd/internal/labcmd (the lab's simulators, load generator, demo and
// benches: cmd/inferlb-lab, which carries the operator's commands too).
package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// NewRoot returns a binary's root command: name, its one-line and long
// descriptions, and the version linked into the binary (main.version, set
// by make build; empty: the build info's).
func NewRoot(name, short, long, linkedVersion string) *cobra.Command {
	root := &cobra.Command{
		Use:           name,
		Short:         short,
		Long:          long,
		Version:       buildVersion(linkedVersion, readBuildInfo()),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate(name + " {{.Version}}\n")
	return root
}

// Main runs root with the process's arguments and exits: 0, or 1 after
// printing the error under the binary's name. One root context for the
// process: SIGINT/SIGTERM cancel it and every runner shuts down from it.
func Main(root *cobra.Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", root.Name(), err)
		stop()
		os.Exit(1)
	}
}

// NewLogger returns a text slog logger on stderr at the --log-level given
// (debug, info, warn or error); any other value is an error, not a default.
func NewLogger(level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})), nil
}
