package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// event is one line a child printed.
type event struct {
	kind   string
	at     time.Time // the child's wall clock
	fields map[string]string
}

// proc is a child process of the bench and the events it printed.
type proc struct {
	name      string
	cmd       *exec.Cmd
	spawnedAt time.Time // just before exec, by the parent's clock

	mu      sync.Mutex
	events  []event
	changed chan struct{} // closed and replaced on every new event
	exited  chan struct{}
	exitErr error
}

// spawn starts the bench binary again with args, logging its stderr to log.
func spawn(name string, log io.Writer, args ...string) (*proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = log
	cmd.SysProcAttr = childAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, changed: make(chan struct{}), exited: make(chan struct{})}
	p.spawnedAt = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for sc.Scan() {
			if ev, ok := parseEvent(sc.Text()); ok {
				p.add(ev)
			}
		}
		err := cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.exited)
		p.add(event{kind: "_EOF", at: time.Now()})
	}()
	return p, nil
}

func parseEvent(line string) (event, bool) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return event{}, false
	}
	ns, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return event{}, false
	}
	ev := event{kind: f[0], at: time.Unix(0, ns), fields: map[string]string{}}
	if ev.kind == "COUNTS" {
		ev.fields["counts"] = strings.Join(f[2:], " ")
		return ev, true
	}
	for _, kv := range f[2:] {
		k, v, _ := strings.Cut(kv, "=")
		ev.fields[k] = v
	}
	return ev, true
}

func (p *proc) add(ev event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, ev)
	close(p.changed)
	p.changed = make(chan struct{})
}

// nth waits up to timeout for the n-th (1-based) event of kind.
func (p *proc) nth(kind string, n int, timeout time.Duration) (event, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		seen := 0
		eof := false
		for _, ev := range p.events {
			if ev.kind == kind {
				if seen++; seen == n {
					p.mu.Unlock()
					return ev, nil
				}
			}
			eof = eof || ev.kind == "_EOF"
		}
		ch := p.changed
		p.mu.Unlock()
		if eof {
			return event{}, fmt.Errorf("%s exited (%v) before %s #%d; its events: %s", p.name, p.exitErr, kind, n, p.history())
		}
		select {
		case <-ch:
		case <-deadline.C:
			return event{}, fmt.Errorf("%s: no %s #%d within %v; its events: %s", p.name, kind, n, timeout, p.history())
		}
	}
}

// history lists the kinds and times of the events so far.
func (p *proc) history() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var parts []string
	for _, ev := range p.events {
		if ev.kind != "COUNTS" {
			parts = append(parts, fmt.Sprintf("%s@%s%v", ev.kind, ev.at.Format("15:04:05.000"), ev.fields))
		}
	}
	return strings.Join(parts, " ")
}

// first waits for the first event of kind.
func (p *proc) first(kind string, timeout time.Duration) (event, error) {
	return p.nth(kind, 1, timeout)
}

// all returns the events of kind so far.
func (p *proc) all(kind string) []event {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []event
	for _, ev := range p.events {
		if ev.kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// signal sends sig and returns the time just before it was sent.
func (p *proc) signal(sig syscall.Signal) (time.Time, error) {
	t := time.Now()
	return t, p.cmd.Process.Signal(sig)
}

// wait waits up to timeout for the process to exit, and kills it if it
// does not.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.exited:
		return nil
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not exit within %v; killed", p.name, timeout)
	}
}

// stop sends SIGTERM and waits for the exit, killing after timeout.
func (p *proc) stop(timeout time.Duration) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_, _ = p.signal(syscall.SIGTERM)
	return p.wait(timeout)
}
