package ddblease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// JobRun.Commit writes the effect and the run's completion together, once:
// the slot cannot be re-run after it, and a failed condition among the
// effect's items leaves the run running.
func TestCommitExactlyOnce(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	l := newLease(t, db, table, "payout", fast("a"), slowLease)
	_, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	slot := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	run, err := l.Claim(ctx, slot, func(o *ddblease.JobOptions) { o.Rerun = ddblease.Rerun })
	require.NoError(t, err)
	put := func(pk string, cond string) []types.TransactWriteItem {
		p := &types.Put{TableName: aws.String(table), Item: key(pk)}
		if cond != "" {
			p.ConditionExpression = aws.String(cond)
		}
		return []types.TransactWriteItem{{Put: p}}
	}
	if !caps.Transactions {
		require.ErrorIs(t, run.Commit(ctx, put("payout#x", "")), ddblease.ErrTransactionsUnsupported)
		srv.Require(t, false, "TransactWriteItems")
	}
	putRaw(t, db, table, key("payout#exists"))
	err = run.Commit(ctx, put("payout#exists", "attribute_not_exists(pk)"))
	var tce *types.TransactionCanceledException
	require.ErrorAs(t, err, &tce, "the effect's own condition failed")
	assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
	runs, err := l.ListRuns(ctx, oneSlot(slot), slot, slot)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunRunning, runs[0].Status)

	require.NoError(t, run.Commit(ctx, put("payout#"+run.IdempotencyKey(), "")))
	assert.NotEmpty(t, getRaw(t, db, table, "payout#"+run.IdempotencyKey()))
	runs, err = l.ListRuns(ctx, oneSlot(slot), slot, slot)
	require.NoError(t, err)
	assert.Equal(t, ddblease.RunSucceeded, runs[0].Status)
	require.ErrorIs(t, run.Finish(ctx, nil), ddblease.ErrInvalid)
	_, err = l.Claim(ctx, slot, func(o *ddblease.JobOptions) { o.Rerun = ddblease.Rerun })
	require.ErrorIs(t, err, ddblease.ErrSlotTaken, "a committed slot is never re-run")
}

// Test 5 of the issue, for job runs and schedules: bad input gets clear
// errors, never a panic, and no request.
func TestJobRunBadInput(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
	l := newLease(t, db, table, "sweeper", fast("a"), slowLease)
	noop := func(context.Context, *ddblease.JobRun) error { return nil }
	var nilEvery *everyPtr

	t.Run("Claim", func(t *testing.T) {
		_, err := l.Claim(ctx, time.Unix(3600, 0))
		require.ErrorIs(t, err, ddblease.ErrNotLeader)
		_, err = l.TryAcquire(ctx)
		require.NoError(t, err)
		before := total(faults.Counts())
		for name, c := range map[string]struct {
			slot time.Time
			opts func(*ddblease.JobOptions)
			want string
		}{
			"zero slot":          {time.Time{}, nil, "zero time"},
			"slot after 9999":    {time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), nil, "outside years"},
			"negative retention": {time.Unix(3600, 0), func(o *ddblease.JobOptions) { o.Retention = -time.Hour }, "negative"},
			"negative window":    {time.Unix(3600, 0), func(o *ddblease.JobOptions) { o.CatchUpWindow = -1 }, "negative"},
			"retention <= window": {time.Unix(3600, 0), func(o *ddblease.JobOptions) {
				o.Retention, o.CatchUpWindow = time.Hour, 2*time.Hour
			}, "must exceed"},
			"unknown policy": {time.Unix(3600, 0), func(o *ddblease.JobOptions) { o.Rerun = 7 }, "RerunPolicy"},
		} {
			_, err := l.Claim(ctx, c.slot, c.opts)
			require.ErrorIs(t, err, ddblease.ErrInvalid, name)
			assert.Contains(t, err.Error(), c.want, name)
		}
		assert.Equal(t, before, total(faults.Counts()), "bad input makes no request")
	})

	t.Run("RunSchedule", func(t *testing.T) {
		before := total(faults.Counts())
		same := ddblease.ScheduleFunc(func(t time.Time) time.Time { return t })
		earlier := ddblease.ScheduleFunc(func(t time.Time) time.Time { return t.Add(-time.Second) })
		panics := ddblease.ScheduleFunc(func(time.Time) time.Time { panic("boom") })
		var nilFunc ddblease.ScheduleFunc
		for name, c := range map[string]struct {
			sched ddblease.Schedule
			fn    func(context.Context, *ddblease.JobRun) error
			want  string
		}{
			"nil schedule":       {nil, noop, "schedule is nil"},
			"typed nil schedule": {nilEvery, noop, "nil"},
			"nil ScheduleFunc":   {nilFunc, noop, "nil"},
			"nil fn":             {ddblease.Every(time.Hour), nil, "fn is nil"},
			"Every(0)":           {ddblease.Every(0), noop, "must be positive"},
			"Every(-1s)":         {ddblease.Every(-time.Second), noop, "must be positive"},
			"not after input":    {same, noop, "must be after"},
			"before input":       {earlier, noop, "must be after"},
			"panics":             {panics, noop, "panicked"},
		} {
			err := l.RunSchedule(ctx, c.sched, c.fn)
			require.ErrorIs(t, err, ddblease.ErrInvalid, name)
			assert.Contains(t, err.Error(), c.want, name)
		}
		assert.Equal(t, before, total(faults.Counts()), "bad input makes no request")
	})

	t.Run("schedule that turns bad", func(t *testing.T) {
		// Valid at first, then returns its input: RunSchedule stops with
		// the error (after resigning).
		var mu sync.Mutex
		calls := 0
		sched := ddblease.ScheduleFunc(func(t time.Time) time.Time {
			mu.Lock()
			defer mu.Unlock()
			calls++
			if calls == 1 {
				return t.Add(time.Hour)
			}
			return t
		})
		l2 := newLease(t, db, table, "turns-bad", fast("b"))
		err := l2.RunSchedule(ctx, sched, noop)
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		assert.Contains(t, err.Error(), "must be after")
		assert.False(t, l2.IsLeader())
	})

	t.Run("ListRuns", func(t *testing.T) {
		from := time.Unix(0, 0)
		_, err := l.ListRuns(ctx, nil, from, from)
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		_, err = l.ListRuns(ctx, ddblease.Every(time.Second), from.Add(time.Hour), from)
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		_, err = l.ListRuns(ctx, ddblease.Every(time.Second), time.Time{}, from)
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		_, err = l.ListRuns(ctx, ddblease.Every(time.Second), from, from.Add(time.Hour))
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		assert.Contains(t, err.Error(), "more than 1000 slots")
	})

	t.Run("malformed run items", func(t *testing.T) {
		raw := srv.Client(nil)
		slot := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
		id := slot.Format(time.RFC3339Nano)
		good := func() map[string]types.AttributeValue {
			return withKey("jobrun#sweeper#"+id, map[string]types.AttributeValue{
				"job": sAttr("sweeper"), "slot": sAttr(id),
				"fence": nAttr("1"), "owner": sAttr("x"), "claim": sAttr("c"), "status": sAttr("succeeded"),
				"startedAt": nAttr("1"),
			})
		}
		cases := map[string]func(map[string]types.AttributeValue){
			"no fence":      func(m map[string]types.AttributeValue) { delete(m, "fence") },
			"no status":     func(m map[string]types.AttributeValue) { delete(m, "status") },
			"no slot":       func(m map[string]types.AttributeValue) { delete(m, "slot") },
			"bad status":    func(m map[string]types.AttributeValue) { m["status"] = sAttr("exploded") },
			"string fence":  func(m map[string]types.AttributeValue) { m["fence"] = sAttr("1") },
			"fence 0":       func(m map[string]types.AttributeValue) { m["fence"] = nAttr("0") },
			"bad slot text": func(m map[string]types.AttributeValue) { m["slot"] = sAttr("yesterday") },
			"other slot":    func(m map[string]types.AttributeValue) { m["slot"] = sAttr("2026-11-30T03:00:00Z") },
			"no claim":      func(m map[string]types.AttributeValue) { delete(m, "claim") },
			"no startedAt":  func(m map[string]types.AttributeValue) { delete(m, "startedAt") },
			"bool missed":   func(m map[string]types.AttributeValue) { m["missed"] = &types.AttributeValueMemberBOOL{} },
		}
		for name, spoil := range cases {
			item := good()
			spoil(item)
			putRaw(t, raw, table, item)
			_, err := l.ListRuns(ctx, oneSlot(slot), slot, slot)
			require.ErrorIs(t, err, ddblease.ErrMalformedItem, name)
			_, err = l.Claim(ctx, slot)
			require.ErrorIs(t, err, ddblease.ErrMalformedItem, name)
		}
		putRaw(t, raw, table, good())
		runs, err := l.ListRuns(ctx, oneSlot(slot), slot, slot)
		require.NoError(t, err)
		require.Len(t, runs, 1)
	})
}

// everyPtr is a Schedule with a pointer receiver, for a typed nil.
type everyPtr struct{ d time.Duration }

func (e *everyPtr) Next(t time.Time) time.Time { return t.Add(e.d) }
