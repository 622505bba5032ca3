// Package opcmd holds the commands an operator runs, each in its own file:
// the two services (control-plane, extproc) and the tools around them
// (validate, solve, profile, explain-key, token). cmd/inferlb is these
// commands alone; cmd/inferlb-lab adds the lab's (cmd/internal/labcmd) to
// them.
package opcmd

import (
	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/cmd/internal/cli"
)

// rootLong is inferlb --help's text.
const rootLong = `inferlb balances LLM inference traffic across engines in several regions.

An xDS control plane (control-plane) computes each frontend's share of traffic
per engine with a latency-minimizing optimizer and pushes it to Envoy as EDS
weights; an ext_proc service (extproc) in Envoy's request path adds
cache-affinity keys, eligibility, retry allowances and load-shedding decisions.

Beside the two services: validate (fleet specs), solve (the optimizer on its
own), profile (fit an engine's latency profile), explain-key (which affinity
key a request gets) and token (a bearer token for the control plane's port).

The lab that builds and measures inferlb (engine simulators, the load
generator, the fleet simulator, the demo, the benchmarks) is a binary of its
own: inferlb-lab.`

// NewRoot returns the operator's binary, inferlb: its root command with
// every operator command. version is the one linked into the binary.
func NewRoot(version string) *cobra.Command {
	root := cli.NewRoot("inferlb", "A global load balancer for LLM inference, built on Envoy", rootLong, version)
	Add(root)
	return root
}

// TimeScaleFlag is control-plane's flag for engine simulators in scaled
// time: hidden in the operator's binary (real engines run in real time),
// shown in the lab's.
const TimeScaleFlag = "time-scale"

// Add adds the operator's commands to root.
func Add(root *cobra.Command) {
	root.AddCommand(newControlPlaneCmd(), newExtprocCmd(), newValidateCmd(), newSolveCmd(),
		newProfileCmd(), newExplainKeyCmd(), newTokenCmd())
}
