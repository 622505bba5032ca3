package opcmd

import (
	"os"
	"testing"

	"github.com/inferlb/inferlb/cmd/internal/cli"
	"github.com/inferlb/inferlb/cmd/internal/clitest"
)

// rootCmd is the operator's binary the tests run commands of, in their
// own process.
var rootCmd = NewRoot("")

func TestMain(m *testing.M) {
	// The tests run the serving commands in this process: they must not
	// replace it (--keep-sysmon-awake).
	cli.ExecSysmonAwake = func() error { return nil }
	os.Exit(m.Run())
}

// refused runs a command of rootCmd that must refuse its settings
// (clitest.Refused).
func refused(t *testing.T, want string, args ...string) error {
	t.Helper()
	return clitest.Refused(t, rootCmd, want, args...)
}
