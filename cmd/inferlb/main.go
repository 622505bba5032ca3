// Command inferlb is the one binary of the inferlb load balancer. Each
// component is a subcommand; each subcommand lives in its own file and adds
// itself to the root command in an init function.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

var rootCmd = &cobra.Command{
	Use:   "inferlb",
	Short: "A global load balancer for LLM inference, built on Envoy",
	Long: `inferlb balances LLM inference traffic across engines in several regions.

An xDS control plane (control-plane) computes each frontend's share of traffic
per engine with a latency-minimizing optimizer and pushes it to Envoy as EDS
weights; an ext_proc service (extproc) in Envoy's request path adds
cache-affinity keys, eligibility, retry allowances and load-shedding decisions.

What an operator runs: control-plane and extproc (the two services), validate
(fleet specs), solve (the optimizer on its own), profile (fit an engine's
latency profile), explain-key (which affinity key a request gets) and token (a
bearer token for the control plane's port).

The lab, to build and measure it: engine-sim (vLLM-compatible simulated
engines), loadgen (an LLM-aware load generator), sim (the fleet simulator with
rival policies), demo (everything wired together on one machine), view (a live
terminal view) and bench (measurements: ext_proc's cost, cache affinity
through Envoy, the simulator against the real stack, and inferlb beside the
real SGLang and vLLM routers).`,
	SilenceUsage:  true,
	SilenceErrors: true,
}

// newLogger returns a text slog logger on stderr at the --log-level given
// (debug, info, warn or error); any other value is an error, not a default.
func newLogger(level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})), nil
}

func main() {
	// One root context for the process: SIGINT/SIGTERM cancel it and every
	// runner shuts down from it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := rootCmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "inferlb:", err)
		stop()
		os.Exit(1)
	}
}
