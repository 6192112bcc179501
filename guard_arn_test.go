package ddblease_test

import (
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tableARN is the ARN of the table name, which DynamoDB accepts wherever
// a TableName goes.
func tableARN(name string) string {
	return "arn:aws:dynamodb:eu-west-1:123456789012:table/" + name
}

// The refusal of guarded writes to the library's own items holds whatever
// form the TableName takes: a write of a lease or job-run item naming the
// lease table by its ARN is refused with the error the plain name gets,
// by every guarded form (Put, Update, and the Put, Update and Delete
// actions of TransactWrite and of Commit), before any request. The same
// key in a table of another name is written.
func TestGuardRefusesLibraryItemsByTableARN(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, faults, db := tableWithFaults(t)
	l := newLease(t, db, table, "billing", fast("a"), slowLease)
	fence, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	slot := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	run, err := l.Claim(ctx, slot)
	require.NoError(t, err)
	// claim gives Commit a run of its own, for a commit that may apply.
	n := 0
	claim := func() {
		n++
		r, err := l.Claim(ctx, slot.Add(time.Duration(n)*time.Hour))
		require.NoError(t, err)
		run = r
	}
	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)

	upd := func(tbl, pk string) *dynamodb.UpdateItemInput {
		return &dynamodb.UpdateItemInput{TableName: aws.String(tbl), Key: key(pk), UpdateExpression: aws.String("SET v = :v"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":v": sAttr("x")}}
	}
	forms := map[string]func(tbl, pk string) error{
		"Put": func(tbl, pk string) error {
			_, err := g.Put(ctx, fence, &dynamodb.PutItemInput{TableName: aws.String(tbl), Item: withKey(pk, sink("", "v", "x"))})
			return err
		},
		"Update": func(tbl, pk string) error {
			_, err := g.Update(ctx, fence, upd(tbl, pk))
			return err
		},
	}
	actions := map[string]func(tbl, pk string) types.TransactWriteItem{
		"Put": func(tbl, pk string) types.TransactWriteItem {
			return types.TransactWriteItem{Put: &types.Put{TableName: aws.String(tbl), Item: withKey(pk, sink("", "v", "x"))}}
		},
		"Update": func(tbl, pk string) types.TransactWriteItem {
			u := upd(tbl, pk)
			return types.TransactWriteItem{Update: &types.Update{TableName: u.TableName, Key: u.Key,
				UpdateExpression: u.UpdateExpression, ExpressionAttributeValues: u.ExpressionAttributeValues}}
		},
		"Delete": func(tbl, pk string) types.TransactWriteItem {
			return types.TransactWriteItem{Delete: &types.Delete{TableName: aws.String(tbl), Key: key(pk)}}
		},
	}
	for name, act := range actions {
		forms["TransactWrite "+name] = func(tbl, pk string) error {
			return g.TransactWrite(ctx, fence, []types.TransactWriteItem{actions["Put"](tbl, "sink#ok"), act(tbl, pk)})
		}
		forms["Commit "+name] = func(tbl, pk string) error {
			return run.Commit(ctx, []types.TransactWriteItem{actions["Put"](tbl, "sink#ok"), act(tbl, pk)})
		}
	}

	before := total(faults.Counts())
	for _, pk := range []string{"lease#ledger", "lease#billing", "jobrun#ledger#2026-11-30T02:00:00Z", "jobrun#billing#2026-11-30T02:00:00Z"} {
		for name, write := range forms {
			plain := write(table, pk)
			require.ErrorIs(t, plain, ddblease.ErrInvalid, "%s of %s by name", name, pk)
			byARN := write(tableARN(table), pk)
			require.ErrorIs(t, byARN, ddblease.ErrInvalid, "%s of %s by ARN", name, pk)
			assert.Equal(t, plain.Error(), byARN.Error(), "%s of %s: the ARN gets the plain name's refusal", name, pk)
		}
	}
	// A check of the job's own lease item inside TransactWrite is refused
	// too, by name or by ARN: the guard's own check reads it.
	check := func(tbl string) error {
		return g.TransactWrite(ctx, fence, []types.TransactWriteItem{actions["Put"](table, "sink#ok"),
			{ConditionCheck: &types.ConditionCheck{TableName: aws.String(tbl), Key: key("lease#billing"),
				ConditionExpression: aws.String("attribute_exists(pk)")}}})
	}
	require.ErrorIs(t, check(table), ddblease.ErrInvalid)
	require.ErrorIs(t, check(tableARN(table)), ddblease.ErrInvalid)
	assert.Equal(t, check(table).Error(), check(tableARN(table)).Error())
	assert.Contains(t, check(tableARN(table)).Error(), "item 1 acts on the job's lease item")
	assert.Equal(t, before, total(faults.Counts()), "refused before any request")
	assert.Equal(t, nAttr("1"), rawLease(t, db, table, "billing")["fence"], "the lease item is untouched")

	// Another table holds no item of the library's: the same keys are
	// written there, by its plain name. Its ARN is not refused as the
	// lease table's either (whether the test server takes an ARN as a
	// TableName is its own affair).
	other := srv.NewTable(t)
	txns := srv.Caps(t).Transactions
	for name, write := range forms {
		if name != "Put" && name != "Update" && !txns {
			continue // the server has no transactions
		}
		claim()
		pk := "lease#ledger" // Put
		switch {
		case strings.HasSuffix(name, "Update"):
			pk = "jobrun#ledger#2026-11-30T02:00:00Z"
		case strings.HasSuffix(name, "Delete"):
			pk = "lease#payroll"
		}
		require.NoError(t, write(other, pk), "%s of %s in another table", name, pk)
		claim()
		if err := write(tableARN(other), pk); err != nil {
			assert.NotErrorIs(t, err, ddblease.ErrInvalid, "%s by another table's ARN", name)
			assert.NotContains(t, err.Error(), "which the library keeps", "%s by another table's ARN", name)
		}
	}
	assert.Equal(t, sAttr("x"), getRaw(t, db, other, "lease#ledger")["v"], "written in the other table")
	assert.Equal(t, sAttr("x"), getRaw(t, db, other, "jobrun#ledger#2026-11-30T02:00:00Z")["v"], "written in the other table")

	// A malformed ARN is no name of the lease table: it is passed on as
	// it is, for DynamoDB to refuse, and nothing panics.
	for _, bad := range []string{"arn:", "arn:aws:dynamodb", "arn:aws:dynamodb:eu-west-1:123456789012:table/",
		"arn:aws:dynamodb:eu-west-1:123456789012:table", "arn:aws:s3:::" + table, "arn::dynamodb:::table/" + table + "x"} {
		for name, write := range forms {
			claim()
			err := write(bad, "lease#ledger")
			require.Error(t, err, "%s to %q", name, bad)
			assert.NotContains(t, err.Error(), "which the library keeps", "%s to %q", name, bad)
		}
	}
}
