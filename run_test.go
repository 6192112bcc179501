package ddblease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Another owner takes the lease over (here an operator's write with a
// higher fence): the leader's context is cancelled with ErrLost at its next
// heartbeat, and Run campaigns again.
func TestRunCancelsOnTakeover(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"))
	rec := newTenureLog()
	stop := runAsync(ctx, a, rec.fn)
	assert.Equal(t, int64(1), receive(t, rec.started, "first tenure"))

	_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                aws.String(table),
		Key:                      key("lease#job"),
		UpdateExpression:         aws.String("SET #o = :o, fence = fence + :one, rv = :rv, expiresAt = :exp"),
		ExpressionAttributeNames: map[string]string{"#o": "owner"},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":o": &types.AttributeValueMemberS{Value: "intruder"}, ":one": &types.AttributeValueMemberN{Value: "1"},
			":rv":  &types.AttributeValueMemberS{Value: "x"},
			":exp": &types.AttributeValueMemberN{Value: "1"}, // already expired: a may lead again
		},
	})
	require.NoError(t, err)
	assert.Equal(t, int64(3), receive(t, rec.started, "second tenure"), "Run campaigned again after the loss")
	assert.ErrorIs(t, rec.cause(0), ddblease.ErrLost)
	assert.ErrorContains(t, rec.cause(0), `"intruder"`)
	assert.NoError(t, stop())
}

// Heartbeats that keep failing end the tenure at the local deadline, before
// the lease item expires.
func TestRunCancelsAtDeadline(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	a := newLease(t, srv.Client(faults.Wrap), table, "job", fast("a"))
	cancelled := make(chan time.Time, 1)
	var fenceSeen atomic.Int64
	var deadline time.Time // the tenure's last local deadline
	again := make(chan struct{}, 1)
	stop := runAsync(ctx, a, func(ctx context.Context, fence int64) error {
		if !fenceSeen.CompareAndSwap(0, fence) {
			select { // a later tenure: its fn returns at once, and Run with it
			case again <- struct{}{}:
			default:
			}
			return nil
		}
		faults.Set(every("UpdateItem", ddbtest.Reset))
		deadline = a.State().Deadline
		<-ctx.Done()
		cancelled <- time.Now()
		assert.ErrorIs(t, context.Cause(ctx), ddblease.ErrLost)
		assert.ErrorContains(t, context.Cause(ctx), "deadline")
		return nil
	})
	at := receive(t, cancelled, "leader context cancelled")
	assert.False(t, a.IsLeader())
	rec, err := a.Holder(ctx)
	require.NoError(t, err)
	// The belief ends a tenth of the lease before the recorded expiry; the
	// context is cancelled at the deadline (give or take scheduling).
	assert.Equal(t, 200*time.Millisecond, rec.ExpiresAt.Sub(deadline).Round(10*time.Millisecond))
	assert.False(t, at.Before(deadline), "leader context ended at %v, before its deadline %v", at, deadline)
	assert.Greater(t, faults.Count("UpdateItem"), 2, "heartbeats were retried")
	faults.Set(nil)
	// Once the server answers again, the campaign takes the lease back (its
	// own), and Run returns nil when fn does.
	receive(t, again, "a later tenure")
	assert.NoError(t, stop())
}

// Cancelling Run's context cancels the leader's context, marks the lease as
// draining while fn returns, resigns once it has, and only then does Run
// return; a standby takes over at once with the next fence.
func TestRunDrainsThenResigns(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"))
	b := newLease(t, db, table, "job", fast("b"))
	started := make(chan struct{})
	draining := make(chan struct{})
	var fnReturned atomic.Bool
	stop := runAsync(ctx, a, func(ctx context.Context, fence int64) error {
		close(started)
		<-ctx.Done()
		assert.ErrorIs(t, context.Cause(ctx), context.Canceled)
		<-draining // drain work while the test looks at the item
		time.Sleep(300 * time.Millisecond)
		fnReturned.Store(true)
		return ctx.Err()
	})
	receive(t, started, "leadership")
	runDone := make(chan error, 1)
	go func() { runDone <- stop() }()
	require.Eventually(t, func() bool {
		rec, err := a.Holder(ctx)
		return err == nil && rec.Draining
	}, 5*time.Second, 10*time.Millisecond, "lease marked as draining")
	assert.True(t, a.IsLeader(), "the lease is kept alive while fn drains")
	close(draining)
	require.NoError(t, receive(t, runDone, "Run to return"))
	assert.True(t, fnReturned.Load(), "Run returned before fn")
	assert.False(t, a.IsLeader())

	rec, err := a.Holder(ctx)
	require.NoError(t, err)
	assert.Equal(t, "a", rec.Owner)
	assert.Equal(t, int64(1), rec.Fence, "resigning keeps the fence")
	assert.True(t, rec.ExpiresAt.IsZero())
	assert.False(t, rec.Draining)
	fence, err := b.TryAcquire(ctx)
	require.NoError(t, err, "a standby takes over at once after the resignation")
	assert.Equal(t, int64(2), fence)
}

// A leader function that overstays DrainTimeout: the lease is not kept
// alive past it (a standby takes over while fn still runs), Run still waits
// for fn and reports ErrDrainTimeout.
func TestRunDrainTimeout(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	short := func(o *ddblease.Options) { o.DrainTimeout = 200 * time.Millisecond }
	a := newLease(t, db, table, "job", fast("a"), short)
	b := newLease(t, db, table, "job", fast("b"))
	started := make(chan struct{})
	release := make(chan struct{})
	stop := runAsync(ctx, a, func(ctx context.Context, fence int64) error {
		close(started)
		<-release // ignores its context
		return nil
	})
	receive(t, started, "leadership")
	runDone := make(chan error, 1)
	go func() { runDone <- stop() }()
	fence, err := b.Acquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), fence)
	select {
	case err := <-runDone:
		t.Fatalf("Run returned while fn was running: %v", err)
	default:
	}
	close(release)
	err = receive(t, runDone, "Run to return")
	assert.ErrorIs(t, err, ddblease.ErrDrainTimeout)
	assert.NotErrorIs(t, err, ddblease.ErrNotResigned, "b leading is as good as a resignation")
	rec, err := b.Holder(ctx)
	require.NoError(t, err)
	assert.Equal(t, "b", rec.Owner, "the late resignation changed nothing")
	assert.Equal(t, int64(2), rec.Fence)
}

// fn returning on its own ends Run: nil after a resignation, or fn's error.
func TestRunReturnsFnResult(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 10*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"))
	require.NoError(t, a.Run(ctx, func(context.Context, int64) error { return nil }))
	boom := errors.New("boom")
	err := a.Run(ctx, func(context.Context, int64) error { return boom })
	assert.ErrorIs(t, err, boom)
	rec, err := a.Holder(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), rec.Fence)
	assert.True(t, rec.ExpiresAt.IsZero(), "resigned after fn returned")
	assert.False(t, a.IsLeader())
	assert.ErrorIs(t, a.Run(ctx, nil), ddblease.ErrInvalid)
}

// A context that ends while campaigning makes Run return nil without
// calling fn.
func TestRunStopsWhileStandby(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 10*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"))
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	b := newLease(t, db, table, "job", fast("b"))
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	called := false
	require.NoError(t, b.Run(short, func(context.Context, int64) error { called = true; return nil }))
	assert.False(t, called)
}
