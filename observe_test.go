package ddblease_test

import (
	"sync"
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
