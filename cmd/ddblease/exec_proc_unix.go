//go:build unix

package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// proc is a running COMMAND, the leader of its own process group: a signal
// to it goes to the whole group, so that a shell's children get it too.
type proc struct {
	pid  int
	done chan struct{} // closed once the child has exited and its group is gone
	err  error         // what exec.Cmd.Wait returned; set before done closes

	mu   sync.Mutex
	last []byte // the tail of its stderr, when kept
	keep int
}

// stderrDrain bounds the wait for the child's stderr to reach its end after
// the child exited (a process that left the group may hold it open).
const stderrDrain = time.Second

// startProc starts argv with env in a new process group. Its stdout goes to
// stdout, its stderr to stderr, and the last keep bytes of its stderr are
// kept (tail). When the child exits, whatever it left running in its
// process group is killed.
func startProc(argv, env []string, stdout, stderr io.Writer, keep int) (*proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdin = os.Stdin
	cmd.Stdout = stdout
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = stderrDrain
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = w
	p := &proc{done: make(chan struct{}), keep: keep}
	copied := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		defer close(p.done)
		// The child's parent-death signal is bound to the thread that
		// started it: keep that thread until the child is reaped.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			_ = w.Close()
			_ = r.Close()
			started <- err
			return
		}
		_ = w.Close()
		p.pid = cmd.Process.Pid
		go func() {
			defer close(copied)
			p.copy(r, stderr)
		}()
		started <- nil
		p.err = cmd.Wait()
		// Leftovers in the group (a shell's background jobs) go with it.
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		select {
		case <-copied:
		case <-time.After(stderrDrain):
			_ = r.Close()
			<-copied
		}
		_ = r.Close()
	}()
	if err := <-started; err != nil {
		<-p.done
		return nil, err
	}
	return p, nil
}

func (p *proc) copy(r io.Reader, w io.Writer) {
	buf := make([]byte, 32*1024)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n])
			if p.keep > 0 {
				p.mu.Lock()
				p.last = append(p.last, buf[:n]...)
				if len(p.last) > p.keep {
					p.last = append(p.last[:0], p.last[len(p.last)-p.keep:]...)
				}
				p.mu.Unlock()
			}
		}
		if err != nil {
			return
		}
	}
}

// tail returns the last bytes the child wrote to its stderr.
func (p *proc) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return string(p.last)
}

// signal sends sig to the child's process group.
func (p *proc) signal(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	if err := syscall.Kill(-p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		_ = syscall.Kill(p.pid, sig)
	}
}
