package childproc

import "syscall"

// childAttr puts a child in its own process group (a Ctrl-C in the terminal
// reaches the parent, which stops its children in order) and has the kernel
// send it death (SIGTERM when 0) if the parent dies without stopping it, so
// no child outlives it holding its ports.
func childAttr(death syscall.Signal) *syscall.SysProcAttr {
	if death == 0 {
		death = syscall.SIGTERM
	}
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: death}
}
