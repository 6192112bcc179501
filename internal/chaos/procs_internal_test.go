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

// A true IsLeader reading that spans a whole SIGSTOP and returned a
// deadline that passed before SIGCONT was taken before the stop (after
// it, IsLeader would have been false): the tenure ends at that deadline,
// and a newer fence taken by another replica during the stop does not
// overlap it. With a deadline past SIGCONT the reading could have been
// taken after the stop, and the overlap stands. (Fault seed 13.)
func TestWindowsReadingAcrossAStop(t *testing.T) {
	base := time.Now()
	at := func(ms int) int64 { return base.Add(time.Duration(ms) * time.Millisecond).UnixNano() }
	stop := Interval{From: time.Unix(0, at(1700)), To: time.Unix(0, at(4540))}
	history := func(deadline int64) CheckInput {
		return CheckInput{
			Timing: Timing{Lease: time.Second},
			End:    time.Unix(0, at(10000)),
			Procs: []ProcExit{
				{Name: "replica-2", Started: base, Pauses: []Interval{stop}},
				{Name: "replica-4", Started: base},
			},
			Events: []Event{
				{Kind: EvBelief, Replica: "replica-2", B: at(1550), A: at(1550)},
				{Kind: EvBelief, Replica: "replica-2", OK: true, Fence: 2, Deadline: at(2318), B: at(1555), A: at(1556)},
				{Kind: EvBelief, Replica: "replica-2", OK: true, Fence: 2, Deadline: deadline, B: at(1688), A: at(4546)},
				{Kind: EvBelief, Replica: "replica-2", B: at(4546), A: at(4547)},
				{Kind: EvBelief, Replica: "replica-4", B: at(2901), A: at(2901)},
				{Kind: EvBelief, Replica: "replica-4", OK: true, Fence: 3, Deadline: at(3752), B: at(2903), A: at(2903)},
				{Kind: EvBelief, Replica: "replica-4", B: at(3700), A: at(3700)},
			},
		}
	}
	judge := func(in CheckInput) []string {
		var got []string
		ws := Windows(in, func(f string, a ...any) { got = append(got, fmt.Sprintf(f, a...)) }, &Stats{})
		for i, a := range ws {
			for _, b := range ws[i+1:] {
				if a.Replica != b.Replica && a.Start.Before(b.End) && b.Start.Before(a.End) {
					got = append(got, fmt.Sprintf("fence %d overlaps fence %d", a.Fence, b.Fence))
				}
			}
		}
		return got
	}
	if got := judge(history(at(2318))); len(got) != 0 {
		t.Errorf("a reading taken before the stop, its deadline passed in it, was judged live after it: %q", got)
	}
	if got := judge(history(at(4600))); len(got) == 0 {
		t.Error("a reading whose deadline outlasted the stop was judged taken before it")
	}
}
