package ddblease

import (
	"fmt"
	"time"
)

// This file owns MatchSlot: the slot an external scheduler's firing stands
// for.

// DefaultSlotTolerance is the widest tolerance MatchSlot allows when it is
// given none.
const DefaultSlotTolerance = 2 * time.Second

// maxSlotsWalked bounds the consecutive slots MatchSlot steps through to
// find the one before a time.
const maxSlotsWalked = 10_000

// MatchSlot returns the slot of sched that a firing at now stands for, for
// a scheduler that fires a job without saying which nominal time it fires
// for (gocron, robfig/cron): the slot nearest to now (the earlier one on a
// tie), if it lies within the tolerance of now. Otherwise it returns an
// error wrapping ErrNoSlot that names the nearest slot and the tolerance,
// and nothing should run for the firing. The slot is in UTC.
//
// tolerance is how far from its slot a firing may be; it must cover how
// late the scheduler fires and how far its clock is from the one now is
// read from. Zero means the default rule: the smaller of
// DefaultSlotTolerance and a quarter of each of the gaps on both sides of
// the slot nearest to now (from the slot before it, and to the slot after
// it). So for a burst such as "0,1 * * * * *" (seconds 0 and 1 of every
// minute) the tolerance is 250ms: a firing of second 0 that is 300ms late
// matches no slot rather than being taken for second 1, and a firing of
// second 1 still matches second 1.
//
// Replicas that fire for the same nominal time, by clocks and timers that
// differ from it by less than the tolerance, get the same slot, provided
// the tolerance is below half of the gaps on both sides of that slot (the
// default rule keeps it at a quarter): a firing that strays past half a gap
// is taken for the neighbouring slot.
//
// A nil sched, a negative tolerance, and a sched whose Next panics or
// returns a time not after its input are errors wrapping ErrInvalid.
// MatchSlot makes no request; it calls sched.Next a few dozen times.
func MatchSlot(sched Schedule, now time.Time, tolerance time.Duration) (time.Time, error) {
	if err := checkSchedule(sched); err != nil {
		return time.Time{}, fmt.Errorf("MatchSlot: %w", err)
	}
	if tolerance < 0 {
		return time.Time{}, invalid("MatchSlot: tolerance %v is negative", tolerance)
	}
	now = now.Round(0).UTC()
	reach := tolerance
	if reach == 0 {
		reach = DefaultSlotTolerance
	}
	after, err := nextSlot(sched, now.Add(-time.Nanosecond)) // the first slot at or after now
	if err != nil {
		return time.Time{}, fmt.Errorf("MatchSlot: %w", err)
	}
	before, err := slotBefore(sched, now, reach)
	if err != nil {
		return time.Time{}, fmt.Errorf("MatchSlot: %w", err)
	}
	if !after.IsZero() && after.Sub(now) > reach {
		after = time.Time{}
	}
	slot := before
	if slot.IsZero() || (!after.IsZero() && after.Sub(now) < now.Sub(before)) {
		slot = after
	}
	if slot.IsZero() {
		return time.Time{}, fmt.Errorf("%w: no slot of the schedule between %s and %s",
			ErrNoSlot, fmtSlot(now.Add(-reach)), fmtSlot(now.Add(reach)))
	}
	if tolerance > 0 {
		return slot, nil
	}

	// The default rule: a quarter of each gap around the slot. Gaps of
	// 4*DefaultSlotTolerance or more do not narrow it.
	tol, why := DefaultSlotTolerance, ""
	wide := 4 * DefaultSlotTolerance
	prev, err := slotBefore(sched, slot, wide)
	if err != nil {
		return time.Time{}, fmt.Errorf("MatchSlot: %w", err)
	}
	if !prev.IsZero() && slot.Sub(prev)/4 < tol {
		tol, why = slot.Sub(prev)/4, fmt.Sprintf("a quarter of the %v from the slot before it", slot.Sub(prev))
	}
	next, err := nextSlot(sched, slot)
	if err != nil {
		return time.Time{}, fmt.Errorf("MatchSlot: %w", err)
	}
	if !next.IsZero() && next.Sub(slot)/4 < tol {
		tol, why = next.Sub(slot)/4, fmt.Sprintf("a quarter of the %v to the slot after it", next.Sub(slot))
	}
	if off := absDuration(slot.Sub(now)); off > tol {
		if why == "" {
			why = "DefaultSlotTolerance"
		}
		return time.Time{}, fmt.Errorf("%w: the slot nearest to %s is %s, %v away: beyond the tolerance of %v (%s)",
			ErrNoSlot, fmtSlot(now), fmtSlot(slot), off, tol, why)
	}
	return slot, nil
}

// slotBefore returns the last slot of sched before x, if one lies within
// limit of it (after x-limit), and the zero time otherwise. It probes
// windows that double from 1ns up to limit, and then steps forward through
// the slots of the window that holds one.
func slotBefore(sched Schedule, x time.Time, limit time.Duration) (time.Time, error) {
	for d := min(1, limit); ; {
		y, err := nextSlot(sched, x.Add(-d))
		if err != nil {
			return time.Time{}, err
		}
		if !y.IsZero() && y.Before(x) {
			for range maxSlotsWalked {
				z, err := nextSlot(sched, y)
				if err != nil {
					return time.Time{}, err
				}
				if z.IsZero() || !z.Before(x) {
					return y, nil
				}
				y = z
			}
			return time.Time{}, invalid("schedule %T has more than %d slots between %s and %s",
				sched, maxSlotsWalked, fmtSlot(x.Add(-d)), fmtSlot(x))
		}
		if d == limit {
			return time.Time{}, nil
		}
		// Doubling past half the limit would overflow a limit above
		// 2^62ns (about 146 years) and never reach it.
		if d > limit/2 {
			d = limit
		} else {
			d *= 2
		}
	}
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
