//go:build !linux

package childproc

import "syscall"

// childAttr puts a child in its own process group (a Ctrl-C in the terminal
// reaches the parent, which stops its children in order).
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
