// Package leakcheck finds goroutines left running after the tests: every
// goroutine but the caller's, the runtime's and package testing's own is a
// leak. TestMain calls Find after m.Run has returned and the test servers
// are closed.
package leakcheck

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"time"
)

// ignored lists functions whose presence in a goroutine's stack marks it as
// the runtime's or package testing's own, not one the code under test
// started.
var ignored = []string{
	"testing.(*M).",
	"testing.RunTests",
	"testing.runTests",
	"testing.(*T).Run",
	"testing.tRunner",
	"testing.runFuzzing",
	"testing.runFuzzTests",
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"runtime.ReadTrace",
	"runtime/trace.Start",
}

// Find returns nil once only the caller's, the runtime's and package
// testing's goroutines are left, or an error listing the stacks of the
// others if some are still running after timeout. Goroutines that are
// winding down (closing connections, returning from a cancelled call) get
// that long to exit: Find looks again every few milliseconds.
//
// Each settle is called before each look over the first half of timeout,
// until a look finds nothing left (closing the idle connections of the
// test server's clients, say: a request that ended after the server was
// closed returns its connection to the idle pool, where it stays). Then
// Find waits a tenth of timeout with no settle, and only a look after that
// wait can find nothing left: code still at work (a timer left running,
// sending requests) shows again meanwhile.
func Find(timeout time.Duration, settle ...func()) error {
	start := time.Now()
	deadline := start.Add(timeout)
	for len(settle) > 0 && time.Since(start) < timeout/2 {
		for _, f := range settle {
			f()
		}
		if len(Running()) == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(settle) > 0 {
		time.Sleep(timeout / 10)
	}
	wait := time.Millisecond
	for {
		leaked := Running()
		if len(leaked) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d goroutine(s) still running:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// Running returns the stacks of the goroutines that are running now, except
// the caller's, the runtime's and package testing's.
func Running() []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	// The first stack is the caller's goroutine; stacks are separated by a
	// blank line.
	stacks := bytes.Split(buf, []byte("\n\n"))
	var out []string
	for _, st := range stacks[1:] {
		s := strings.TrimSpace(string(st))
		if s == "" || isIgnored(s) {
			continue
		}
		out = append(out, s)
	}
	return out
}

func isIgnored(stack string) bool {
	for _, fn := range ignored {
		if strings.Contains(stack, "\n"+fn) {
			return true
		}
	}
	return false
}
