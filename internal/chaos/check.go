package chaos

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ddblease/ddblease"
)

// ProcExit is how a replica process lived and ended, as the harness saw
// it (real times).
type ProcExit struct {
	Name   string
	Killed bool // by the plan's SIGKILL
	Err    error
	Stderr string

	Started, KilledAt, TermedAt, ExitedAt time.Time
	Pauses                                []Interval // SIGSTOP to SIGCONT
	NetFaults                             []Interval // its proxy injecting faults
	// Slow: its requests the server answered later than CallTimeout (a
	// loaded machine, dynalite's single thread): a fault the plan did not
	// inject, but a fault of the replica's requests all the same.
	Slow []Interval
}

// CheckInput is a run's whole history.
type CheckInput struct {
	Timing    Timing
	Wild      bool      // clocks beyond MaxClockSkew: overlap is allowed, bounded
	Race      bool      // the suite is race-built: so must every replica be
	QuietFrom time.Time // faults stopped
	End       time.Time // replicas told to stop
	Events    []Event
	Procs     []ProcExit
	Sink      []SinkEntry // the one job's, without a pool
	Runs      []ddblease.RunRecord
	// Pool: the replicas ran Pool.RunSchedule over Jobs, each judged on
	// its own (its events carry its name).
	Pool bool
	Jobs []JobHistory
	// Stalls are spans in which the suite's own process did not run (the
	// machine, or the process hosting the server and the proxies, stalled):
	// for liveness they are faults like the plan's.
	Stalls []Interval
	// Slow are requests the server (in the suite's process) took longer
	// than CallTimeout to answer, no latency injected: a client's call
	// timed out as under a fault, so for liveness they are faults too. A
	// replica's own stalls are its EvStall events.
	Slow []Interval
}

// JobHistory is what the tables hold of one job of a pool: its sink
// entries, in order, and its run items.
type JobHistory struct {
	Job  string
	Sink []SinkEntry
	Runs []ddblease.RunRecord
}

// Stats counts what a run did.
type Stats struct {
	Tenures   int            // tenures a user saw (IsLeader true or a live leader context)
	Runs      int            // fn calls
	Effects   int            // side effects the sink holds
	ByForm    map[string]int // effects the sink holds, by guard form
	Refused   int            // side effects refused for a stale fence
	Succeeded int            // runs recorded succeeded
	// Reported outcomes of RunSchedule, each explained by a fault on the
	// replica near its shutdown (an unexplained one is a violation).
	DrainTimeouts, NotResigned, StoppedFailing int
	// With wild clocks, windows of different replicas that overlapped
	// (allowed, bounded), and the longest overlap.
	WildOverlaps   int
	MaxWildOverlap time.Duration
	// Windows whose end fell while the replica was stopped (SIGSTOP):
	// placed at the deadline it last read, as no code of it could run.
	EndsInStop int
	// Leader contexts still live after SIGCONT although their deadline
	// passed during the stop (the timer that cancels them fires when the
	// process runs again); for information.
	CtxLiveAfterWake int
	Observed         int // observer events recorded (information only)
	// Stalls of the suite's own process (a loaded machine) longer than
	// 250 ms, and the longest.
	Stalls   int
	MaxStall time.Duration
	// Requests the server answered later than CallTimeout with no fault
	// injected, and stalls of replica processes longer than 250 ms: both
	// faults for liveness, like Stalls.
	SlowCalls, ReplicaStalls int
}

// Window is one tenure as a user of the replica could see it: from a
// moment certainly before IsLeader turned true for the fence (or before
// fn was handed its live context) to a moment certainly after both had
// ended. Bounds are outer: a window never starts later or ends earlier
// than user code could have seen it.
type Window struct {
	Replica    string
	Fence      int64
	Start, End time.Time
	// Seen is the earliest moment the tenure was certainly visible (so
	// its fence certainly written): the end of the first reading that
	// found IsLeader true, or fn's entry.
	Seen time.Time
}

// Windows reconstructs the user-visible windows from the replicas'
// histories. Violations of the readings' own consistency (a tenure that
// turned false and then true again, one fence in two replicas, fences
// going down in one replica) are reported through bad.
func Windows(in CheckInput, bad func(string, ...any), st *Stats) []*Window {
	ts := func(ns int64) time.Time { return time.Unix(0, ns) }
	procs := map[string]ProcExit{}
	for _, p := range in.Procs {
		procs[p.Name] = p
	}
	byReplica := map[string][]Event{}
	var names []string
	for _, e := range in.Events {
		if _, ok := byReplica[e.Replica]; !ok {
			names = append(names, e.Replica)
		}
		byReplica[e.Replica] = append(byReplica[e.Replica], e)
	}
	sort.Strings(names)
	owner := map[int64]string{}
	var out []*Window
	for _, name := range names {
		evs := byReplica[name]
		p := procs[name]
		gone := p.ExitedAt
		if gone.IsZero() {
			gone = in.End
		}
		var beliefs []Event
		wins := map[int64]*Window{}
		win := func(f int64) *Window {
			w := wins[f]
			if w == nil {
				w = &Window{Replica: name, Fence: f}
				wins[f] = w
			}
			return w
		}
		var high int64
		grow := func(f int64, what string) {
			if f < high {
				bad("%s: fence %d (%s) after fence %d: fences of one replica must only grow", name, f, what, high)
			}
			high = max(high, f)
			if o, ok := owner[f]; ok && o != name {
				bad("fence %d seen by both %s and %s", f, o, name)
			}
			owner[f] = name
		}
		for _, e := range evs {
			switch e.Kind {
			case EvBelief:
				beliefs = append(beliefs, e)
				if e.OK {
					grow(e.Fence, "IsLeader")
				}
			case EvRun:
				grow(e.Fence, "fn")
			}
		}
		beliefs = settleAcrossStops(beliefs, p.Pauses)
		// IsLeader component.
		deadline := map[int64][]Event{} // true readings by fence
		for i := 0; i < len(beliefs); {
			e := beliefs[i]
			if !e.OK {
				i++
				continue
			}
			f := e.Fence
			first, last := i, i
			for j := i + 1; j < len(beliefs); j++ {
				if beliefs[j].OK && beliefs[j].Fence == f {
					if last != j-1 {
						bad("%s: IsLeader for fence %d turned false (reading at %v) and true again (%v)", name, f,
							ts(beliefs[last+1].B).Format(time.StampMicro), ts(beliefs[j].B).Format(time.StampMicro))
					}
					last = j
				}
			}
			for j := first; j <= last; j++ {
				if beliefs[j].OK && beliefs[j].Fence == f {
					deadline[f] = append(deadline[f], beliefs[j])
				}
			}
			w := win(f)
			start := p.Started
			if first > 0 {
				start = ts(beliefs[first-1].B)
			}
			end := gone
			if last+1 < len(beliefs) {
				end = ts(beliefs[last+1].A)
			}
			lastLive := ts(beliefs[last].A)
			if e, ok := endInStop(lastLive, end, p.Pauses, deadline[f]); ok {
				end = e
				st.EndsInStop++
			}
			extend(w, start, end, ts(beliefs[first].A))
			i = last + 1
		}
		// Leader-context component: from fn's entry to the first moment it
		// was seen ended, or fn's return, whichever came first.
		type call struct {
			run      Event
			end, ret int64
		}
		calls := map[string]*call{}
		var order []*call
		for _, e := range evs {
			key := fmt.Sprintf("%d/%s", e.Fence, e.Slot)
			switch e.Kind {
			case EvRun:
				c := &call{run: e}
				calls[key] = c
				order = append(order, c)
				st.Runs++
			case EvCtxEnd:
				if c := calls[key]; c != nil && c.end == 0 {
					c.end = e.A
				}
			case EvReturn:
				if c := calls[key]; c != nil && c.ret == 0 {
					c.ret = e.A
				}
			}
		}
		for _, c := range order {
			if !c.run.OK {
				continue // handed an already ended context
			}
			entry := ts(c.run.B)
			end := gone
			if c.ret != 0 {
				end = ts(c.ret)
			}
			if c.end != 0 && ts(c.end).Before(end) {
				end = ts(c.end)
			}
			if e, ok := endInStop(entry, end, p.Pauses, deadline[c.run.Fence]); ok {
				end = e
				st.EndsInStop++
				if c.end != 0 && c.ret == 0 || c.end != 0 && c.end < c.ret {
					st.CtxLiveAfterWake++
				}
			}
			extend(win(c.run.Fence), entry, end, entry)
		}
		for _, w := range wins {
			out = append(out, w)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Fence < out[j].Fence })
	return out
}

func extend(w *Window, start, end, seen time.Time) {
	if w.Start.IsZero() || start.Before(w.Start) {
		w.Start = start
	}
	if end.After(w.End) {
		w.End = end
	}
	if w.Seen.IsZero() || seen.Before(w.Seen) {
		w.Seen = seen
	}
}

// settleAcrossStops returns the readings with the end of each true one
// that spans a whole stop (SIGSTOP to SIGCONT) moved to the stop's start
// when the deadline it returned had passed before SIGCONT. IsLeader is
// true only before its deadline, so such a reading was taken before the
// stop: taken after SIGCONT, it would have been false. The reading is
// then live up to the stop's start, not up to its return after it.
func settleAcrossStops(beliefs []Event, pauses []Interval) []Event {
	out := slices.Clone(beliefs)
	for i, e := range beliefs {
		if !e.OK {
			continue
		}
		for _, p := range pauses {
			if p.To.IsZero() || time.Unix(0, e.B).After(p.From) || time.Unix(0, e.A).Before(p.To) ||
				!time.Unix(0, e.Deadline).Before(p.To) {
				continue
			}
			out[i].A = p.From.UnixNano()
			break
		}
	}
	return out
}

// endInStop places the end of a component last seen live at lastLive and
// seen ended at end when the replica was stopped (SIGSTOP) in between: no
// code of it could run then, so no user could see anything. If the
// deadline it last read before the stop passed before SIGCONT, the end is
// placed there (IsLeader is false past it: readings after SIGCONT check
// that). Otherwise the end stays at the first reading that saw it ended.
func endInStop(lastLive, end time.Time, pauses []Interval, trues []Event) (time.Time, bool) {
	for _, p := range pauses {
		if p.To.IsZero() || p.From.Before(lastLive) || p.To.After(end) {
			continue
		}
		var d int64
		for _, t := range trues {
			if !time.Unix(0, t.A).After(p.From) {
				d = max(d, t.Deadline)
			}
		}
		if d == 0 {
			return end, false
		}
		if dl := time.Unix(0, d); dl.Before(p.To) {
			if dl.Before(lastLive) {
				dl = lastLive
			}
			return dl, true
		}
		return end, false
	}
	return end, false
}

// Check returns every violation of the guarantees found in a history. It
// judges what the replicas' user code saw (IsLeader readings, leader
// contexts, fn calls, what each guard form accepted, what RunSchedule
// returned) and the sink; the observer's events are counted, not used.
// A pool's jobs are judged each on its own (checkJob, each violation
// naming its job), the replicas' processes once.
func Check(in CheckInput) (violations []string, st Stats) {
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	st.ByForm = map[string]int{}
	for _, e := range in.Events {
		if e.Kind == EvObserved {
			st.Observed++
		}
	}
	quiet := in.QuietFrom
	after := func(s Interval) {
		// Stalls while the replicas stop (from End on) are not judged.
		if !quiet.IsZero() && s.To.After(quiet) && s.From.Before(in.End) {
			quiet = s.To // a stall is a fault: liveness counts from its end
		}
	}
	for _, s := range in.Stalls {
		st.Stalls++
		st.MaxStall = max(st.MaxStall, s.To.Sub(s.From))
		after(s)
	}
	for _, s := range in.Slow {
		st.SlowCalls++
		after(s)
	}
	pauses := map[string][]Interval{}
	for _, p := range in.Procs {
		pauses[p.Name] = p.Pauses
	}
	for _, e := range in.Events {
		if e.Kind != EvStall {
			continue
		}
		s := Interval{From: time.Unix(0, e.B), To: time.Unix(0, e.A)}
		after(s)
		stopped := false // the plan's SIGSTOP, counted as a pause already
		for _, p := range pauses[e.Replica] {
			stopped = stopped || p.From.Before(s.To) && (p.To.IsZero() || p.To.After(s.From))
		}
		if !stopped {
			st.ReplicaStalls++
			st.MaxStall = max(st.MaxStall, s.To.Sub(s.From))
		}
	}
	live := newLiveBounds(in, quiet)
	jobs := []JobHistory{{Sink: in.Sink, Runs: in.Runs}}
	if in.Pool {
		jobs = in.Jobs
	}
	for _, jh := range jobs {
		sub := in
		sub.Events = nil
		for _, e := range in.Events {
			if e.Job == jh.Job && e.Kind != EvObserved && e.Kind != EvTimedOut {
				sub.Events = append(sub.Events, e)
			}
		}
		jbad := bad
		if in.Pool {
			jbad = func(format string, args ...any) { bad("job %s: %s", jh.Job, fmt.Sprintf(format, args...)) }
		}
		checkJob(sub, jh, quiet, live, jbad, &st)
	}
	checkProcs(in, bad, &st)
	return violations, st
}

// checkJob judges one job: its windows, its fences, its sink, its fn
// calls, its run items, and its liveness once the faults (and the stalls)
// are over at quiet. in.Events are the job's.
func checkJob(in CheckInput, jh JobHistory, quiet time.Time, live liveBounds, bad func(string, ...any), st *Stats) {
	ts := func(ns int64) time.Time { return time.Unix(0, ns) }
	stamp := func(t time.Time) string { return t.Format(time.StampMicro) }
	t := in.Timing

	ws := Windows(in, bad, st)
	st.Tenures += len(ws)

	// 1. Leadership windows of different replicas never overlap while
	// clocks are within the bound. With wild clocks they may; but in every
	// run, a replica's belief in a fence outlasts the moment a newer fence
	// was certainly written (seen by another replica) by less than its own
	// deadline allows: the deadline is at most 0.9 lease after its last
	// confirmed write, which came before the newer fence's. Half a lease
	// more is left for a loaded machine's readings.
	staleBound := t.Lease + t.Lease/2
	for i := range ws {
		for j := i + 1; j < len(ws); j++ {
			a, b := ws[i], ws[j] // a.Fence < b.Fence
			if a.Replica == b.Replica {
				continue
			}
			if a.Start.Before(b.End) && b.Start.Before(a.End) {
				ov := minTime(a.End, b.End).Sub(maxTime(a.Start, b.Start))
				if in.Wild {
					st.WildOverlaps++
					st.MaxWildOverlap = max(st.MaxWildOverlap, ov)
				} else {
					bad("%s's window for fence %d (%s to %s) overlaps %s's for fence %d (%s to %s) by %v",
						a.Replica, a.Fence, stamp(a.Start), stamp(a.End), b.Replica, b.Fence, stamp(b.Start), stamp(b.End), ov)
				}
			}
			if late := a.End.Sub(b.Seen); late > staleBound {
				bad("%s still believed in fence %d %v after %s was seen leading with fence %d (at %s); the bound is %v",
					a.Replica, a.Fence, late, b.Replica, b.Fence, stamp(b.Seen), staleBound)
			}
		}
	}

	// 2. No guard accepts a stale fence. The sink's log is in write order:
	// the atomic forms keep (Put, Update) or check against (TransactWrite,
	// Commit) the fence high-water mark, so their fences never go down.
	// TransactWrite, Commit, Check and Do compare with the lease item: none
	// may accept a fence once a newer one was certainly written before the
	// call began.
	var high int64
	slots := map[string]SinkEntry{}
	inSink := map[SinkEntry]bool{}
	for i, e := range jh.Sink {
		st.ByForm[e.Form]++
		inSink[e] = true
		if Atomic(e.Form) {
			if e.Fence < high {
				bad("sink entry %d: %s accepted fence %d (slot %s, %s) after fence %d", i, e.Form, e.Fence, e.Slot, e.Replica, high)
			}
			high = max(high, e.Fence)
		}
		if prev, ok := slots[e.Slot]; ok {
			bad("slot %s has two effects: fence %d (%s) and fence %d (%s)", e.Slot, prev.Fence, prev.Replica, e.Fence, e.Replica)
		}
		slots[e.Slot] = e
	}
	st.Effects += len(jh.Sink)
	newer := func(f int64, before time.Time) *Window {
		for _, w := range ws {
			if w.Fence > f && w.Seen.Before(before) {
				return w
			}
		}
		return nil
	}
	attempted := map[SinkEntry]bool{}
	fnCalls := map[string][]Event{}
	for _, e := range in.Events {
		switch e.Kind {
		case EvRun:
			fnCalls[e.Slot] = append(fnCalls[e.Slot], e)
			for _, form := range forms {
				attempted[SinkEntry{Fence: e.Fence, Slot: e.Slot, Replica: e.Replica, Form: form}] = true
			}
		case EvEffect:
			accepted := e.OK
			if !Atomic(e.Form) {
				accepted = e.Info == "checked"
			}
			if accepted && e.Form != FormPut && e.Form != FormUpdate {
				if w := newer(e.Fence, ts(e.B)); w != nil {
					bad("%s: %s accepted fence %d for slot %s at %s, but fence %d (%s) was seen at %s",
						e.Replica, e.Form, e.Fence, e.Slot, stamp(ts(e.B)), w.Fence, w.Replica, stamp(w.Seen))
				}
			}
			if e.OK && !inSink[SinkEntry{Fence: e.Fence, Slot: e.Slot, Replica: e.Replica, Form: e.Form}] {
				bad("%s reported its %s effect for slot %s (fence %d) accepted, but the sink does not have it", e.Replica, e.Form, e.Slot, e.Fence)
			}
			if !e.OK && strings.HasPrefix(e.Err, "stale") {
				st.Refused++
			}
		}
	}
	for _, s := range jh.Sink {
		if !attempted[s] {
			bad("the sink has a %s effect for slot %s (fence %d, %s) that no fn call made", s.Form, s.Slot, s.Fence, s.Replica)
		}
	}

	// 3. NeverRerun: fn is called at most once per slot, whatever the
	// sink would deduplicate.
	for slot, calls := range fnCalls {
		if len(calls) > 1 {
			var who []string
			for _, c := range calls {
				who = append(who, fmt.Sprintf("%s (fence %d, %s)", c.Replica, c.Fence, stamp(ts(c.B))))
			}
			bad("fn called %d times for slot %s: %s", len(calls), slot, strings.Join(who, ", "))
		}
	}

	// 4. Run items agree with what replicas reported.
	succeeded := map[string]int64{}
	runs := map[string]ddblease.RunRecord{}
	for _, r := range jh.Runs {
		runs[r.Slot.UTC().Format(time.RFC3339Nano)] = r
		if r.Status == ddblease.RunSucceeded {
			st.Succeeded++
		}
	}
	for _, e := range in.Events {
		if e.Kind != EvFinished || !e.OK {
			continue
		}
		r, ok := runs[e.Slot]
		switch {
		case !ok:
			bad("%s finished slot %s (fence %d), but no run item exists", e.Replica, e.Slot, e.Fence)
		case r.Fence != e.Fence || r.Status == ddblease.RunRunning:
			bad("%s finished slot %s (fence %d), but the run item says fence %d, %s", e.Replica, e.Slot, e.Fence, r.Fence, r.Status)
		}
		if r.Status == ddblease.RunSucceeded {
			if f, dup := succeeded[e.Slot]; dup && f != e.Fence {
				bad("slot %s succeeded twice: fences %d and %d", e.Slot, f, e.Fence)
			}
			succeeded[e.Slot] = e.Fence
		}
	}

	// 6. Liveness (clocks within the bound): after the faults, IsLeader is
	// seen true by live.by, and every slot due from live.from on has a
	// succeeded run and an effect (liveBounds says why these bounds);
	// judged only if live.by comes before the replicas are told to stop
	// (a late stall may leave too little time).
	if !in.Wild && !quiet.IsZero() && live.by.Before(in.End) {
		led := false
		for _, e := range in.Events {
			if e.Kind == EvBelief && e.OK && !ts(e.A).After(live.by) && !ts(e.B).Before(quiet) {
				led = true
			}
		}
		if !led {
			bad("no replica saw itself leading between %s and %s (%v after the faults stopped)", stamp(quiet), stamp(live.by), live.by.Sub(quiet))
		}
		sched := ddblease.Every(t.Slot)
		busy := busyIntervals(in.Events)
		for s := sched.Next(live.from); s.Before(in.End.Add(-t.Slot - t.Lease)); s = sched.Next(s) {
			id := s.UTC().Format(time.RFC3339Nano)
			if _, ok := runs[id]; !ok && overran(busy, s, t) {
				continue // missed while a run overran it: the next due slot runs instead (documented)
			}
			if r, ok := runs[id]; !ok || r.Status != ddblease.RunSucceeded {
				bad("slot %s, due after the faults stopped, has no succeeded run (%+v)", id, r)
			}
			if _, ok := slots[id]; !ok {
				bad("slot %s, due after the faults stopped, has no effect in the sink", id)
			}
		}
	}
}

// busyIntervals returns the spans from each call of fn to its return
// (EvRun to EvReturn of one replica, fence and slot), real times.
func busyIntervals(events []Event) []Interval {
	type key struct {
		rep, slot string
		fence     int64
	}
	began := map[key]time.Time{}
	var spans []Interval
	for _, e := range events {
		k := key{e.Replica, e.Slot, e.Fence}
		switch e.Kind {
		case EvRun:
			began[k] = time.Unix(0, e.B)
		case EvReturn:
			if b, ok := began[k]; ok {
				spans = append(spans, Interval{From: b, To: time.Unix(0, e.A)})
				delete(began, k)
			}
		}
	}
	return spans
}

// overran reports whether slot s came due while a run of the job was under
// way that returned once the slot after s was due: the runner then runs the
// latest due slot only, and s is reported missed (EventSlotsMissed), as the
// package documents. A loaded machine's slow requests make a run (Work and
// three or four requests) longer than Slot. The slot's time is the leader's
// clock, within Skew of the real times the spans are in.
func overran(busy []Interval, s time.Time, t Timing) bool {
	for _, b := range busy {
		if !b.From.After(s.Add(t.Skew)) && !b.To.Before(s.Add(t.Slot-t.Skew)) {
			return true
		}
	}
	return false
}

// checkProcs judges the replicas' processes and what RunSchedule (the
// lease's or the pool's) returned in each.
func checkProcs(in CheckInput, bad func(string, ...any), st *Stats) {
	t := in.Timing
	stamp := func(t time.Time) string { return t.Format(time.StampMicro) }
	// Nothing silent: every process that was not killed recorded what
	// RunSchedule returned; nil is clean; ErrDrainTimeout and
	// ErrNotResigned and a stop while every attempt was failing are
	// reported outcomes, allowed only for a replica
	// whose proxy injected faults, which was stopped, or whose requests the
	// server answered later than CallTimeout or the replica saw time out
	// (EvTimedOut), within a lease of its shutdown; ctx's error from a
	// RunSchedule that a SIGTERM stopped before it began is clean; anything
	// else is a failure. No replica panicked, raced
	// or exited badly, and each was built as the suite was (race or not).
	exits := map[string]Event{}
	starts := map[string]Event{}
	timedOut := map[string][]Interval{} // the requests each replica saw time out
	for _, e := range in.Events {
		switch e.Kind {
		case EvExit:
			exits[e.Replica] = e
		case EvStart:
			starts[e.Replica] = e
		case EvTimedOut:
			timedOut[e.Replica] = append(timedOut[e.Replica], Interval{From: time.Unix(0, e.B), To: time.Unix(0, e.A)})
		}
	}
	for _, p := range in.Procs {
		p.Slow = slices.Concat(p.Slow, timedOut[p.Name])
		if _, ok := starts[p.Name]; !ok && !p.TermedAt.IsZero() && endedBy(p.Err, syscall.SIGTERM) {
			// SIGTERMed before its handler was in place (a replica just
			// started, on a loaded machine): it never ran the library, as
			// a replica killed before its start.
			continue
		}
		if strings.Contains(p.Stderr, "panic:") || strings.Contains(p.Stderr, "DATA RACE") {
			bad("%s crashed:\n%s", p.Name, p.Stderr)
		}
		if !p.Killed && p.Err != nil {
			bad("%s exited with %v:\n%s", p.Name, p.Err, p.Stderr)
		}
		if s, ok := starts[p.Name]; ok && s.OK != in.Race {
			bad("%s: race detector %v in the replica, %v in the suite: the replica is not the suite's binary", p.Name, s.OK, in.Race)
		}
		if p.Killed {
			continue
		}
		e, ok := exits[p.Name]
		switch {
		case !ok:
			bad("%s exited without recording what RunSchedule returned", p.Name)
		case e.Err == "":
		case strings.HasPrefix(e.Err, ExitEndedBeforeRun):
			if p.TermedAt.IsZero() {
				bad("%s: RunSchedule returned %q, its context ended before it began, without a SIGTERM", p.Name, e.Err)
			}
		case strings.HasPrefix(e.Err, ExitDrainTimeout), strings.HasPrefix(e.Err, ExitNotResigned), strings.HasPrefix(e.Err, ExitStoppedFailing):
			switch {
			case !faultNear(p, t.Lease):
				bad("%s: RunSchedule returned %q with no fault on the replica near its shutdown at %s", p.Name, e.Err, stamp(p.TermedAt))
			case strings.HasPrefix(e.Err, ExitDrainTimeout):
				st.DrainTimeouts++
			case strings.HasPrefix(e.Err, ExitNotResigned):
				st.NotResigned++
			default:
				st.StoppedFailing++
			}
		default:
			bad("%s: RunSchedule returned an error: %s", p.Name, e.Err)
		}
	}

}

// liveBounds are the moments by which, once the faults are over, a job
// must be seen led (by), and from which every slot due must have run
// (from). Each has a lease more than the library's own bound, for a
// loaded machine (two cores, race-built replicas).
//
// For one lease: a standby takes over an expired lease within a lease
// plus the skew plus a poll, so by and from are two leases plus the skew
// plus a RetryInterval after the faults.
//
// For a pool, the bounds are the simulation's (internal/sim, plan_test.go:
// viewLag, poolLiveBound, poolGapBound; its spreadFrom for the slots):
//   - viewLag = HeartbeatInterval + CallTimeout + 2*MaxClockSkew: how long
//     after a member's change every live replica's view shows it;
//   - by = poolLiveBound: the later of a job lost with its replica's
//     session (the lease's live bound: lease, 2*skew, retry, two calls and
//     lease/20; and a view lag for the session to be seen gone) and a
//     replica that rejoins (a call and a heartbeat to renew, a view lag,
//     a call for the former assignee to resign, a retry and two calls to
//     take the lease, lease/20);
//   - from: the pool settled (the faults over, the last replica started,
//     the session of the last one killed lapsed and seen so: killed + a
//     call + a lease + 2*skew), then a call and a heartbeat for every
//     member to renew, a view lag for the views to agree, and
//     poolGapBound (a tenure's deadline margin and a standby's takeover:
//     lease/10, 2*skew, retry, two calls and lease/20; a view lag and a
//     call for a job moved) for the moves that makes.
type liveBounds struct{ by, from time.Time }

func newLiveBounds(in CheckInput, quiet time.Time) liveBounds {
	t := in.Timing
	if !in.Pool {
		by := quiet.Add(2*t.Lease + t.Skew + t.Retry)
		return liveBounds{by: by, from: by}
	}
	by := quiet.Add(PoolLiveBound(t) + t.Lease)
	settled := quiet
	for _, e := range in.Events {
		if e.Kind == EvStart {
			settled = maxTime(settled, time.Unix(0, e.T))
		}
	}
	for _, p := range in.Procs {
		if p.Killed {
			settled = maxTime(settled, p.KilledAt.Add(t.Call+t.Lease+2*t.Skew))
		}
	}
	from := settled.Add(t.Call + t.Heartbeat + ViewLag(t) + PoolGapBound(t) + t.Lease)
	return liveBounds{by: by, from: maxTime(by, from)}
}

// ViewLag bounds how long after a change of a pool member's item every
// live replica's view shows it, once the faults are over.
func ViewLag(t Timing) time.Duration { return t.Heartbeat + t.Call + 2*t.Skew }

// PoolLiveBound bounds how long after the faults each job of a pool is led
// again (liveBounds).
func PoolLiveBound(t Timing) time.Duration {
	lapse := t.Lease + 2*t.Skew + t.Retry + 2*t.Call + t.Lease/20 + ViewLag(t)
	rejoin := t.Call + t.Heartbeat + ViewLag(t) + t.Call + t.Retry + 2*t.Call + t.Lease/20
	return max(lapse, rejoin)
}

// PoolGapBound bounds a job's leaderless gap after the faults: a tenure's
// deadline margin and a standby's takeover, and for a job moved, a view
// lag and the former assignee's resignation (liveBounds).
func PoolGapBound(t Timing) time.Duration {
	return t.Lease/10 + 2*t.Skew + t.Retry + 2*t.Call + t.Lease/20 + ViewLag(t) + t.Call
}

// faultNear reports whether p's proxy injected faults, p was stopped, or
// the server answered p's requests later than CallTimeout, between a lease
// before its SIGTERM and its exit.
func faultNear(p ProcExit, lease time.Duration) bool {
	if p.TermedAt.IsZero() {
		return false
	}
	from, to := p.TermedAt.Add(-lease), p.ExitedAt
	if to.IsZero() {
		to = p.TermedAt.Add(time.Hour)
	}
	for _, iv := range slices.Concat(p.NetFaults, p.Pauses, p.Slow) {
		end := iv.To
		if end.IsZero() {
			end = to
		}
		if iv.From.Before(to) && end.After(from) {
			return true
		}
	}
	return false
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// endedBy reports whether err says the process was ended by sig.
func endedBy(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}
