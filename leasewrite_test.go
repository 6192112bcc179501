package ddblease_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A write applied by the server whose response is lost is recognised as
// ours, both when the SDK retries it (and gets a conditional failure for its
// own success) and when it does not retry.
func TestAmbiguousOutcome(t *testing.T) {
	t.Parallel()
	for _, retries := range []bool{true, false} {
		for _, op := range []string{"acquire", "heartbeat"} {
			name := op + "/sdk-retry"
			if !retries {
				name = op + "/no-retry"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := withTimeout(t, 10*time.Second)
				table := srv.NewTable(t)
				faults := ddbtest.NewFaults(nil)
				var db ddblease.DynamoDBAPI = srv.Client(faults.Wrap)
				if !retries {
					db = noRetry{db.(*dynamodb.Client)}
				}
				a := newLease(t, db, table, "job", fast("a"))
				dropNext := func() {
					var once atomic.Bool
					faults.Set(func(o string) ddbtest.Action {
						if o == "UpdateItem" && once.CompareAndSwap(false, true) {
							return ddbtest.DropResponse
						}
						return ddbtest.Pass
					})
				}
				if op == "acquire" {
					dropNext()
				}
				fence, err := a.TryAcquire(ctx)
				require.NoError(t, err)
				assert.Equal(t, int64(1), fence)
				if op == "heartbeat" {
					dropNext()
					require.NoError(t, a.Heartbeat(ctx))
				}
				assert.True(t, a.IsLeader())
				rec, err := a.Holder(ctx)
				require.NoError(t, err)
				assert.Equal(t, "a", rec.Owner)
				assert.Equal(t, int64(1), rec.Fence)
				want := 1 + listing
				if op == "heartbeat" {
					want++
				}
				// Lease writes are sent once, the SDK's retries turned off
				// for them: the read-back resolves the outcome.
				assert.Equal(t, want, faults.Count("UpdateItem"))
				// The tenure goes on normally.
				require.NoError(t, a.Heartbeat(ctx))
				require.NoError(t, a.Resign(ctx))
			})
		}
	}
}

// noRetry makes every call a single attempt.
type noRetry struct{ *dynamodb.Client }

func (c noRetry) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, fns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return c.Client.UpdateItem(ctx, in, append(fns, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })...)
}

// A write of ours that the client gave up on (a timeout, a cancelled
// context) and that reaches the server late can never undo a newer write:
// neither a resignation nor a newer heartbeat.
func TestLateWriteCannotUndoNewerOne(t *testing.T) {
	t.Parallel()
	for _, newer := range []string{"resign", "heartbeat"} {
		t.Run(newer, func(t *testing.T) {
			t.Parallel()
			ctx := withTimeout(t, 10*time.Second)
			table := srv.NewTable(t)
			faults := ddbtest.NewFaults(nil)
			a := newLease(t, noRetry{srv.Client(faults.Wrap)}, table, "job", fast("a"))
			b := newLease(t, srv.Client(nil), table, "job", fast("b"))
			_, err := a.TryAcquire(ctx)
			require.NoError(t, err)

			var once atomic.Bool
			faults.Set(func(op string) ddbtest.Action {
				if op == "UpdateItem" && once.CompareAndSwap(false, true) {
					return ddbtest.Hold
				}
				return ddbtest.Pass
			})
			require.Error(t, a.Heartbeat(ctx), "the held heartbeat's outcome is unknown")
			require.True(t, a.IsLeader(), "an unknown outcome leaves the tenure open until its deadline")

			if newer == "resign" {
				require.NoError(t, a.Resign(ctx))
			} else {
				require.NoError(t, a.Heartbeat(ctx))
			}
			before := rawLease(t, srv.Client(nil), table, "job")
			assert.Equal(t, []int{400}, faults.Release(), "the late heartbeat fails its condition")
			assert.Equal(t, before, rawLease(t, srv.Client(nil), table, "job"), "the late heartbeat changed the item")
			if newer == "resign" {
				fence, err := b.TryAcquire(ctx)
				require.NoError(t, err, "the resignation stands")
				assert.Equal(t, int64(2), fence)
			} else {
				require.NoError(t, a.Heartbeat(ctx), "the tenure goes on")
			}
		})
	}
}

// Regression (fault suite, seed 13): a heartbeat that landed but whose
// answers were all lost, and which could not be read back either, is kept
// in doubt; the resignation that follows still succeeds.
func TestWriteInDoubtWhenReadBackFails(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 10*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	a := newLease(t, srv.Client(faults.Wrap), table, "job", fast("a"))
	b := newLease(t, srv.Client(nil), table, "job", fast("b"))
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	faults.Set(func(op string) ddbtest.Action {
		switch op {
		case "UpdateItem":
			return ddbtest.DropResponse
		case "GetItem":
			return ddbtest.Reset
		}
		return ddbtest.Pass
	})
	require.Error(t, a.Heartbeat(ctx))
	faults.Set(nil)
	require.NoError(t, a.Resign(ctx))
	fence, err := b.TryAcquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), fence)
}

// Regression (fault suite, seed 1117): a resigning holder stops believing
// it leads before its resignation can land, since a standby may lead the
// moment it does, before the answer comes back.
func TestResignEndsBeliefBeforeTheWrite(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 10*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	a := newLease(t, srv.Client(faults.Wrap), table, "job", fast("a"))
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	var leaderDuringWrite atomic.Int32
	faults.Set(func(op string) ddbtest.Action {
		if op == "UpdateItem" {
			if a.IsLeader() {
				leaderDuringWrite.Store(1)
			} else {
				leaderDuringWrite.Store(2)
			}
		}
		return ddbtest.Pass
	})
	require.NoError(t, a.Resign(ctx))
	assert.Equal(t, int32(2), leaderDuringWrite.Load(), "IsLeader was true while the resignation was on its way")
}

// lateAnswers forwards every request and answers it after delay; the
// answer to an UpdateItem is lost.
type lateAnswers struct {
	base  http.RoundTripper
	delay time.Duration
}

func (l lateAnswers) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(r)
	time.Sleep(l.delay)
	if err == nil && ddbtest.Op(r) == "UpdateItem" {
		_ = resp.Body.Close()
		return nil, errors.New("read tcp: connection reset by peer (injected)")
	}
	return resp, err
}

// Regression (fault suite, seed 2129): an acquisition whose success is
// learned only after its tenure's local deadline is no tenure at all.
func TestAcquisitionConfirmedTooLate(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 10*time.Second)
	table := srv.NewTable(t)
	slow := func(rt http.RoundTripper) http.RoundTripper { return lateAnswers{rt, 910 * time.Millisecond} }
	a := newLease(t, noRetry{srv.Client(slow)}, table, "job", func(o *ddblease.Options) {
		o.Owner, o.Logger, o.MaxClockSkew = "a", quiet, 50*time.Millisecond
		// Each answer comes within CallTimeout, both together after the
		// deadline (0.9 × 2 s).
		o.LeaseDuration, o.HeartbeatInterval, o.CallTimeout = 2*time.Second, 999*time.Millisecond, 998*time.Millisecond
	})
	_, err := a.TryAcquire(ctx)
	require.ErrorIs(t, err, ddblease.ErrLost)
	assert.ErrorContains(t, err, "after its local deadline")
	assert.False(t, a.IsLeader())
	rec, err := a.Holder(ctx)
	require.NoError(t, err)
	assert.Equal(t, "a", rec.Owner, "the write did land")
}
