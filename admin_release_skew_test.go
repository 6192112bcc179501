package ddblease_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A forced release keeps one leader at a time also when the released
// holder, cut off from the table right after the release, believes it
// leads until its local deadline, with a clock behind the standby's by
// almost MaxClockSkew: the holder's recorded expiry, by its slow clock, is
// kept, and the standby waits for it plus MaxClockSkew by its own.
func TestForceReleaseSlowHolderClock(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, faults, dbA := tableWithFaults(t)
	db := srv.Client(nil)
	admin := newAdmin(t, db, table)
	const behind = 140 * time.Millisecond // fast's MaxClockSkew is 150ms
	renewed := make(chan struct{}, 16)
	a := newLease(t, dbA, table, "billing", fast("a"), releaseTimings, func(o *ddblease.Options) {
		o.Now = func() time.Time { return time.Now().Add(-behind) }
		o.Observer = func(e ddblease.Event) {
			if e.Kind == ddblease.EventRenewed {
				select {
				case renewed <- struct{}{}:
				default:
				}
			}
		}
	})
	pa := newLeaderProbe(a)
	stopA := runAsync(ctx, a, pa.fn)
	defer func() { _ = stopA() }() // cut off, a's campaign ends with its failed attempts
	f1 := receive(t, pa.started, "a leads")

	b := newLease(t, db, table, "billing", fast("b"), releaseTimings)
	pb := newLeaderProbe(b)
	var overlap atomic.Bool
	pb.onStart = func(int64) {
		if pa.leads() {
			overlap.Store(true)
		}
	}
	stopB := runAsync(ctx, b, pb.fn)
	defer func() { assert.NoError(t, stopB()) }()
	sampled := make(chan int)
	go func() {
		n := 0
		for {
			bLeads := pb.leads()
			if bLeads && pa.leads() {
				overlap.Store(true)
			}
			n++
			if bLeads {
				sampled <- n
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	for len(renewed) > 0 {
		<-renewed
	}
	receive(t, renewed, "a renews")
	_, err := admin.ForceRelease(ctx, "billing", f1)
	require.NoError(t, err)
	// a is cut off from the table from now on: it learns nothing, and
	// believes it leads until its local deadline.
	faults.Set(func(string) ddbtest.Action { return ddbtest.Reset })
	assert.Equal(t, f1+2, receive(t, pb.started, "b leads"))
	n := receive(t, sampled, "the sampler")
	assert.False(t, overlap.Load(), "b led while a still believed it led (%d samples)", n)
}
