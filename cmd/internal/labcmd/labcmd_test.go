package labcmd

import (
	"os"
	"testing"

	"github.com/inferlb/inferlb/cmd/internal/cli"
)

// runAsMain makes this test binary act as the inferlb-lab command when the
// environment says so: `bench extproc` starts the ext_proc service by
// running its own binary again.
const runAsMain = "INFERLB_TEST_RUN_MAIN"

// rootCmd is the lab's binary the tests run commands of, in their own
// process.
var rootCmd = NewRoot("")

func TestMain(m *testing.M) {
	if os.Getenv(runAsMain) == "1" {
		cli.Main(NewRoot(""))
		os.Exit(0)
	}
	// The tests run the serving commands in this process: they must not
	// replace it (--keep-sysmon-awake).
	cli.ExecSysmonAwake = func() error { return nil }
	os.Exit(m.Run())
}
