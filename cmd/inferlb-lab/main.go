// Command inferlb-lab is the lab that builds and measures inferlb: the
// engine simulator, the load generator, the fleet simulator, the demo, the
// live view and the benchmarks (cmd/internal/labcmd), beside the operator's
// commands (cmd/internal/opcmd), which the demo and the benchmarks start by
// running this binary again.
package main

import (
	"github.com/inferlb/inferlb/cmd/internal/cli"
	"github.com/inferlb/inferlb/cmd/internal/labcmd"
)

// version is set at link time (make build: -X main.version=$(git describe));
// empty, the version comes from the binary's build info.
var version string

func main() { cli.Main(labcmd.NewRoot(version)) }
