package main

import "syscall"

// procAttr makes a child process die with the soak, so that an interrupted or crashed
// soak leaves no service running.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
