package ddblease

import (
	"math/bits"
	"reflect"
	"time"
)

// This file owns Schedule, Every, the validation of a schedule and the
// id of a slot (slotID).

// Schedule tells when a job's slots fall due. Next returns the first slot
// strictly after t, or the zero time when the schedule has no further slot.
// It has the method set of robfig/cron's Schedule, so a parsed cron
// expression (cron.ParseStandard("0 2 * * *")) can be passed as it is.
//
// A slot is an instant: this package keeps it in UTC and drops its
// monotonic clock reading. A Next that returns a time not after its input,
// or that panics, is reported as an error wrapping ErrInvalid.
type Schedule interface {
	Next(t time.Time) time.Time
}

// ScheduleFunc adapts a function to the Schedule interface.
type ScheduleFunc func(t time.Time) time.Time

// Next calls f(t).
func (f ScheduleFunc) Next(t time.Time) time.Time { return f(t) }

// Every returns a Schedule whose slots are the multiples of d since the Unix
// epoch: Every(time.Hour) falls due on the hour, Every(24*time.Hour) at
// midnight UTC, whatever the time zone and whenever the process started. A
// period that is not positive is reported, as an error wrapping ErrInvalid,
// by RunSchedule and ListRuns.
func Every(d time.Duration) Schedule { return every(d) }

type every time.Duration

// Next returns the first multiple of the period since the Unix epoch after t.
func (e every) Next(t time.Time) time.Time {
	d := time.Duration(e)
	if d <= 0 {
		return t // refused by validate
	}
	t = t.Round(0).UTC()
	return t.Add(d - epochRem(t, d))
}

func (e every) validate() error {
	if e <= 0 {
		return invalid("Every(%v): the period must be positive", time.Duration(e))
	}
	return nil
}

// String returns "every <d>".
func (e every) String() string { return "every " + time.Duration(e).String() }

// epochRem returns the time elapsed since the latest multiple of d since the
// Unix epoch, in [0, d), computed without overflow for any t.
func epochRem(t time.Time, d time.Duration) time.Duration {
	sec, nsec, dd := t.Unix(), uint64(t.Nanosecond()), uint64(d)
	if sec >= 0 {
		hi, lo := bits.Mul64(uint64(sec), 1e9)
		var c uint64
		lo, c = bits.Add64(lo, nsec, 0)
		return time.Duration(bits.Rem64(hi+c, lo, dd))
	}
	// t is before the epoch: take |t - epoch| mod d, then floor.
	hi, lo := bits.Mul64(uint64(-sec), 1e9)
	var b uint64
	lo, b = bits.Sub64(lo, nsec, 0)
	m := bits.Rem64(hi-b, lo, dd)
	if m == 0 {
		return 0
	}
	return time.Duration(dd - m)
}

// checkSchedule rejects a nil schedule (also a typed nil) and one that
// validates itself as invalid, such as Every(0).
func checkSchedule(s Schedule) error {
	if s == nil {
		return invalid("schedule is nil")
	}
	switch v := reflect.ValueOf(s); v.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Slice, reflect.Interface, reflect.Chan:
		if v.IsNil() {
			return invalid("schedule is a nil %T", s)
		}
	}
	if v, ok := s.(interface{ validate() error }); ok {
		return v.validate()
	}
	return nil
}

// nextSlot calls s.Next(t) and checks its answer: the zero time (no further
// slot) or a time after t, returned in UTC without a monotonic reading.
func nextSlot(s Schedule, t time.Time) (next time.Time, err error) {
	defer func() {
		if p := recover(); p != nil {
			next, err = time.Time{}, invalid("schedule %T panicked on Next(%s): %v", s, fmtSlot(t), p)
		}
	}()
	next = s.Next(t)
	if next.IsZero() {
		return time.Time{}, nil
	}
	if !next.After(t) {
		return time.Time{}, invalid("schedule %T returned %s for Next(%s): a slot must be after the time given",
			s, fmtSlot(next), fmtSlot(t))
	}
	return next.Round(0).UTC(), nil
}

func fmtSlot(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// slotID formats a slot for the run item's key: RFC 3339 in UTC, with as
// many fractional digits as it needs (2026-11-30T02:00:00Z). A zero slot,
// or one outside years 0001-9999, is an error wrapping ErrInvalid.
func slotID(slot time.Time) (string, error) {
	if slot.IsZero() {
		return "", invalid("slot is the zero time")
	}
	if y := slot.UTC().Year(); y < 1 || y > 9999 {
		return "", invalid("slot %v is outside years 0001-9999", slot)
	}
	return fmtSlot(slot), nil
}
