package ddbleaserobfig_test

import (
	"context"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleaserobfig"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWrapperDrainLossAtDeadline: a firing in flight during a shutdown's
// drain keeps its context only while the tenure lasts. When the
// heartbeats fail during the drain, the run's context ends at the
// tenure's local deadline (cause ErrLost), long before DrainTimeout.
func TestWrapperDrainLossAtDeadline(t *testing.T) {
	table := srv.NewTable(t)
	faults := ddbleasetest.NewFaults()
	observe, draining := drainingObserver()
	w, err := ddbleaserobfig.New(srv.Client(faults.Wrap), table, fast("a", nil), observe,
		func(o *ddblease.Options) { o.DrainTimeout = time.Minute })
	require.NoError(t, err)
	started := make(chan struct{})
	var cause error
	var leader bool
	j, err := w.Job("cut", cron.Every(time.Second), func(ctx context.Context, run *ddblease.JobRun) error {
		close(started)
		<-ctx.Done()
		cause = context.Cause(ctx)
		return ctx.Err()
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, w.Start(ctx))
	l := w.Lease("cut")
	waitUntil(t, func() bool { return l.IsLeader() })
	done := make(chan struct{})
	go func() { j.Run(); leader = l.IsLeader(); close(done) }()
	<-started
	cancel()
	<-draining
	faults.Set(func(op string) ddbleasetest.Action {
		if op == "UpdateItem" || op == "TransactWriteItems" {
			return ddbleasetest.ServerError
		}
		return ddbleasetest.Pass
	})
	<-done
	require.ErrorIs(t, cause, ddblease.ErrLost, "the run's context ends with the tenure")
	assert.NotErrorIs(t, cause, ddblease.ErrDrainTimeout)
	assert.False(t, leader)
	_ = w.Wait()
}
