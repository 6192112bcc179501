package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// On Linux, COMMAND runs under a supervisor: ddblease itself, started
// again as the leader of COMMAND's process group with supervisorEnv set.
// It is a child subreaper, so every descendant of COMMAND stays below it
// (exec_tree_linux.go), those that leave the process group included. It
// passes SIGTERM and SIGINT on to the descendants outside the group
// (ddblease exec signals the group), and kills every descendant when
// COMMAND exits, when ddblease exec asks (stopAll), and when ddblease exec
// dies for any reason, SIGKILL included: the kernel then sends it stopAll
// as its parent-death signal. It reports how COMMAND ended on file
// descriptor 3.
const supervisorEnv = "DDBLEASE_EXEC_SUPERVISOR"

// stopAll is SIGRTMIN+12: no one else sends it to the supervisor.
const stopAll = syscall.Signal(0x2c)

// sweepBound bounds the supervisor's killing of the tree (killTree).
const sweepBound = 2 * time.Second

func init() {
	if parent := os.Getenv(supervisorEnv); parent != "" {
		os.Exit(supervise(parent))
	}
}

// childCommand returns the process that runs argv: the supervisor, leading a
// process group of its own, which runs argv in that group.
func childCommand(argv, env []string) (*exec.Cmd, []*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command("/proc/self/exe", argv...)
	cmd.Args[0] = "ddblease-exec-supervisor"
	cmd.Env = append(env, supervisorEnv+"="+strconv.Itoa(os.Getpid()))
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: stopAll}
	return cmd, []*os.File{r, w}, nil
}

// supervise runs COMMAND (os.Args[1:]) in this process's group and
// returns the exit status of the supervisor.
func supervise(parent string) int {
	runtime.LockOSThread() // COMMAND's parent-death signal is bound to this thread
	status := os.NewFile(3, "status")
	syscall.CloseOnExec(3)
	// SIGTERM and SIGINT to the group are for COMMAND; stopAll ends it.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, stopAll, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	if strconv.Itoa(os.Getppid()) != parent || len(os.Args) < 2 {
		return 1 // ddblease exec died before the signal was caught
	}
	_ = os.Unsetenv(supervisorEnv)
	if err := becomeSubreaper(); err != nil {
		fmt.Fprintf(status, "error becoming a child subreaper: %v\n", err)
		return 127
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(status, "error %v\n", err)
		return 127
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	self, keep := os.Getpid(), cmd.Process.Pid
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case stopAll:
				killTree(self, true, keep, sweepBound)
			case syscall.SIGCHLD:
				reapAdopted(keep)
			default:
				signalOutside(self, sig.(syscall.Signal))
			}
		case err := <-done:
			fmt.Fprintln(status, report(err))
			_ = status.Close()
			// Whatever COMMAND left running goes with it.
			killTree(self, true, 0, sweepBound)
			return 0
		}
	}
}

// kill kills COMMAND and every process it started: the supervisor kills
// them, and exits. A supervisor that does not exit within supervisorGrace
// (stopped by SIGSTOP, say) has them killed from here, and is killed too.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	if err := p.sup.Signal(stopAll); err != nil {
		return // already reaped
	}
	go func() {
		select {
		case <-p.done:
		case <-time.After(supervisorGrace):
			killTree(p.pid, false, 0, sweepBound)
			p.signal(syscall.SIGKILL)
		}
	}()
}

// supervisorGrace is how long kill lets the supervisor do its work.
const supervisorGrace = sweepBound + 3*time.Second
