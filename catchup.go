package ddblease

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns which slot a schedule runs next and the catch-up: the
// slot due (runner.due), the slots missed while no tenure ran them
// (dueSlots, recentSlots), and the sweeps that read back the runs an
// older tenure may have left running and mark them abandoned (sweep,
// resweep, adopt, getRuns).

// Limits of the runner's catch-up bookkeeping.
const (
	// maxSweep is how many of the slots skipped by a catch-up may be read
	// back (BatchGetItem, 100 slots per request, latest first) to count the
	// missed ones and abandon orphaned runs: at most 10 requests at once.
	// Every(1s) skips 900 slots at most in the default window.
	maxSweep = 1_000
	// maxEnumerate bounds the Next calls made to find the due slots.
	maxEnumerate = 100_000
	// maxSleep bounds one wait for a slot, so that a wall clock that jumps
	// is noticed.
	maxSleep = time.Minute
)

// due returns the next slot to fire, applying the catch-up rule, or, with
// a zero slot, how long to wait before looking again. ok is false when
// ctx ended or the schedule has no further slot. missed is -1 when the
// skipped slots could not be read back.
func (r *runner) due(ctx context.Context, tn *term) (slot time.Time, missed int, wait time.Duration, ok bool, err error) {
	l := r.l
	now := l.opts.Now()
	floor := now.Add(-r.o.CatchUpWindow)
	if busy := r.busySince; !busy.IsZero() && busy.Before(floor) {
		floor = busy
	}
	r.busySince = time.Time{}
	returned := r.returned(now)
	behind := r.last.After(now)
	if behind && (returned || r.last.Sub(now) > r.o.CatchUpWindow) {
		// The wall clock came back from a jump forward (the slots the
		// jump passed over were never handled), or stepped back further
		// than the window: start again from now. Slots run early stay
		// protected by their runs.
		r.last, behind = time.Time{}, false
	}
	// A wall clock that fell behind the last slot handled by up to the
	// window otherwise waits for it again: the slots before it are
	// handled, and a claim made now of a slot before it would break the
	// order in which a tenure claims slots, which a newer tenure's sweep
	// (within the window) relies on. It is looked at every RetryInterval
	// meanwhile, so that a step that ends is seen.
	if !r.last.IsZero() {
		if r.last.Before(floor) {
			r.logTooOld(r.last, floor)
			r.last = time.Time{}
		} else {
			floor = r.last
		}
	}
	first, err := nextSlot(r.sched, floor)
	if err != nil {
		return time.Time{}, 0, 0, false, err
	}
	if first.IsZero() {
		l.log().Info("ddblease: the schedule has no further slot", "after", fmtSlot(floor))
		return time.Time{}, 0, 0, false, nil
	}
	if first.After(now) {
		// An operator request wakes the wait (jobrunner.go); the next
		// step reads the controls. A look that left a request pending (a
		// read that failed, a claim given up, a run left running that
		// could not be marked) is made again after a RetryInterval, not at
		// the next slot, which may be a day away.
		d := min(first.Sub(now), maxSleep)
		if behind || r.ctl.look {
			d = min(d, r.l.opts.RetryInterval)
		}
		return time.Time{}, 0, d, true, nil
	}
	if !tn.leads() {
		// The tenure does not lead by both clocks (a wall clock that
		// stepped past its deadline, until the next renewal lands, or a
		// tenure about to end): no slot is read back or claimed until it
		// does again, or ends.
		return time.Time{}, 0, r.l.opts.RetryInterval, true, nil
	}
	latest, older, n, err := r.dueSlots(first, now)
	if err != nil {
		return time.Time{}, 0, 0, false, err
	}
	if n > 0 {
		missed = r.sweep(ctx, tn, older, n, latest)
	}
	return latest, missed, 0, true, nil
}

// returned compares how far the wall clock moved since the last look with
// how far the runtime clock did, keeping the sum of the wall clock's jumps
// ahead, and reports whether it has just stepped back from such a jump
// (the slots the jump passed over were never handled) rather than fallen
// behind.
func (r *runner) returned(now time.Time) bool {
	real := time.Now()
	prev := r.looked
	r.looked = sent{at: now, real: real}
	if prev.at.IsZero() {
		return false
	}
	jump := now.Round(0).Sub(prev.at.Round(0)) - real.Sub(prev.real)
	was := r.ahead
	r.ahead = max(0, r.ahead+jump)
	skew := r.l.opts.MaxClockSkew
	return jump < -skew && was >= -jump-skew
}

// dueSlots returns the latest slot due at now, starting from first (which
// is due), up to maxSweep of the slots before it (oldest first), and how many
// slots before it there are (a lower bound when there are very many).
func (r *runner) dueSlots(first, now time.Time) (latest time.Time, older []time.Time, n int, err error) {
	latest = first
	for i := 0; ; i++ {
		if i == maxEnumerate {
			// A very dense schedule: find the latest slot by looking back
			// from now over doubling spans instead.
			l2, older2, err := r.recentSlots(now)
			if err != nil || l2.IsZero() {
				return latest, older, n, err
			}
			return l2, older2, n + len(older2), nil
		}
		next, err := nextSlot(r.sched, latest)
		if err != nil {
			return time.Time{}, nil, 0, err
		}
		if next.IsZero() || next.After(now) {
			return latest, older, n, nil
		}
		older = append(older, latest)
		if len(older) > maxSweep {
			older = older[1:]
		}
		n++
		latest = next
	}
}

// recentSlots finds the latest slot due at now, and some before it, by
// enumerating from now-span for doubling spans.
func (r *runner) recentSlots(now time.Time) (latest time.Time, older []time.Time, err error) {
	for span := time.Microsecond; span < r.o.CatchUpWindow; span *= 2 {
		s, err := nextSlot(r.sched, now.Add(-span))
		if err != nil || s.IsZero() {
			return time.Time{}, nil, err
		}
		if s.After(now) {
			continue
		}
		latest = s
		for i := 0; i < maxEnumerate; i++ {
			next, err := nextSlot(r.sched, latest)
			if err != nil {
				return time.Time{}, nil, err
			}
			if next.IsZero() || next.After(now) {
				return latest, older, nil
			}
			older = append(older, latest)
			if len(older) > maxSweep {
				older = older[1:]
			}
			latest = next
		}
		return latest, older, nil
	}
	return time.Time{}, nil, nil
}

// sweep reads back the skipped slots, latest first, 100 per request,
// until it reaches one that has a run: the slots after the latest run are
// the missed ones, and runs that an older tenure left running (or that this
// one claimed and gave up) in the slots read are marked abandoned. n is how
// many slots were skipped in all, of which older are the latest. It returns
// the number missed, or -1 when it is not known (the slots could not be
// read, or there were more than were enumerated).
//
// The first tenure a job ever has (fence 1) skips the slots before its
// acquisition: no one led then, so nothing was missed and nothing can be
// left running.
func (r *runner) sweep(ctx context.Context, tn *term, older []time.Time, n int, latest time.Time) int {
	l := r.l
	if tn.fence == 1 {
		acquired := tn.acquiredAt
		i := 0
		for i < len(older) && older[i].Before(acquired) {
			i++
		}
		n -= i
		older = older[i:]
		if len(older) == 0 {
			return 0
		}
	}
	missed, abandoned, found, counted := 0, 0, false, false
	var again []time.Time // orphans whose marking failed transiently
	for end := len(older); end > 0 && !found; end -= 100 {
		chunk := older[max(end-100, 0):end]
		ids := make([]string, len(chunk))
		for i, s := range chunk {
			ids[i] = fmtSlot(s)
		}
		var items map[string]map[string]types.AttributeValue
		_, _, err := retrier{backoff: fixed(l.opts.RetryInterval), attempts: 3}.do(ctx, func(ctx context.Context) error {
			var err error
			items, err = l.getRuns(ctx, ids)
			return err
		})
		if err != nil {
			r.unswept = append(append(r.unswept, older[:end]...), again...)
			l.notify.emit(l.event(EventSlotsMissed, Event{Slot: latest, Fence: tn.fence, Missed: -1, Err: err}))
			return -1
		}
		for i := len(ids) - 1; i >= 0; i-- {
			item, ok := items[ids[i]]
			if !ok {
				if !counted {
					missed++
				}
				continue
			}
			// The latest run ends the count. The latest run an older tenure
			// claimed ends the search: its runner handled the slots before
			// it. A run of this tenure (a resumption's catch-up, a claim
			// given up) does not.
			counted = true
			if rec, err := decodeRun(r.l.opts.Layout, item); err != nil || rec.Fence < tn.fence {
				found = true
			}
			r.inherit(item)
			ok, retry := r.abandonOrphan(ctx, tn, chunk[i], item)
			if ok {
				abandoned++
			}
			if retry {
				again = append(again, chunk[i])
			}
		}
	}
	r.unswept = append(r.unswept, again...)
	if abandoned > 0 {
		l.log().Info("ddblease: runs left running by an earlier leader were marked abandoned", "abandoned", abandoned,
			"firing", fmtSlot(latest))
	}
	if !counted && n > len(older) {
		// More slots were skipped than enumerated: the count is a lower
		// bound.
		missed = -1
	}
	if missed != 0 {
		l.notify.emit(l.event(EventSlotsMissed, Event{Slot: latest, Fence: tn.fence, Missed: missed}))
	}
	return missed
}

// abandonOrphan marks the run item of slot abandoned if an older tenure
// left it running, or this one claimed and gave it up. It reports whether
// it did, and whether the marking failed transiently (the slot is then
// kept for the next resweep).
func (r *runner) abandonOrphan(ctx context.Context, tn *term, slot time.Time, item map[string]types.AttributeValue) (abandoned, retry bool) {
	l := r.l
	id := fmtSlot(slot)
	rec, err := decodeRun(r.l.opts.Layout, item)
	if err != nil {
		l.log().Error("ddblease: skipped slot has a malformed run item", "slot", id, "err", err)
		return false, false
	}
	givenUp := rec.Status == RunRunning && rec.Fence == tn.fence && slices.Contains(r.givenUp, rec.claim)
	if !rec.orphanFor(tn.fence) && !givenUp {
		return false, false
	}
	if r.marks >= maxMarks {
		return false, true // kept for the next resweep
	}
	r.marks++
	_, ok, err := tn.abandon(ctx, rec)
	if err != nil {
		l.log().Warn("ddblease: could not mark an orphaned run abandoned", "slot", id, "fence", rec.Fence, "err", err)
		return false, retryable(err)
	}
	return ok, false
}

// maxMarks bounds the abandon writes made between two firings (a sweep
// and the resweep after it), so that a table that fails them fast is not
// sent a burst; the rest wait for the next resweep.
const maxMarks = 10

// inherit takes on the slots that the tenure which claimed this run
// (item) could not sweep, recorded in its claim: they are read back by
// the next resweep.
func (r *runner) inherit(item map[string]types.AttributeValue) {
	rec, err := decodeRun(r.l.opts.Layout, item)
	if err != nil {
		return
	}
	for _, id := range rec.unswept {
		if s, err := time.Parse(time.RFC3339Nano, id); err == nil {
			r.unswept = append(r.unswept, s.UTC())
		}
	}
}

// maxRecorded is how many unswept slots a claim records (the latest).
const maxRecorded = 100

// pendingIDs returns the latest slots still to be swept, for a claim to
// record (claimSpec.unswept).
func (r *runner) pendingIDs() []string {
	if len(r.unswept) == 0 {
		return nil
	}
	slots := slices.Clone(r.unswept)
	slices.SortFunc(slots, time.Time.Compare)
	slots = slices.CompactFunc(slots, time.Time.Equal)
	slots = slots[max(len(slots)-maxRecorded, 0):]
	ids := make([]string, len(slots))
	for i, s := range slots {
		ids[i] = fmtSlot(s)
	}
	return ids
}

// resweep reads back the slots a catch-up could not, and marks orphaned
// runs among them abandoned; what it cannot read or mark it keeps for the
// next time, the latest maxSweep slots, whatever their age: a slot that
// left the catch-up window while its reads failed is never fired again,
// but its run, if left running, must still be marked.
func (r *runner) resweep(ctx context.Context, tn *term) {
	if len(r.unswept) == 0 || ctx.Err() != nil || !tn.leads() {
		return
	}
	slots := r.unswept
	slices.SortFunc(slots, time.Time.Compare)
	slots = slices.CompactFunc(slots, time.Time.Equal)
	if len(slots) > maxSweep {
		slots = slots[len(slots)-maxSweep:] // the latest, as a catch-up reads
	}
	r.unswept = nil
	for start := 0; start < len(slots); start += 100 {
		chunk := slots[start:min(start+100, len(slots))]
		ids := make([]string, len(chunk))
		for i, s := range chunk {
			ids[i] = fmtSlot(s)
		}
		items, err := r.l.getRuns(ctx, ids)
		if err != nil {
			r.unswept = append(r.unswept, slots[start:]...)
			return
		}
		for i, id := range ids {
			if item, ok := items[id]; ok {
				if _, retry := r.abandonOrphan(ctx, tn, chunk[i], item); retry {
					r.unswept = append(r.unswept, chunk[i])
				}
			}
		}
	}
}

// adopt reads, when a tenure begins, the latest run among the 100 slots
// before the catch-up window (the window's own slots are fired or swept by
// the catch-up), in one BatchGetItem: a run an older tenure left running
// there is marked abandoned, and the slots its claim recorded as still to
// sweep are taken on. This is how the run of a leader that died during a
// slow schedule's slot (nightly, say) is settled when the next tenure
// begins after the window, and how a tenure that could not sweep hands its
// slots on. The job's first tenure (fence 1) has no predecessor.
//
// When another replica led between this runner's tenures, the last slot
// this runner handled is read in the same request: the catch-up begins
// after it, but the tenure between may have claimed it again (Rerun) and
// left it running.
func (r *runner) adopt(ctx context.Context, tn *term) {
	if tn.fence == 1 {
		return
	}
	slots := r.slotsBefore(r.l.opts.Now().Add(-r.o.CatchUpWindow), 100, r.o.Retention)
	var own time.Time // the last slot handled, when a tenure came between
	if r.fence != 0 && tn.fence != r.fence+1 && !r.last.IsZero() &&
		(len(slots) == 0 || r.last.After(slots[len(slots)-1])) {
		own = r.last
		if len(slots) == 100 {
			slots = slots[1:] // one request still
		}
	}
	if len(slots) == 0 && own.IsZero() {
		return
	}
	ids := make([]string, len(slots), len(slots)+1)
	for i, s := range slots {
		ids[i] = fmtSlot(s)
	}
	if !own.IsZero() {
		ids = append(ids, fmtSlot(own))
	}
	items, err := r.l.getRuns(ctx, ids)
	if err != nil {
		r.unswept = append(r.unswept, slots...)
		if !own.IsZero() {
			r.unswept = append(r.unswept, own)
		}
		return
	}
	if !own.IsZero() {
		if item, ok := items[fmtSlot(own)]; ok {
			r.inherit(item)
			if _, retry := r.abandonOrphan(ctx, tn, own, item); retry {
				r.unswept = append(r.unswept, own)
			}
		}
	}
	for i := len(slots) - 1; i >= 0; i-- {
		if item, ok := items[ids[i]]; ok {
			r.inherit(item)
			if _, retry := r.abandonOrphan(ctx, tn, slots[i], item); retry {
				r.unswept = append(r.unswept, slots[i])
			}
			return
		}
	}
}

// slotsBefore returns up to the latest n slots at or before t (oldest
// first), looking back at most limit, by enumerating from t less doubling
// spans.
func (r *runner) slotsBefore(t time.Time, n int, limit time.Duration) []time.Time {
	var slots []time.Time
	for span := time.Second; ; span *= 2 {
		span = min(span, limit)
		slots = slots[:0]
		s, err := nextSlot(r.sched, t.Add(-span))
		for i := 0; err == nil && !s.IsZero() && !s.After(t) && i < maxEnumerate; i++ {
			slots = append(slots, s)
			s, err = nextSlot(r.sched, s)
		}
		if err != nil || len(slots) >= n || span >= limit {
			return slots[max(len(slots)-n, 0):]
		}
	}
}

// logTooOld logs the slots after last that fell out of the catch-up window
// before this replica could fire them.
func (r *runner) logTooOld(last, floor time.Time) {
	n, s := 0, last
	for n < maxEnumerate {
		next, err := nextSlot(r.sched, s)
		if err != nil || next.IsZero() || next.After(floor) {
			break
		}
		n++
		s = next
	}
	if n > 0 {
		r.l.log().Warn("ddblease: slots older than the catch-up window were skipped", "after", fmtSlot(last),
			"skipped", n, "window", r.o.CatchUpWindow)
	}
}

// getRuns reads the run items of the runs ids (slot ids, or triggered
// runs' ids) with strongly consistent BatchGetItem requests, and returns
// them by id.
func (l *Lease) getRuns(ctx context.Context, ids []string) (map[string]map[string]types.AttributeValue, error) {
	y := l.opts.Layout
	idOf := make(map[string]string, len(ids)) // sort key -> id
	keys := make([]map[string]types.AttributeValue, 0, len(ids))
	for _, id := range ids {
		sk, err := runSKOf(id)
		if err != nil {
			return nil, fmt.Errorf("ddblease: list runs %q: %w", l.job, err)
		}
		idOf[sk] = id
		keys = append(keys, y.runKey(l.job, sk))
	}
	items, err := batchGet(ctx, l.db, l.table, y, fmt.Sprintf("list runs %q", l.job), keys, l.opts.RetryInterval, l.opts.CallTimeout)
	if err != nil {
		return nil, err
	}
	found := make(map[string]map[string]types.AttributeValue, len(items))
	for _, item := range items {
		if sk, err := str(item, y.SortKey); err == nil && idOf[sk] != "" {
			found[idOf[sk]] = item
		}
	}
	return found, nil
}
