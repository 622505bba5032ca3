// Command inferlb is what an operator runs: the control plane and the
// ext_proc service, and the tools around them (validate, solve, profile,
// explain-key, token). Its commands are cmd/internal/opcmd's; the lab's
// simulators, load generator, demo and benchmarks are another binary,
// cmd/inferlb-lab, which this one does not link.
package main

import (
	"github.com/inferlb/inferlb/cmd/internal/cli"
	"github.com/inferlb/inferlb/cmd/internal/opcmd"
)

// version is set at link time (make build: -X main.version=$(git describe));
// empty, the version comes from the binary's build info.
var version string

func main() { cli.Main(opcmd.NewRoot(version)) }
