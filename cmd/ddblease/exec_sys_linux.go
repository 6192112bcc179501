package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
)

// On Linux, COMMAND runs under a supervisor: ddblease itself, started
// again as the leader of COMMAND's process group with supervisorEnv set.
// The kernel sends the supervisor parentGone when ddblease exec dies, for
// any reason (SIGKILL included), and the supervisor then kills the whole
// group, so that no process of COMMAND outlives ddblease exec. It reports
// how COMMAND ended on file descriptor 3.
const supervisorEnv = "DDBLEASE_EXEC_SUPERVISOR"

// parentGone is SIGRTMIN+12: no one else sends it to the group.
const parentGone = syscall.Signal(0x2c)

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
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: parentGone}
	return cmd, []*os.File{r, w}, nil
}

// supervise runs COMMAND (os.Args[1:]) in this process's group and
// returns the exit status of the supervisor.
func supervise(parent string) int {
	runtime.LockOSThread() // COMMAND's parent-death signal is bound to this thread
	status := os.NewFile(3, "status")
	syscall.CloseOnExec(3)
	// SIGTERM and SIGINT to the group are for COMMAND; parentGone ends it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, parentGone, syscall.SIGTERM, syscall.SIGINT)
	if strconv.Itoa(os.Getppid()) != parent || len(os.Args) < 2 {
		return 1 // ddblease exec died before the signal was caught
	}
	_ = os.Unsetenv(supervisorEnv)
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(status, "error %v\n", err)
		return 127
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			if sig == parentGone {
				_ = syscall.Kill(0, syscall.SIGKILL)
			}
		case err := <-done:
			fmt.Fprintln(status, report(err))
			_ = status.Close()
			// Whatever COMMAND left running in the group goes with it,
			// and so does the supervisor: its report is what counts.
			_ = syscall.Kill(0, syscall.SIGKILL)
			return 1
		}
	}
}
