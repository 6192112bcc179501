package ddblease_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fast are short timings for tests that wait for expiry in real time.
func fast(owner string) func(*ddblease.Options) {
	return func(o *ddblease.Options) {
		o.Owner = owner
		o.LeaseDuration = 1200 * time.Millisecond
		o.HeartbeatInterval = 300 * time.Millisecond
		o.RetryInterval = 50 * time.Millisecond
		o.MaxClockSkew = 100 * time.Millisecond
		o.CallTimeout = 250 * time.Millisecond
		o.DrainTimeout = 2 * time.Second
		o.Logger = quiet
	}
}

func newLease(t *testing.T, db ddblease.DynamoDBAPI, table, job string, opts ...func(*ddblease.Options)) *ddblease.Lease {
	t.Helper()
	l, err := ddblease.New(db, table, job, opts...)
	require.NoError(t, err)
	return l
}

func TestAcquireHeldResign(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	table := srv.NewTable(t)
	db := srv.Client(nil)
	a := newLease(t, db, table, "nightly", fast("a"))
	b := newLease(t, db, table, "nightly", fast("b"))

	fa, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), fa)
	assert.True(t, a.IsLeader())

	_, err = b.TryAcquire(ctx)
	require.ErrorIs(t, err, ddblease.ErrHeld)
	var held *ddblease.HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, "a", held.Owner)
	assert.Equal(t, int64(1), held.Fence)
	assert.Contains(t, err.Error(), `"a"`)
	assert.False(t, b.IsLeader())

	require.NoError(t, a.Resign(ctx))
	assert.False(t, a.IsLeader())

	fb, err := b.TryAcquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), fb)

	rec, err := b.Holder(ctx)
	require.NoError(t, err)
	assert.Equal(t, "b", rec.Owner)
	assert.Equal(t, int64(2), rec.Fence)
	_ = ddbtest.Pass
	_ = errors.New
}
