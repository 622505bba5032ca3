// Package labcmd holds the lab's commands, each in its own file: the
// engine simulator (engine-sim), the load generator (loadgen), the fleet
// simulator (sim), the demo, the live view (view), the benchmarks (bench)
// and profile's --engine-sim mode. cmd/inferlb-lab is these commands beside
// the operator's (cmd/internal/opcmd): the demo, the benchmarks and the
// drills start control planes and ext_procs by running their own binary
// again, so the lab's binary carries every command.
package labcmd

import (
	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/cmd/internal/cli"
	"github.com/inferlb/inferlb/cmd/internal/opcmd"
)

// rootLong is inferlb-lab --help's text.
const rootLong = `inferlb-lab is the lab that builds and measures inferlb: the operator's
commands (control-plane, extproc, validate, solve, profile, explain-key,
token: the inferlb binary) and, to run them against:

engine-sim (vLLM-compatible simulated engines), loadgen (an LLM-aware load
generator), sim (the fleet simulator with rival policies), demo (everything
wired together on one machine), view (a live terminal view) and bench
(measurements: ext_proc's cost, cache affinity through Envoy, the simulator
against the real stack, and inferlb beside the real SGLang and vLLM
routers); profile --engine-sim fits the example fleets' profiles to the
engine simulator.`

// NewRoot returns the lab's binary, inferlb-lab: its root command with the
// operator's commands and the lab's. version is the one linked into the
// binary.
func NewRoot(version string) *cobra.Command {
	root := cli.NewRoot("inferlb-lab", "The lab of inferlb: simulators, load generator, demo and benchmarks beside the operator's commands", rootLong, version)
	opcmd.Add(root)
	root.AddCommand(newEngineSimCmd(), newLoadgenCmd(), newSimCmd(), newDemoCmd(), newViewCmd(), newBenchCmd())
	profile, _, err := root.Find([]string{"profile"})
	if err != nil {
		panic("labcmd: the operator's commands have no profile: " + err.Error())
	}
	addEngineSim(profile)
	// The lab's control planes run against engine simulators in scaled
	// time: --time-scale is one of its settings (a --config key too).
	cp, _, err := root.Find([]string{"control-plane"})
	if err != nil {
		panic("labcmd: the operator's commands have no control-plane: " + err.Error())
	}
	cp.Flags().Lookup(opcmd.TimeScaleFlag).Hidden = false
	return root
}
