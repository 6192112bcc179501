//go:build unix

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a running COMMAND, in a process group of its own: a signal to it
// goes to the whole group, so that a shell's children get it too.
type proc struct {
	pid  int           // the process group's leader
	sup  *os.Process   // that process
	done chan struct{} // closed once COMMAND has exited and its group is gone
	end  procEnd       // how COMMAND ended; set before done closes

	mu   sync.Mutex
	last []byte // the tail of its stderr, when kept
	keep int
}

// procEnd is how COMMAND ended: an exit code, a signal, or an error that
// kept it from running.
type procEnd struct {
	code int
	sig  syscall.Signal // non-zero if a signal ended it
	err  error
}

// stderrDrain bounds the wait for COMMAND's stderr to reach its end after
// its group is gone (a process that left the group may hold it open).
const stderrDrain = time.Second

// startProc starts argv with env in a new process group. Its stdout goes
// to stdout, its stderr to stderr, and the last keep bytes of its stderr
// are kept (tail). When COMMAND exits, whatever it left running in its
// process group is killed (on Linux, whatever it left running anywhere).
func startProc(argv, env []string, stdout, stderr io.Writer, keep int) (*proc, error) {
	cmd, status, err := childCommand(argv, env)
	if err != nil {
		return nil, err
	}
	cmd.Stdin = os.Stdin
	cmd.Stdout = stdout
	cmd.WaitDelay = stderrDrain
	r, w, err := os.Pipe()
	if err != nil {
		closeAll(status...)
		return nil, err
	}
	cmd.Stderr = w
	p := &proc{done: make(chan struct{}), keep: keep}
	copied := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		defer close(p.done)
		// A parent-death signal is bound to the thread that started the
		// child: keep that thread until the child is reaped.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		closeAll(w)
		if len(status) == 2 {
			closeAll(status[1]) // the child's end
		}
		if err != nil {
			closeAll(r)
			if len(status) == 2 {
				closeAll(status[0])
			}
			started <- err
			return
		}
		p.pid, p.sup = cmd.Process.Pid, cmd.Process
		go func() {
			defer close(copied)
			p.copy(r, stderr)
		}()
		started <- nil
		werr := cmd.Wait()
		// Leftovers in the group (a shell's background jobs) go with it.
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		var reported []byte
		if len(status) == 2 {
			reported, _ = io.ReadAll(io.LimitReader(status[0], 4096))
			closeAll(status[0])
		}
		p.end = ended(werr, string(reported))
		select {
		case <-copied:
		case <-time.After(stderrDrain):
			closeAll(r)
			<-copied
		}
		closeAll(r)
	}()
	if err := <-started; err != nil {
		<-p.done
		return nil, err
	}
	return p, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// ended reads how COMMAND ended: from what the supervisor reported (see
// supervise), or else from the wait status of the process started.
func ended(werr error, reported string) procEnd {
	if kind, arg, ok := strings.Cut(strings.TrimSpace(reported), " "); ok {
		n, nerr := strconv.Atoi(arg)
		switch {
		case kind == "exit" && nerr == nil:
			return procEnd{code: n}
		case kind == "signal" && nerr == nil:
			return procEnd{code: 128 + n, sig: syscall.Signal(n)}
		case kind == "error":
			return procEnd{code: 127, err: errors.New(arg)}
		}
	}
	if werr == nil {
		return procEnd{}
	}
	var ee *exec.ExitError
	if !errors.As(werr, &ee) {
		return procEnd{code: 1, err: werr}
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return procEnd{code: 128 + int(ws.Signal()), sig: ws.Signal()}
	}
	return procEnd{code: ee.ExitCode()}
}

// report is what supervise writes for ended: how COMMAND ended.
func report(werr error) string {
	var ee *exec.ExitError
	switch {
	case werr == nil:
		return "exit 0"
	case !errors.As(werr, &ee):
		return "error " + werr.Error()
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("signal %d", int(ws.Signal()))
	}
	return fmt.Sprintf("exit %d", ee.ExitCode())
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

// tail returns the last bytes COMMAND wrote to its stderr.
func (p *proc) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return string(p.last)
}

// signal sends sig to COMMAND's process group (on Linux, the supervisor
// passes SIGTERM and SIGINT on to the processes that left the group).
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
