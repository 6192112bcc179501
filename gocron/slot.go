package ddbleasegocron

import (
	"errors"
	"fmt"
	"time"

	"github.com/ddblease/ddblease"
)

// ErrNoSlot reports that a firing could not be matched to a slot of its
// job's schedule: no slot lies within the tolerance of the time it fired.
// The Lock fails, so gocron does not run the job for that firing.
var ErrNoSlot = errors.New("ddbleasegocron: no slot near the firing")

// maxSlotsInWindow bounds the slots looked at around one firing.
const maxSlotsInWindow = 10_000

// NearestSlot returns the slot of sched nearest to now, among those from
// now-tolerance to now+tolerance (an earlier one on a tie). It returns an
// error wrapping ErrNoSlot when there is none, and one wrapping
// ddblease.ErrInvalid when sched misbehaves (a Next that panics or does not
// move forward).
//
// Every replica that fires for the same nominal time, by clocks and timers
// that differ by less than the tolerance, gets the same slot, provided the
// tolerance is below half the gap between consecutive slots: a firing late
// by more than half that gap is taken for the next slot.
func NearestSlot(sched ddblease.Schedule, now time.Time, tolerance time.Duration) (time.Time, error) {
	if sched == nil {
		return time.Time{}, fmt.Errorf("%w: schedule is nil", ddblease.ErrInvalid)
	}
	if tolerance < 0 {
		return time.Time{}, fmt.Errorf("%w: tolerance %v is negative", ddblease.ErrInvalid, tolerance)
	}
	now = now.Round(0)
	lo, hi := now.Add(-tolerance), now.Add(tolerance)
	var best time.Time
	t := lo.Add(-time.Nanosecond)
	for range maxSlotsInWindow {
		next, err := safeNext(sched, t)
		if err != nil {
			return time.Time{}, err
		}
		if next.IsZero() || next.After(hi) {
			break
		}
		if best.IsZero() || absDur(next.Sub(now)) < absDur(best.Sub(now)) {
			best = next
		}
		t = next
	}
	if best.IsZero() {
		return time.Time{}, fmt.Errorf("%w: no slot of the schedule between %s and %s",
			ErrNoSlot, lo.UTC().Format(time.RFC3339Nano), hi.UTC().Format(time.RFC3339Nano))
	}
	return best.UTC(), nil
}

func safeNext(sched ddblease.Schedule, t time.Time) (next time.Time, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: schedule %T panicked on Next: %v", ddblease.ErrInvalid, sched, p)
		}
	}()
	next = sched.Next(t)
	if !next.IsZero() && !next.After(t) {
		return time.Time{}, fmt.Errorf("%w: schedule %T returned %v for Next(%v): not after it", ddblease.ErrInvalid, sched, next, t)
	}
	return next, nil
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
