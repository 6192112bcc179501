package ddblease_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// eventLog collects a handle's events.
type eventLog struct {
	mu     sync.Mutex
	events []ddblease.Event
}

func (l *eventLog) option(o *ddblease.Options) {
	o.Observer = func(e ddblease.Event) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.events = append(l.events, e)
	}
}

func (l *eventLog) find(k ddblease.EventKind) *ddblease.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.events {
		if l.events[i].Kind == k {
			e := l.events[i]
			return &e
		}
	}
	return nil
}

// all returns the events seen.
func (l *eventLog) all() []ddblease.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]ddblease.Event(nil), l.events...)
}

// kinds returns the kinds seen, requests left out.
func (l *eventLog) kinds() []ddblease.EventKind {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ks []ddblease.EventKind
	for _, e := range l.events {
		if e.Kind != ddblease.EventCall {
			ks = append(ks, e.Kind)
		}
	}
	return ks
}

// The observer sees a tenure from campaign to resignation, in order, and
// each request with its outcome; a standby sees the hand-over.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	var ae, be eventLog
	a := newLease(t, db, table, "job", fast("a"), ae.option)
	b := newLease(t, db, table, "job", fast("b"), be.option)
	av, bv := newLeaderView(), newLeaderView()
	stopA := runAsync(ctx, a, av.fn)
	receive(t, av.starts, "a leads")
	stopB := runAsync(ctx, b, bv.fn)
	for ae.find(ddblease.EventRenewed) == nil || be.find(ddblease.EventLeaderSeen) == nil {
		select {
		case <-ctx.Done():
			t.Fatal("no renewal or no leader seen")
		case <-time.After(20 * time.Millisecond):
		}
	}
	require.NoError(t, stopA())
	receive(t, bv.starts, "b leads")
	require.NoError(t, stopB())

	want := []ddblease.EventKind{ddblease.EventCampaign, ddblease.EventAcquired, ddblease.EventRenewed,
		ddblease.EventDraining, ddblease.EventResigned, ddblease.EventStopped}
	got := ae.kinds()
	i := 0
	for _, k := range got {
		if i < len(want) && k == want[i] {
			i++
		}
	}
	assert.Equal(t, len(want), i, "a's events %v do not follow %v", got, want)
	renewed := ae.find(ddblease.EventRenewed)
	assert.Equal(t, int64(1), renewed.Fence)
	assert.Positive(t, renewed.Margin)
	assert.Equal(t, "a", renewed.Owner)
	assert.Equal(t, "job", renewed.Job)
	seen := be.find(ddblease.EventLeaderSeen)
	assert.Equal(t, "a", seen.Holder)
	assert.Equal(t, int64(1), seen.Fence)
	acq := be.find(ddblease.EventAcquired)
	require.NotNil(t, acq)
	assert.Equal(t, int64(2), acq.Fence)
	stopped := ae.find(ddblease.EventStopped)
	assert.NoError(t, stopped.Err)
	call := ae.find(ddblease.EventCall)
	require.NotNil(t, call)
	assert.NotEmpty(t, call.Op)
	assert.Equal(t, ddblease.CallOK, call.Outcome)
}

// An observer may call any method of the handle it observes, from any
// event: events are delivered after the write lock of the lease is
// released, as documented. The observer here reads the handle on every
// event, calls each writing method once when the lease is acquired, and
// resigns on a renewal (as one that resigns on a thin margin would): the
// keeper goes on, Run campaigns again and returns when stopped.
func TestObserverMayCallEveryMethod(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 40*time.Second)
	table, db := tableAndClient(t)
	var l *ddblease.Lease
	var mu sync.Mutex
	errs := map[string]error{}
	record := func(name string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := errs[name]; !ok {
			errs[name] = err
		}
	}
	slot := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	acquired, resigning := 0, false
	v := newLeaderView()
	resigned := make(chan struct{})
	observer := func(e ddblease.Event) {
		_, _, _, _, _ = l.IsLeader(), l.State(), l.Job(), l.Owner(), l.Options()
		_, _ = l.CheckHealth(0), l.ResignRequested()
		if e.Kind == ddblease.EventCall {
			return // a request from here would report another
		}
		_, err := l.Holder(ctx)
		record("Holder", err)
		switch e.Kind {
		case ddblease.EventAcquired:
			if acquired++; acquired > 1 {
				return
			}
			record("Heartbeat", l.Heartbeat(ctx))
			_, err = l.TryAcquire(ctx)
			record("TryAcquire", err)
			_, err = l.Acquire(ctx)
			record("Acquire", err)
			run, err := l.Claim(ctx, slot)
			record("Claim", err)
			if err == nil {
				record("Finish", run.Finish(ctx, nil))
			}
			_, err = l.ListRuns(ctx, oneSlot(slot), slot, slot)
			record("ListRuns", err)
			record("Run", l.Run(ctx, func(context.Context, int64) error { return nil }))
			record("RunSchedule", l.RunSchedule(ctx, farSchedule, func(context.Context, *ddblease.JobRun) error { return nil }))
			record("ResignOnSignal", l.ResignOnSignal(syscall.SIGWINCH)())
		case ddblease.EventRenewed:
			// A renewal by the keeper: fn runs (the renewals made above are
			// delivered before Run calls fn).
			if v.live() && !resigning {
				resigning = true
				record("Resign", l.Resign(ctx))
				close(resigned)
			}
		}
	}
	l = newLease(t, db, table, "job", fast("a"), func(o *ddblease.Options) { o.Observer = observer })
	stop := runAsync(ctx, l, v.fn)
	t.Cleanup(func() { _ = stop() })
	require.Equal(t, int64(1), receive(t, v.starts, "leads"))
	receive(t, resigned, "the observer resigns on a renewal")
	require.Equal(t, int64(2), receive(t, v.starts, "leads again: Run campaigns on"))
	returned := make(chan error, 1)
	go func() { returned <- stop() }()
	assert.NoError(t, receive(t, returned, "Run returns when stopped"))

	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"Holder", "Heartbeat", "TryAcquire", "Acquire", "Claim", "Finish", "ListRuns", "ResignOnSignal", "Resign"} {
		got, ok := errs[name]
		if assert.True(t, ok, "%s was called", name) {
			assert.NoError(t, got, name)
		}
	}
	assert.ErrorIs(t, errs["Run"], ddblease.ErrInvalid, "one campaign per handle")
	assert.ErrorIs(t, errs["RunSchedule"], ddblease.ErrInvalid, "one campaign per handle")
}

// An observer told that a run finished may call that run's methods (a
// second Finish is refused with ErrInvalid): the event is not delivered
// while the run's own lock is held.
func TestObserverMayCallTheRunItReports(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	var run *ddblease.JobRun
	again := make(chan error, 1)
	l := newLease(t, db, table, "job", fast("a"), func(o *ddblease.Options) {
		o.Observer = func(e ddblease.Event) {
			if e.Kind == ddblease.EventRunFinished {
				again <- run.Finish(ctx, nil)
			}
		}
	})
	_, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	run, err = l.Claim(ctx, time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	finished := make(chan error, 1)
	go func() { finished <- run.Finish(ctx, nil) }()
	assert.NoError(t, receive(t, finished, "Finish returns"))
	assert.ErrorIs(t, receive(t, again, "the observer's Finish returns"), ddblease.ErrInvalid)
	require.NoError(t, l.Resign(ctx))
}
