package ddblease_test

import (
	"context"
	"errors"
	"sync"
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

// Test 2 of the issue. A leader claims a slot and loses its lease mid-run
// (it is paused; another replica takes over). Its Finish and every guarded
// write it then attempts are refused. Under NeverRerun the new leader marks
// the run abandoned and does not run it; under Rerun it runs the slot again
// with its own fence, through RunSchedule.
func TestLeaderLosesLeaseMidRun(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	for _, policy := range []ddblease.RerunPolicy{ddblease.NeverRerun, ddblease.Rerun} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			ctx := withTimeout(t, 20*time.Second)
			table, db := tableAndClient(t)
			withPolicy := func(o *ddblease.JobOptions) { o.Rerun = policy }
			slot := time.Now().Add(-time.Second).Truncate(time.Second).UTC()
			state := "billing#nightly#state"
			record := "billing#nightly#" + slot.Format(time.RFC3339Nano)
			g, err := ddblease.NewGuard(db, table, "nightly")
			require.NoError(t, err)

			var runA *ddblease.JobRun
			a, b := deposedPair(t, db, db, table, "nightly", func(a *ddblease.Lease) {
				var err error
				runA, err = a.Claim(ctx, slot, withPolicy)
				require.NoError(t, err)
				assert.Equal(t, int64(1), runA.Fence())
				assert.Equal(t, "nightly#"+slot.Format(time.RFC3339Nano), runA.IdempotencyKey())
			})

			// The new leader marks the job's sink state with its fence as
			// it takes over (the pattern that makes Guard.Update refuse a
			// stale leader on items it has not written yet).
			_, err = g.Update(ctx, 2, &dynamodb.UpdateItemInput{
				TableName: aws.String(table), Key: key(state),
				UpdateExpression:          aws.String("SET tenure = :o"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":o": sAttr("b")},
			})
			require.NoError(t, err)

			switch policy {
			case ddblease.NeverRerun:
				_, err := b.Claim(ctx, slot, withPolicy)
				require.ErrorIs(t, err, ddblease.ErrSlotTaken)
				var taken *ddblease.SlotTakenError
				require.ErrorAs(t, err, &taken)
				assert.True(t, taken.Abandoned)
				assert.Equal(t, ddblease.RunAbandoned, taken.Run.Status)
				assert.Equal(t, int64(1), taken.Run.Fence)
				assert.Equal(t, int64(2), taken.Run.AbandonedBy)
			case ddblease.Rerun:
				rctx, cancel := context.WithCancel(ctx)
				defer cancel()
				fences := make(chan int64, 4)
				done := make(chan error, 1)
				go func() {
					done <- b.RunSchedule(rctx, oneSlot(slot), func(ctx context.Context, run *ddblease.JobRun) error {
						fences <- run.Fence()
						_, err := g.Put(ctx, run.Fence(), &dynamodb.PutItemInput{
							TableName: aws.String(table),
							Item:      withKey(record, map[string]types.AttributeValue{"amount": nAttr("42"), "by": sAttr("b")}),
						})
						return err
					}, withPolicy)
				}()
				// The schedule has one slot: RunSchedule returns once it ran.
				select {
				case err := <-done:
					require.NoError(t, err)
				case <-ctx.Done():
					t.Fatal("RunSchedule did not return")
				}
				require.Len(t, fences, 1)
				assert.Equal(t, int64(2), <-fences, "the new leader runs the slot with its own fence")
			}

			// The paused leader wakes up, still believing it leads.
			require.True(t, a.IsLeader())
			staleFence(t, runA.Finish(ctx, nil), 1, 2)
			staleFence(t, g.Check(ctx, runA.Fence()), 1, 2)
			called := false
			staleFence(t, g.Do(ctx, runA.Fence(), func(context.Context, int64) error { called = true; return nil }), 1, 2)
			assert.False(t, called)
			_, err = g.Update(ctx, runA.Fence(), &dynamodb.UpdateItemInput{
				TableName: aws.String(table), Key: key(state),
				UpdateExpression:          aws.String("SET tenure = :o"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":o": sAttr("a")},
			})
			staleFence(t, err, 1, 2)
			if policy == ddblease.Rerun {
				// The record the new leader wrote for the slot carries its
				// fence; the stale leader's write of it is refused.
				_, err = g.Put(ctx, runA.Fence(), &dynamodb.PutItemInput{
					TableName: aws.String(table),
					Item:      withKey(record, map[string]types.AttributeValue{"amount": nAttr("42"), "by": sAttr("a")}),
				})
				staleFence(t, err, 1, 2)
				assert.Equal(t, sAttr("b"), getRaw(t, db, table, record)["by"])
			}
			txItems := []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table),
				Item: withKey("billing#nightly#tx-a", map[string]types.AttributeValue{"amount": nAttr("42")})}}}
			if caps.Transactions {
				staleFence(t, g.TransactWrite(ctx, runA.Fence(), txItems), 1, 2)
				staleFence(t, runA.Commit(ctx, txItems), 1, 2)
				assert.Empty(t, getRaw(t, db, table, "billing#nightly#tx-a"), "a refused transaction writes nothing")
			} else {
				require.ErrorIs(t, g.TransactWrite(ctx, runA.Fence(), txItems), ddblease.ErrTransactionsUnsupported)
				t.Logf("server %s lacks TransactWriteItems: transactional forms not exercised", srv.Name)
			}

			runs, err := b.ListRuns(ctx, oneSlot(slot), slot, slot)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			r := runs[0]
			assert.Equal(t, slot, r.Slot)
			switch policy {
			case ddblease.NeverRerun:
				assert.Equal(t, ddblease.RunAbandoned, r.Status)
				assert.Equal(t, int64(1), r.Fence)
				assert.Equal(t, "a", r.Owner)
				assert.Equal(t, int64(2), r.AbandonedBy)
				assert.Equal(t, 1, r.Claims)
			case ddblease.Rerun:
				assert.Equal(t, ddblease.RunSucceeded, r.Status)
				assert.Equal(t, int64(2), r.Fence)
				assert.Equal(t, "b", r.Owner)
				assert.Equal(t, 2, r.Claims)
			}
			assert.False(t, r.FinishedAt.IsZero())
		})
	}
}

// Claim and Finish each make exactly one request, and recognise an SDK
// retry of a write whose first attempt was applied (its response lost).
func TestClaimFinishRequestsAndLostResponses(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
	l := newLease(t, db, table, "sweeper", fast("a"), slowLease)
	_, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	claimOp := "TransactWriteItems"
	if !caps.Transactions {
		claimOp = "UpdateItem"
		// The first claim of the handle finds out that transactions are
		// not supported: two requests, once.
		before := faults.Counts()
		run, err := l.Claim(ctx, time.Unix(1000, 0))
		require.NoError(t, err)
		after := faults.Counts()
		assert.Equal(t, 1, after["TransactWriteItems"]-before["TransactWriteItems"])
		assert.Equal(t, 1, after["UpdateItem"]-before["UpdateItem"])
		require.NoError(t, run.Finish(ctx, nil))
	}
	base := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)

	t.Run("one request each", func(t *testing.T) {
		before := faults.Counts()
		run, err := l.Claim(ctx, base)
		require.NoError(t, err)
		mid := faults.Counts()
		require.NoError(t, run.Finish(ctx, errors.New("card declined")))
		after := faults.Counts()
		assert.Equal(t, 1, total(mid)-total(before), "Claim: %v", diff(before, mid))
		assert.Equal(t, 1, mid[claimOp]-before[claimOp])
		// A failed run's Finish: the run item, then the lease item's
		// record of the job's last failure.
		assert.Equal(t, 2, total(after)-total(mid), "Finish: %v", diff(mid, after))
		assert.Equal(t, 2, after["UpdateItem"]-mid["UpdateItem"])
		require.ErrorIs(t, run.Finish(ctx, nil), ddblease.ErrInvalid, "a run finishes once")

		runs, err := l.ListRuns(ctx, ddblease.Every(time.Hour), base, base)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		assert.Equal(t, ddblease.RunFailed, runs[0].Status)
		assert.Equal(t, "card declined", runs[0].Error)
		assert.Equal(t, "a", runs[0].Owner)
		assert.WithinDuration(t, time.Now().Add(ddblease.DefaultRetention), runs[0].ExpiresAt, time.Hour)

		_, err = l.Claim(ctx, base)
		require.ErrorIs(t, err, ddblease.ErrSlotTaken, "a finished slot is not claimed again")
	})

	t.Run("lost responses", func(t *testing.T) {
		slot := base.Add(time.Hour)
		drop := func(op string) {
			var once sync.Once
			faults.Set(func(o string) ddbtest.Action {
				act := ddbtest.Pass
				if o == op {
					once.Do(func() { act = ddbtest.DropResponse })
				}
				return act
			})
		}
		drop(claimOp)
		run, err := l.Claim(ctx, slot)
		require.NoError(t, err, "the retried claim finds its own token")
		drop("UpdateItem")
		require.NoError(t, run.Finish(ctx, nil), "the retried finish finds its own outcome")
		faults.Set(nil)
		runs, err := l.ListRuns(ctx, ddblease.Every(time.Hour), slot, slot)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		assert.Equal(t, ddblease.RunSucceeded, runs[0].Status)
		assert.Equal(t, 1, runs[0].Claims)
	})
}

// A deposed leader that still believes it leads cannot claim where the
// server has transactions: the claim checks the lease item.
func TestClaimChecksLeaseItem(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	a, _ := deposedPair(t, db, db, table, "sweeper", nil)
	_, err := a.Claim(ctx, time.Unix(3600, 0))
	if !caps.Transactions {
		require.NoError(t, err, "without transactions the claim rests on the local tenure check")
		srv.Require(t, false, "TransactWriteItems")
	}
	require.ErrorIs(t, err, ddblease.ErrLost)
	assert.Contains(t, err.Error(), `"b"`)
	assert.False(t, a.IsLeader(), "the failed check ends the tenure")
	_, err = a.Claim(ctx, time.Unix(7200, 0))
	require.ErrorIs(t, err, ddblease.ErrNotLeader)
	_, err = a.Claim(ctx, time.Unix(7200, 0), func(o *ddblease.JobOptions) { o.NoTransactions = true })
	require.ErrorIs(t, err, ddblease.ErrNotLeader)
}

// A claim refused whose run item cannot then be read to tell why returns
// the read's failure, a transient error to try again (RunSchedule does),
// not the refusal's ConditionalCheckFailedException, which reads as final:
// RunSchedule returned it, and the replica stopped. Tried again once the
// reads work, the claim finds the slot taken. (A server with transactions
// answers a refused claim with the run item, and nothing is read: the
// case is a server's without, dynalite's in CI.)
func TestClaimRefusedUnreadIsTransient(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
	l := newLease(t, db, table, "sweeper", fast("a"), slowLease)
	_, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	slot := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	run, err := l.Claim(ctx, slot)
	require.NoError(t, err)
	require.NoError(t, run.Finish(ctx, nil))

	faults.Set(func(op string) ddbtest.Action {
		if op == "GetItem" {
			return ddbtest.Reset
		}
		return ddbtest.Pass
	})
	before := faults.Count("GetItem")
	_, err = l.Claim(ctx, slot)
	faults.Clear()
	t.Logf("GetItem sent: %d; err: %v", faults.Count("GetItem")-before, err)
	require.Error(t, err)
	var ccf *types.ConditionalCheckFailedException
	assert.False(t, errors.As(err, &ccf), "a refusal whose reason was not read is not reported as the refusal: %v", err)
	_, err = l.Claim(ctx, slot)
	require.ErrorIs(t, err, ddblease.ErrSlotTaken)
}
