package ddblease

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

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
	missed, abandoned, found := 0, 0, false
	var again []time.Time // orphans whose marking failed transiently
	for end := len(older); end > 0 && !found; end -= 100 {
		chunk := older[max(end-100, 0):end]
		ids := make([]string, len(chunk))
		for i, s := range chunk {
			ids[i] = fmtSlot(s)
		}
		var items map[string]map[string]types.AttributeValue
		err := retry(ctx, fixed(l.opts.RetryInterval), 3, func() error {
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
			item, ok := items[runItemKey(l.job, ids[i])]
			if !ok {
				if !found {
					missed++
				}
				continue
			}
			found = true
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
		l.log.Info("ddblease: runs left running by an earlier leader were marked abandoned", "abandoned", abandoned,
			"firing", fmtSlot(latest))
	}
	if !found && n > len(older) {
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
	rec, err := decodeRun(item)
	if err != nil {
		l.log.Error("ddblease: skipped slot has a malformed run item", "slot", id, "err", err)
		return false, false
	}
	givenUp := rec.Status == RunRunning && rec.Fence == tn.fence && slices.Contains(r.givenUp, rec.claim)
	if !rec.orphanFor(tn.fence) && !givenUp {
		return false, false
	}
	_, ok, err := l.abandon(ctx, rec, tn.fence)
	if err != nil {
		l.log.Warn("ddblease: could not mark an orphaned run abandoned", "slot", id, "fence", rec.Fence, "err", err)
		return false, retryable(err)
	}
	return ok, false
}

// inherit takes on the slots that the tenure which claimed this run
// (item) could not sweep, recorded in its claim: they are read back by
// the next resweep.
func (r *runner) inherit(item map[string]types.AttributeValue) {
	rec, err := decodeRun(item)
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

// keepOrphan keeps slot for the next resweep when err, from its claim,
// says that the slot holds a run an older tenure left running, which the
// claim could not mark abandoned.
func (r *runner) keepOrphan(err error, tn *term, slot time.Time) {
	var taken *SlotTakenError
	if errors.As(err, &taken) && !taken.Abandoned && taken.Run.orphanFor(tn.fence) {
		r.unswept = append(r.unswept, slot)
	}
}

// resweep reads back the slots a catch-up could not, and marks orphaned
// runs among them abandoned; what it cannot read or mark it keeps for the
// next time, the latest maxSweep slots, whatever their age: a slot that
// left the catch-up window while its reads failed is never fired again,
// but its run, if left running, must still be marked.
func (r *runner) resweep(ctx context.Context, tn *term) {
	if len(r.unswept) == 0 || ctx.Err() != nil {
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
			if item, ok := items[runItemKey(r.l.job, id)]; ok {
				if _, retry := r.abandonOrphan(ctx, tn, chunk[i], item); retry {
					r.unswept = append(r.unswept, chunk[i])
				}
			}
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
		r.l.log.Warn("ddblease: slots older than the catch-up window were skipped", "after", fmtSlot(last),
			"skipped", n, "window", r.o.CatchUpWindow)
	}
}
