//go:build !linux

package main

import "syscall"

// docProcAttr puts a documented command in its own process group (SIGINT
// reaches all of it, as Ctrl-C does).
func docProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
