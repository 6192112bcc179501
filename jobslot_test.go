package ddblease_test

import (
	"math"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// secondsOf is the schedule whose slots are the given seconds of every
// minute, as the crontab "s1,s2,... * * * * *" gives them.
func secondsOf(secs ...int) ddblease.Schedule {
	return ddblease.ScheduleFunc(func(t time.Time) time.Time {
		m := t.UTC().Truncate(time.Minute)
		for range 2 {
			for _, s := range secs {
				if x := m.Add(time.Duration(s) * time.Second); x.After(t) {
					return x
				}
			}
			m = m.Add(time.Minute)
		}
		return time.Time{}
	})
}

// TestMatchSlot checks which slot a firing is matched to: the nearest,
// within a tolerance that the default rule takes from the gaps on both
// sides of that slot.
func TestMatchSlot(t *testing.T) {
	t.Parallel()
	min0 := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC) // second 0 of a minute
	ms := time.Millisecond
	burst := secondsOf(0, 1)      // "0,1 * * * * *": gaps of 1s and 59s
	uneven := secondsOf(0, 3, 30) // gaps of 3s, 27s and 30s
	once := ddblease.ScheduleFunc(func(t time.Time) time.Time {
		if t.Before(min0) {
			return min0
		}
		return time.Time{}
	})
	for _, tc := range []struct {
		name  string
		sched ddblease.Schedule
		now   time.Time
		tol   time.Duration // 0: the default rule
		want  time.Time     // zero: ErrNoSlot
	}{
		// A regular schedule with wide gaps: DefaultSlotTolerance.
		{"every minute, on time", ddblease.Every(time.Minute), min0, 0, min0},
		{"every minute, late", ddblease.Every(time.Minute), min0.Add(1900 * ms), 0, min0},
		{"every minute, early", ddblease.Every(time.Minute), min0.Add(-1900 * ms), 0, min0},
		{"every minute, too late", ddblease.Every(time.Minute), min0.Add(2100 * ms), 0, time.Time{}},
		{"every minute, too early", ddblease.Every(time.Minute), min0.Add(-2100 * ms), 0, time.Time{}},
		{"every hour, far from any slot", ddblease.Every(time.Hour), min0.Add(20 * time.Minute), 0, time.Time{}},

		// A burst: second 0 and second 1 of each minute. The tolerance
		// is a quarter of the 1s gap, on whichever side it lies.
		{"burst, second 0 late", burst, min0.Add(200 * ms), 0, min0},
		{"burst, second 0 late past the quarter gap", burst, min0.Add(300 * ms), 0, time.Time{}},
		{"burst, second 0 late nearer second 1", burst, min0.Add(600 * ms), 0, time.Time{}},
		{"burst, second 0 early", burst, min0.Add(-200 * ms), 0, min0},
		{"burst, second 0 too early", burst, min0.Add(-300 * ms), 0, time.Time{}},
		{"burst, second 1 early", burst, min0.Add(800 * ms), 0, min0.Add(time.Second)},
		{"burst, second 1 on time", burst, min0.Add(time.Second), 0, min0.Add(time.Second)},
		{"burst, second 1 late", burst, min0.Add(1200 * ms), 0, min0.Add(time.Second)},
		{"burst, second 1 too late", burst, min0.Add(1300 * ms), 0, time.Time{}},
		{"burst, between the bursts", burst, min0.Add(30 * time.Second), 0, time.Time{}},

		// Uneven gaps: 750ms around second 3 (3s before it), 2s around
		// second 30.
		{"uneven, second 3 late", uneven, min0.Add(3700 * ms), 0, min0.Add(3 * time.Second)},
		{"uneven, second 3 too late", uneven, min0.Add(3800 * ms), 0, time.Time{}},
		{"uneven, second 0 early", uneven, min0.Add(-700 * ms), 0, min0},
		{"uneven, second 0 too early", uneven, min0.Add(-800 * ms), 0, time.Time{}},
		{"uneven, second 0 late", uneven, min0.Add(700 * ms), 0, min0},
		{"uneven, second 0 too late", uneven, min0.Add(800 * ms), 0, time.Time{}},
		{"uneven, second 30 late", uneven, min0.Add(31900 * ms), 0, min0.Add(30 * time.Second)},

		// A dense schedule: a quarter of 1ms.
		{"every ms, late", ddblease.Every(ms), min0.Add(200 * time.Microsecond), 0, min0},
		{"every ms, too late", ddblease.Every(ms), min0.Add(300 * time.Microsecond), 0, time.Time{}},

		// A schedule with one slot: no gap narrows the tolerance.
		{"one slot, late", once, min0.Add(1900 * ms), 0, min0},
		{"one slot, early", once, min0.Add(-1900 * ms), 0, min0},

		// A tolerance given: the nearest slot within it, whatever the gaps.
		{"burst, tolerance given", burst, min0.Add(600 * ms), 700 * ms, min0.Add(time.Second)},
		{"burst, tolerance given, nearer second 0", burst, min0.Add(400 * ms), 700 * ms, min0},
		{"tie goes to the earlier slot", ddblease.Every(time.Minute), min0.Add(30 * time.Second), 40 * time.Second, min0},
		{"tolerance given, too far", ddblease.Every(time.Minute), min0.Add(10 * time.Second), 5 * time.Second, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ddblease.MatchSlot(tc.sched, tc.now, tc.tol)
			if tc.want.IsZero() {
				assert.ErrorIs(t, err, ddblease.ErrNoSlot, "matched %s", got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, time.UTC, got.Location())
		})
	}
}

// TestMatchSlotBurstFirings plays a scheduler that fires the burst
// "0,1 * * * * *" late by a growing delay, up to the 1s gap less the
// 250ms tolerance: each firing matches its own slot or none, never the
// other slot of the burst. (A firing later than that is taken for the
// next slot: no rule can tell them apart.)
func TestMatchSlotBurstFirings(t *testing.T) {
	t.Parallel()
	min0 := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	burst := secondsOf(0, 1)
	for late := time.Duration(0); late < 750*time.Millisecond; late += 25 * time.Millisecond {
		for _, slot := range []time.Time{min0, min0.Add(time.Second)} {
			got, err := ddblease.MatchSlot(burst, slot.Add(late), 0)
			if err != nil {
				assert.ErrorIs(t, err, ddblease.ErrNoSlot)
				continue
			}
			assert.Equal(t, slot, got, "the firing of %s, %v late", slot.Format(time.TimeOnly), late)
		}
	}
}

func TestMatchSlotErrors(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	var typedNil ddblease.ScheduleFunc
	for name, tc := range map[string]struct {
		sched ddblease.Schedule
		tol   time.Duration
	}{
		"nil schedule":       {nil, 0},
		"typed nil schedule": {typedNil, 0},
		"invalid period":     {ddblease.Every(0), 0},
		"negative tolerance": {ddblease.Every(time.Minute), -time.Second},
		"Next not forward":   {ddblease.ScheduleFunc(func(t time.Time) time.Time { return t }), 0},
		"Next panics":        {ddblease.ScheduleFunc(func(time.Time) time.Time { panic("boom") }), 0},
		"Next goes back": {ddblease.ScheduleFunc(func(t time.Time) time.Time {
			if t.Before(now.Add(-time.Second)) {
				return t.Add(time.Millisecond)
			}
			return t.Add(-time.Hour)
		}), 0},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ddblease.MatchSlot(tc.sched, now, tc.tol)
			assert.ErrorIs(t, err, ddblease.ErrInvalid)
			assert.NotErrorIs(t, err, ddblease.ErrNoSlot)
		})
	}
}

// TestMatchSlotSays checks that a firing matched to no slot is told which
// slot was nearest and which tolerance refused it.
func TestMatchSlotSays(t *testing.T) {
	t.Parallel()
	min0 := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	_, err := ddblease.MatchSlot(secondsOf(0, 1), min0.Add(600*time.Millisecond), 0)
	require.ErrorIs(t, err, ddblease.ErrNoSlot)
	assert.Equal(t, "ddblease: no slot near the firing: the slot nearest to 2026-11-30T02:00:00.6Z is 2026-11-30T02:00:01Z, "+
		"400ms away: beyond the tolerance of 250ms (a quarter of the 1s from the slot before it)", err.Error())
	_, err = ddblease.MatchSlot(ddblease.Every(time.Hour), min0.Add(time.Minute), 0)
	require.ErrorIs(t, err, ddblease.ErrNoSlot)
	assert.Equal(t, "ddblease: no slot near the firing: no slot of the schedule between 2026-11-30T02:00:58Z and 2026-11-30T02:01:02Z", err.Error())
}

// TestMatchSlotCalls bounds the Next calls of a match, on a sparse and on
// a dense schedule: it probes, it does not walk the window.
func TestMatchSlotCalls(t *testing.T) {
	t.Parallel()
	midnight := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for _, d := range []time.Duration{time.Microsecond, time.Millisecond, 24 * time.Hour} {
		calls := 0
		every := ddblease.Every(d)
		counted := ddblease.ScheduleFunc(func(t time.Time) time.Time { calls++; return every.Next(t) })
		got, err := ddblease.MatchSlot(counted, midnight.Add(min(d/10, time.Second)), 0)
		require.NoError(t, err)
		assert.Equal(t, midnight, got)
		t.Logf("every %v: %d calls to Next", d, calls)
		assert.LessOrEqual(t, calls, 2*(2+64), "every %v: %d calls to Next", d, calls)
	}
}

// TestMatchSlotHugeTolerance gives a tolerance too wide for any schedule
// to need (up to the largest Duration) to a schedule with no slot before
// the firing: the slot after it is matched, with a bounded number of calls
// to Next. (The window doubled past 2^62ns wrapped round and never reached
// the tolerance: MatchSlot spun for ever.)
func TestMatchSlotHugeTolerance(t *testing.T) {
	t.Parallel()
	first := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	for _, tol := range []time.Duration{time.Duration(math.MaxInt64), 200 * 365 * 24 * time.Hour} {
		calls := 0
		// The first slot is ahead of the firing: none lies before it. The
		// schedule panics past a bound (MatchSlot turns that into an
		// error) rather than letting a spinning match hang the test.
		starts := ddblease.ScheduleFunc(func(t time.Time) time.Time {
			if calls++; calls > 1000 {
				panic("Next called more than 1000 times")
			}
			if t.Before(first) {
				return first
			}
			return t.Add(time.Hour)
		})
		got, err := ddblease.MatchSlot(starts, first.Add(-time.Minute), tol)
		require.NoError(t, err, "tolerance %v", tol)
		assert.Equal(t, first, got)
		t.Logf("tolerance %v: %d calls to Next", tol, calls)
	}
}
