package ddblease_test

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An operator write refused by its condition is explained from the item
// the server returns with the failure: one UpdateItem, and a consistent
// GetItem only where the server returns no item (dynalite). What the
// refusal says is the same either way.
func TestAdminRefusalFromReturnedItem(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
	l := newLease(t, db, table, "billing", fast("a"))
	fence, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	admin := newAdmin(t, db, table)
	_, err = admin.Pause(ctx, "billing")
	require.NoError(t, err)
	// Does this server return the item with a failed UpdateItem condition?
	_, err = srv.Client(nil).UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: key("lease#billing"),
		UpdateExpression: aws.String("SET x = :x"), ConditionExpression: aws.String("attribute_not_exists(pk)"),
		ExpressionAttributeValues:           map[string]types.AttributeValue{":x": nAttr("1")},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	require.ErrorAs(t, err, &ccf)
	returned := len(ccf.Item) > 0

	for _, tc := range []struct {
		name  string
		reads int // consistent reads the call makes before its write
		call  func(t *testing.T)
	}{
		{"ForceRelease of a fence that is not current", 0, func(t *testing.T) {
			_, err := admin.ForceRelease(ctx, "billing", fence+5)
			var held *ddblease.HeldError
			require.ErrorAs(t, err, &held)
			assert.Equal(t, fence, held.Fence)
			assert.Equal(t, "a", held.Owner)
		}},
		{"RequestResign of a fence that is not current", 1, func(t *testing.T) {
			_, err := admin.RequestResign(ctx, "billing", fence+5)
			var held *ddblease.HeldError
			require.ErrorAs(t, err, &held)
			assert.Equal(t, fence, held.Fence)
		}},
		{"Pause of a paused job", 0, func(t *testing.T) {
			rec, err := admin.Pause(ctx, "billing")
			require.NoError(t, err)
			assert.True(t, rec.Control.Paused)
			assert.Equal(t, fence, rec.Fence)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := faults.Counts()
			tc.call(t)
			want := map[string]int{"UpdateItem": 1}
			if reads := tc.reads + map[bool]int{true: 0, false: 1}[returned]; reads > 0 {
				want["GetItem"] = reads
			}
			assert.Equal(t, want, diff(before, faults.Counts()))
		})
	}
}
