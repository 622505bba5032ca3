package demo

import "syscall"

// childAttr puts a child in its own process group (a Ctrl-C in the
// terminal reaches the demo, which stops its children in order) and has the
// kernel send it SIGTERM if the demo dies without stopping it (killed, or
// its test timed out), so no engine, Envoy or load generator outlives it
// holding the demo's ports.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
