package chaos

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sigtermed runs a process that SIGTERM ends (sleep, which installs no
// handler) and returns how it exited.
func sigtermed(t *testing.T) error {
	t.Helper()
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	if err == nil {
		t.Fatal("sleep survived SIGTERM")
	}
	return err
}

// A replica SIGTERMed before it recorded its start (its handler is put in
// place before that) never ran the library: not a violation. One that
// recorded its start and then died of the signal is one.
func TestCheckProcsSIGTERMBeforeStart(t *testing.T) {
	err := sigtermed(t)
	if !endedBy(err, syscall.SIGTERM) || endedBy(err, syscall.SIGKILL) || endedBy(fmt.Errorf("exit status 1"), syscall.SIGTERM) {
		t.Fatalf("endedBy(%v) misjudged", err)
	}
	now := time.Now()
	proc := ProcExit{Name: "replica-6", Err: err, Started: now, TermedAt: now.Add(time.Millisecond), ExitedAt: now.Add(2 * time.Millisecond)}
	judge := func(events []Event) []string {
		var got []string
		checkProcs(CheckInput{Procs: []ProcExit{proc}, Events: events}, func(f string, a ...any) { got = append(got, fmt.Sprintf(f, a...)) }, &Stats{})
		return got
	}
	if got := judge(nil); len(got) != 0 {
		t.Errorf("a replica SIGTERMed before its start was judged: %q", got)
	}
	got := judge([]Event{{Kind: EvStart, Replica: "replica-6", T: now.UnixNano()}})
	if !strings.Contains(strings.Join(got, "\n"), "replica-6 exited with") {
		t.Errorf("a replica that started, then died of SIGTERM, was not judged: %q", got)
	}
}
