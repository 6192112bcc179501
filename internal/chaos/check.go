package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ddblease/ddblease"
)

// ProcExit is how a replica process ended.
type ProcExit struct {
	Name   string
	Killed bool // by the plan's SIGKILL
	Err    error
	Stderr string
}

// CheckInput is a run's whole history.
type CheckInput struct {
	Timing    Timing
	Wild      bool      // clocks beyond MaxClockSkew: only the unconditional checks
	QuietFrom time.Time // faults stopped
	End       time.Time // replicas told to stop
	Events    []Event
	Procs     []ProcExit
	Sink      []SinkEntry
	Runs      []ddblease.RunRecord
}

// Stats counts what a run did.
type Stats struct {
	Tenures   int // fences issued
	Runs      int // fn calls
	Effects   int // side effects the sink accepted
	Refused   int // side effects refused for a stale fence
	Succeeded int // runs recorded succeeded
}

type window struct {
	fence      int64
	replica    string
	start, end time.Time
	ended      bool
}

// Check returns every violation of the guarantees found in a history.
func Check(in CheckInput) (violations []string, st Stats) {
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	ts := func(ns int64) time.Time { return time.Unix(0, ns) }

	// Tenures, from the probe's events.
	wins := map[int64]*window{}
	for _, e := range in.Events {
		switch e.Kind {
		case EvTenure:
			w := wins[e.Fence]
			if w == nil {
				w = &window{fence: e.Fence, replica: e.Replica, start: ts(e.T)}
				wins[e.Fence] = w
			}
			if w.replica != e.Replica {
				bad("fence %d issued to both %s and %s", e.Fence, w.replica, e.Replica)
			}
			if d := ts(e.Deadline); d.After(w.end) && !w.ended {
				w.end = d
			}
		case EvEnded:
			if w := wins[e.Fence]; w != nil && ts(e.T).Before(w.end) {
				w.end, w.ended = ts(e.T), true
			}
		}
	}
	var ws []*window
	for _, w := range wins {
		if w.end.After(w.start) { // else never believed: confirmed too late
			ws = append(ws, w)
		}
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].fence < ws[j].fence })
	st.Tenures = len(ws)

	// 3. Fences strictly increase: no fence is issued twice (above), each
	// replica's fences increase, and with clocks within the bound a higher
	// fence is acquired later. (With wild clocks a replica may start to
	// believe in a fence after a newer one was issued: the write that
	// issued it was earlier, its answer arrived later.)
	byStart := append([]*window(nil), ws...)
	sort.Slice(byStart, func(i, j int) bool { return byStart[i].start.Before(byStart[j].start) })
	lastOf := map[string]int64{}
	for _, w := range byStart {
		if w.fence <= lastOf[w.replica] {
			bad("%s acquired fence %d after fence %d", w.replica, w.fence, lastOf[w.replica])
		}
		lastOf[w.replica] = w.fence
	}
	for i := 1; i < len(ws) && !in.Wild; i++ {
		if !ws[i].start.After(ws[i-1].start) {
			bad("fence %d (%s) acquired at %v, not after fence %d (%s) at %v",
				ws[i].fence, ws[i].replica, ws[i].start.Format(time.StampMicro), ws[i-1].fence, ws[i-1].replica, ws[i-1].start.Format(time.StampMicro))
		}
	}

	// 4. With clocks within the bound, leadership windows do not overlap.
	if !in.Wild {
		for i := range ws {
			for j := i + 1; j < len(ws); j++ {
				a, b := ws[i], ws[j]
				if a.start.Before(b.end) && b.start.Before(a.end) {
					bad("leadership of fence %d (%s, %v to %v) overlaps fence %d (%s, %v to %v) by %v",
						a.fence, a.replica, a.start.Format(time.StampMicro), a.end.Format(time.StampMicro),
						b.fence, b.replica, b.start.Format(time.StampMicro), b.end.Format(time.StampMicro),
						overlap(a, b))
				}
			}
		}
	}

	// 1. The sink never accepted a fence lower than one it had accepted.
	// 2. It has at most one effect per slot.
	slots := map[string]SinkEntry{}
	var high int64
	for i, e := range in.Sink {
		if e.Fence < high {
			bad("sink entry %d: fence %d (slot %s, %s) accepted after fence %d", i, e.Fence, e.Slot, e.Replica, high)
		}
		high = max(high, e.Fence)
		if prev, ok := slots[e.Slot]; ok {
			bad("slot %s has two effects: fence %d (%s) and fence %d (%s)", e.Slot, prev.Fence, prev.Replica, e.Fence, e.Replica)
		}
		slots[e.Slot] = e
	}
	st.Effects = len(in.Sink)

	// 6. Nothing lost, nothing invented: the sink and the run items agree
	// with what replicas reported.
	attempted := map[SinkEntry]bool{}
	succeeded := map[string]int64{}
	runs := map[string]ddblease.RunRecord{}
	for _, r := range in.Runs {
		runs[r.Slot.UTC().Format(time.RFC3339Nano)] = r
		if r.Status == ddblease.RunSucceeded {
			st.Succeeded++
		}
	}
	for _, e := range in.Events {
		switch e.Kind {
		case EvRun:
			// The effect may land even if the replica dies before it
			// records the outcome.
			attempted[SinkEntry{Fence: e.Fence, Slot: e.Slot, Replica: e.Replica}] = true
			st.Runs++
		case EvEffect:
			if e.OK {
				if s, ok := slots[e.Slot]; !ok || s.Fence != e.Fence || s.Replica != e.Replica {
					bad("%s reported its effect for slot %s (fence %d) accepted, but the sink does not have it", e.Replica, e.Slot, e.Fence)
				}
			} else if strings.HasPrefix(e.Err, "stale") {
				st.Refused++
			}
		case EvFinished:
			if !e.OK {
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
		case EvExit:
			if !e.OK {
				bad("%s: RunSchedule returned an error: %s", e.Replica, e.Err)
			}
		}
	}
	for _, s := range in.Sink {
		if !attempted[s] {
			bad("the sink has an effect for slot %s (fence %d, %s) that no replica attempted", s.Slot, s.Fence, s.Replica)
		}
	}
	for _, p := range in.Procs {
		if strings.Contains(p.Stderr, "panic:") || strings.Contains(p.Stderr, "DATA RACE") {
			bad("%s crashed:\n%s", p.Name, p.Stderr)
		}
		if !p.Killed && p.Err != nil {
			bad("%s exited with %v:\n%s", p.Name, p.Err, p.Stderr)
		}
	}

	// 5. Liveness: after the faults, a leader within lease + skew + retry
	// (and slack for a loaded machine), and every slot due after that run.
	if !in.Wild && !in.QuietFrom.IsZero() {
		t := in.Timing
		by := in.QuietFrom.Add(t.Lease + t.Skew + t.Retry + t.Lease)
		led := false
		for _, w := range ws {
			if !w.start.After(by) && w.end.After(by) {
				led = true
			}
		}
		if !led {
			bad("no leader at %v, %v after the faults stopped", by.Format(time.StampMicro), by.Sub(in.QuietFrom))
		}
		sched := ddblease.Every(t.Slot)
		for s := sched.Next(by); s.Before(in.End.Add(-t.Slot - t.Lease)); s = sched.Next(s) {
			id := s.UTC().Format(time.RFC3339Nano)
			if r, ok := runs[id]; !ok || r.Status != ddblease.RunSucceeded {
				bad("slot %s, due after the faults stopped, has no succeeded run (%+v)", id, r)
			}
			if _, ok := slots[id]; !ok {
				bad("slot %s, due after the faults stopped, has no effect in the sink", id)
			}
		}
	}
	return violations, st
}

func overlap(a, b *window) time.Duration {
	end, start := a.end, a.start
	if b.end.Before(end) {
		end = b.end
	}
	if b.start.After(start) {
		start = b.start
	}
	return end.Sub(start)
}
