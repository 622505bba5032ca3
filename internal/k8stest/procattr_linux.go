package k8stest

import "syscall"

// The servers die with the test binary (Pdeathsig) even if it is killed
// before its cleanups run: no etcd or API server outlives a test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
