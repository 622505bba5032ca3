//go:build !linux

package childproc

import "syscall"

// childAttr puts a child in its own process group (a Ctrl-C in the terminal
// reaches the parent, which stops its children in order); only Linux can
// signal a child when its parent dies.
func childAttr(syscall.Signal) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
