package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inferlb/inferlb/cmd/internal/cli"
	"github.com/inferlb/inferlb/cmd/internal/labcmd"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/internal/procs"
)

// runAsMain makes this test binary act as the inferlb-lab command (which
// has every serving command) when the environment says so.
const runAsMain = "INFERLB_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runAsMain) == "1" {
		cli.Main(labcmd.NewRoot(""))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// freeAddr is a loopback address no one listened on a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The serving commands, run as a user runs them, execute themselves again
// with procs.SysmonAwake in GODEBUG before they serve (same pid), and not
// with --keep-sysmon-awake=false.
func TestServingCommandsKeepSysmonAwake(t *testing.T) {
	for _, c := range []struct {
		name   string
		args   func(addr string) []string
		health string
	}{
		{"extproc", func(addr string) []string {
			return []string{"extproc", "--listen", "127.0.0.1:0", "--http-listen", addr, "--policy-file", "../../../examples/policy-eu-west.json",
				"--node-id", "frontend-eu-west", "--region", "eu-west", "--insecure", "--log-level", "warn"}
		}, "/healthz"},
		{"control-plane", func(addr string) []string {
			return []string{"control-plane", "--fleet", "../../../examples/fleet-3region.yaml", "--insecure", "--xds-listen", "127.0.0.1:0",
				"--admin-listen", addr, "--log-level", "warn"}
		}, "/healthz"},
		{"engine-sim", func(addr string) []string {
			return []string{"engine-sim", "--listen", addr, "--model", "m"}
		}, "/health"},
	} {
		for _, on := range []bool{true, false} {
			name := c.name
			if !on {
				name += " --keep-sysmon-awake=false"
			}
			t.Run(name, func(t *testing.T) {
				addr := freeAddr(t)
				args := c.args(addr)
				if !on {
					args = append(args, "--keep-sysmon-awake=false")
				}
				cmd := exec.Command(os.Args[0], args...)
				var env []string
				for _, kv := range os.Environ() {
					if !strings.HasPrefix(kv, "GODEBUG=") {
						env = append(env, kv)
					}
				}
				cmd.Env = append(env, runAsMain+"=1")
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				defer func() {
					_ = cmd.Process.Signal(syscall.SIGTERM)
					_ = cmd.Wait()
				}()
				// Serving means the exec, if any, is behind it.
				hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
				if err := envoytest.Poll(context.Background(), 30*time.Second, 20*time.Millisecond, func() error {
					resp, err := hc.Get("http://" + addr + c.health)
					if err != nil {
						return err
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						return fmt.Errorf("%s: %s", c.health, resp.Status)
					}
					return nil
				}); err != nil {
					t.Fatalf("%s not serving: %v\n%s", c.name, err, out.String())
				}
				environ, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/environ")
				if err != nil {
					t.Fatal(err)
				}
				got := strings.Contains(string(environ), "GODEBUG="+procs.SysmonAwake)
				if got != on {
					t.Errorf("pid %d runs with GODEBUG=%s: %v, want %v", cmd.Process.Pid, procs.SysmonAwake, got, on)
				}
			})
		}
	}
}
