package procs

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// The Go runtime's monitor thread (sysmon) sleeps deeply once every P is
// idle, and the next goroutine to enter a system call wakes it (a futex
// wake-up). Woken so, sysmon bets that more system calls follow: it polls
// every 20 µs for at least a millisecond before backing off again. A
// service that answers one request at a time goes idle between requests
// and makes a few socket calls for each, so sysmon is woken again before
// it has backed off, and spends most of its time waking every 20 µs: on
// ext_proc's protocol benchmark (8 KB bodies, one request at a time, two
// CPUs) about a sixth of the service's CPU per decision.
//
// The runtime keeps sysmon out of the deep sleep when it has a scheduler
// trace to print (GODEBUG=schedtrace=N, in milliseconds); then, idle, it
// backs off to one wake-up every 10 ms and stays there until it has work
// (a P to retake from a system call, a goroutine to preempt). SysmonAwake
// asks for a trace every 2^31-1 ms (24.8 days), the largest period: the
// runtime prints one line (SCHED ...) to stderr every 24.8 days of the
// host's monotonic clock, so the first comes at start on a host that has
// run longer than that. GODEBUG is read once, when the process starts, so
// the setting needs a new process image: ExecSysmonAwake.
const SysmonAwake = "schedtrace=2147483647"

// ErrNoExec is returned by ExecSysmonAwake when the process cannot
// execute itself again (its executable is unknown, or exec failed).
var ErrNoExec = errors.New("procs: cannot re-execute the process")

// WithSysmonAwake returns env with SysmonAwake added to GODEBUG, and
// whether it added it. An environment whose GODEBUG sets schedtrace
// already is the operator's choice and is returned unchanged
// (GODEBUG=schedtrace=0 keeps the runtime's default).
func WithSysmonAwake(env []string) ([]string, bool) {
	for i, kv := range env {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			continue
		}
		for _, setting := range strings.Split(v, ",") {
			if strings.HasPrefix(strings.TrimSpace(setting), "schedtrace=") {
				return env, false
			}
		}
		out := append([]string(nil), env...)
		if strings.TrimSpace(v) == "" {
			out[i] = "GODEBUG=" + SysmonAwake
		} else {
			out[i] = kv + "," + SysmonAwake
		}
		return out, true
	}
	return append(append([]string(nil), env...), "GODEBUG="+SysmonAwake), true
}

// ExecSysmonAwake replaces the process image with the same executable and
// arguments, its environment's GODEBUG extended by WithSysmonAwake; the
// process keeps its pid, open files and parent. It returns nil without
// doing anything when the environment already says (GODEBUG sets
// schedtrace, as it does after the exec), and an error only if the exec
// could not be made, in which case the process goes on as it was. Call it
// first thing, before any goroutine, listener or file of the process's own.
func ExecSysmonAwake() error {
	env, changed := WithSysmonAwake(os.Environ())
	if !changed {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoExec, err)
	}
	if err := syscall.Exec(exe, os.Args, env); err != nil {
		return fmt.Errorf("%w: exec %s: %v", ErrNoExec, exe, err)
	}
	return nil // not reached: exec replaced the process
}
