package procs

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// execChild makes this test binary, started by TestExecSysmonAwake with
// it set, call ExecSysmonAwake and print what the process then runs with.
const execChild = "PROCS_TEST_EXEC_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(execChild) == "1" {
		if err := ExecSysmonAwake(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Printf("pid=%d GODEBUG=%s\n", os.Getpid(), os.Getenv("GODEBUG"))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestWithSysmonAwake(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     []string
		want    []string
		changed bool
	}{
		{"no GODEBUG", []string{"A=1"}, []string{"A=1", "GODEBUG=" + SysmonAwake}, true},
		{"empty GODEBUG", []string{"GODEBUG=", "A=1"}, []string{"GODEBUG=" + SysmonAwake, "A=1"}, true},
		{"other settings kept", []string{"GODEBUG=madvdontneed=1"}, []string{"GODEBUG=madvdontneed=1," + SysmonAwake}, true},
		{"the operator's schedtrace wins", []string{"GODEBUG=schedtrace=0"}, []string{"GODEBUG=schedtrace=0"}, false},
		{"schedtrace among others", []string{"GODEBUG=gctrace=1,schedtrace=1000"}, []string{"GODEBUG=gctrace=1,schedtrace=1000"}, false},
		{"after an exec: unchanged", []string{"GODEBUG=" + SysmonAwake}, []string{"GODEBUG=" + SysmonAwake}, false},
		{"a name that only contains it", []string{"XGODEBUG=schedtrace=0"}, []string{"XGODEBUG=schedtrace=0", "GODEBUG=" + SysmonAwake}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := slices.Clone(c.env)
			got, changed := WithSysmonAwake(in)
			if !slices.Equal(got, c.want) || changed != c.changed {
				t.Errorf("WithSysmonAwake(%q) = %q, %v; want %q, %v", c.env, got, changed, c.want, c.changed)
			}
			if !slices.Equal(in, c.env) {
				t.Errorf("the caller's environment was modified: %q", in)
			}
		})
	}
}

// The process executes itself again, keeping its pid, with the setting in
// GODEBUG, and only once; an operator's schedtrace is left alone.
func TestExecSysmonAwake(t *testing.T) {
	var base []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GODEBUG=") {
			base = append(base, kv)
		}
	}
	for _, c := range []struct {
		godebug, want string
	}{
		{"", SysmonAwake},
		{"madvdontneed=1", "madvdontneed=1," + SysmonAwake},
		{"schedtrace=0", "schedtrace=0"},
	} {
		t.Run("GODEBUG="+c.godebug, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(slices.Clone(base), execChild+"=1")
			if c.godebug != "" {
				cmd.Env = append(cmd.Env, "GODEBUG="+c.godebug)
			}
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			want := "pid=" + strconv.Itoa(cmd.Process.Pid) + " GODEBUG=" + c.want + "\n"
			if string(out) != want {
				t.Errorf("child printed %q, want %q", out, want)
			}
		})
	}
}
