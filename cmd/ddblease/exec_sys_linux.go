package main

import "syscall"

// sysProcAttr puts the child in a process group of its own, and has the
// kernel kill it if ddblease exec dies (SIGKILL included).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
