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

// A replica whose RunSchedule stopped while every attempt was failing is
// excused by requests it saw time out near its shutdown, as by late
// answers the proxy saw; without them it is judged. One whose context
// ended before RunSchedule began is clean only after a SIGTERM.
func TestCheckProcsTimedOutAndEndedBeforeRun(t *testing.T) {
	now := time.Now()
	const lease = 3 * time.Second
	termed := ProcExit{Name: "replica-3", Started: now, TermedAt: now.Add(time.Second), ExitedAt: now.Add(1100 * time.Millisecond)}
	judge := func(p ProcExit, events ...Event) string {
		var got []string
		in := CheckInput{Timing: Timing{Lease: lease}, Procs: []ProcExit{p}, Events: events}
		checkProcs(in, func(f string, a ...any) { got = append(got, fmt.Sprintf(f, a...)) }, &Stats{})
		return strings.Join(got, "\n")
	}
	start := Event{Kind: EvStart, Replica: "replica-3"}
	failing := Event{Kind: EvExit, Replica: "replica-3", Err: ExitStoppedFailing + "acquire: context canceled"}
	if got := judge(termed, start, failing); !strings.Contains(got, "no fault on the replica") {
		t.Errorf("a stop while failing, with no fault near, was not judged: %q", got)
	}
	timedOut := Event{Kind: EvTimedOut, Replica: "replica-3", B: now.Add(200 * time.Millisecond).UnixNano(), A: now.Add(600 * time.Millisecond).UnixNano()}
	if got := judge(termed, start, timedOut, failing); got != "" {
		t.Errorf("a stop while failing, its requests timing out, was judged: %q", got)
	}
	early := Event{Kind: EvExit, Replica: "replica-3", Err: ExitEndedBeforeRun + "run: context canceled"}
	if got := judge(termed, start, early); got != "" {
		t.Errorf("a RunSchedule whose context a SIGTERM ended before it began was judged: %q", got)
	}
	untermed := termed
	untermed.TermedAt = time.Time{}
	if got := judge(untermed, start, early); !strings.Contains(got, "without a SIGTERM") {
		t.Errorf("a context ended before RunSchedule without a SIGTERM was not judged: %q", got)
	}
}
