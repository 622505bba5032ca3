package cli

import (
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/inferlb/inferlb/internal/procs"
)

// SysmonFlag adds --keep-sysmon-awake to a serving command (extproc,
// control-plane, engine-sim): processes that answer small requests one at
// a time, where the Go runtime's monitor thread costs most (procs.SysmonAwake).
func SysmonFlag(f *pflag.FlagSet, p *bool) {
	f.BoolVar(p, "keep-sysmon-awake", true, "start again at once with GODEBUG=schedtrace=2147483647, which keeps the Go runtime's monitor thread out of its deep sleep: otherwise, one request at a time, the socket calls after each idle moment wake it and it polls every 20 µs (ext_proc: about a sixth of its CPU per decision); idle, it then wakes every 10 ms, and the runtime prints a scheduler line to stderr once in 24.8 days; GODEBUG's schedtrace in the environment overrides it (schedtrace=0: the runtime's default)")
}

// ExecSysmonAwake is procs.ExecSysmonAwake; the commands' tests, which run
// the serving commands in their own process, replace it so that the test
// binary is not executed again in their place.
var ExecSysmonAwake = procs.ExecSysmonAwake

// KeepSysmonAwake, when on, replaces the process with itself, the same
// arguments and GODEBUG extended by procs.SysmonAwake (once: the new image
// finds it set). Call it after the command's flags are checked and before
// it starts anything. If the exec cannot be made the process goes on as it
// is, and says so.
func KeepSysmonAwake(on bool, log *slog.Logger) {
	if !on {
		return
	}
	if err := ExecSysmonAwake(); err != nil {
		log.Warn("running with the runtime's monitor thread as it is", "err", err)
	}
}
