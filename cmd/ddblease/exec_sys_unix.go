//go:build unix && !linux

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// childCommand returns the process that runs argv: argv itself, leading a
// process group of its own. If ddblease exec is killed, COMMAND is not;
// a process that leaves the group is out of reach.
func childCommand(argv, env []string) (*exec.Cmd, []*os.File, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil, nil
}

// kill kills COMMAND's process group.
func (p *proc) kill() { p.signal(syscall.SIGKILL) }
