package demo

import "syscall"

// childAttr makes a worker process die with the supervisor, so that an
// interrupted demo leaves no worker behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
