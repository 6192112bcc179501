package ddblease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
