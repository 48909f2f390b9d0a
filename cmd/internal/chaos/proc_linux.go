package main

import "syscall"

// childAttr makes a worker process die with the suite, so that an
// interrupted run leaves no worker behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
