package main

import "syscall"

// docProcAttr puts a documented command in its own process group (SIGINT
// reaches all of it, as Ctrl-C does) and has the kernel send it SIGTERM if
// the test process dies first (a timeout), so that no demo outlives the
// test holding the fixed ports.
func docProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
