package ddblease

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Placeholders with which Put and Update refer to the fence high-water mark
// and the write token. Every placeholder starting with #ddblease or
// :ddblease is reserved.
const (
	fenceName      = "#ddbleaseFence"
	fenceValue     = ":ddbleaseFence"
	tokenName      = "#ddbleaseToken"
	tokenValue     = ":ddbleaseToken"
	reservedPrefix = "ddblease"
)

// Put writes in.Item, setting its fence attribute (GuardOptions.
// FenceAttribute) to fence and its token attribute (GuardOptions.
// TokenAttribute) to a random token of this write, on condition that the
// item stored under that key has no fence attribute or one not above fence
// — and that in's own ConditionExpression, if any, holds.
//
// What it refuses: a fence lower than the highest fence that wrote THIS
// item, by any form (TransactWrite's and Commit's actions keep the same
// mark), with a *StaleFenceError whose Current is that high-water mark. It
// does not refuse a stale leader writing an item that no newer fence has
// written: under NeverRerun the newer tenure abandons the slot and never
// writes its item, so a stale leader's Put of that slot's item is
// accepted. Key the items so that every tenure writes the same ones, or
// use TransactWrite (or JobRun.Commit), which refuse any stale fence. This
// is the storage-side check of Kleppmann's "How to do distributed
// locking", and needs no transaction.
//
// in's ConditionExpression is ANDed with the guard's conditions and cannot
// weaken them: one whose parentheses do not balance, or that uses a
// placeholder starting with #ddblease or :ddblease, is refused with an
// error wrapping ErrInvalid before any request. in.Item must not hold the
// token attribute, nor be a lease or job-run item of the lease table. in is
// not modified.
//
// A write is applied at most once, and a write that landed is reported as
// landed: the condition also refuses an item that already carries this
// write's token, so an SDK retry of an attempt that landed fails, and the
// token found on the item then shows that the write was applied. The
// output is then an empty PutItemOutput: the item the write replaced, and
// the consumed capacity, are not known. When the outcome is unknown (the
// answers were lost), the item is read back the same way.
//
// A write refused because a transaction is using the item
// (TransactionConflictException) certainly did not apply, and is sent
// again as TransactWrite's are, until CallTimeout has passed.
//
// One PutItem request; when it fails and the server returned no item with
// the failure (dynalite), or no answer came, a consistent GetItem (and the
// first time for a table a DescribeTable) to tell a landed write, a stale
// fence and in's own condition apart.
func (g *Guard) Put(ctx context.Context, fence int64, in *dynamodb.PutItemInput) (*dynamodb.PutItemOutput, error) {
	if fence < 1 {
		return nil, invalid("Put: fence %d is below 1", fence)
	}
	if in == nil || aws.ToString(in.TableName) == "" || len(in.Item) == 0 {
		return nil, invalid("Put: the input needs a table name and an item")
	}
	if keptItem(in.TableName, in.Item, g.table) {
		return nil, invalid("Put: the item is a lease or job-run item, which the library keeps")
	}
	tok := randomID(16)
	p := *in
	var err error
	if p.Item, err = g.mark.item("Put", in.Item, fence, tok); err != nil {
		return nil, err
	}
	if p.ConditionExpression, p.ExpressionAttributeNames, p.ExpressionAttributeValues, err =
		g.mark.condition("Put", in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues, fence, tok); err != nil {
		return nil, err
	}
	p.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	var out *dynamodb.PutItemOutput
	if _, err := g.write(ctx, "Put", fence, tok, types.TransactWriteItem{Put: &types.Put{TableName: in.TableName, Item: in.Item}}, func(ctx context.Context) (err error) {
		out, err = g.db.PutItem(ctx, &p)
		return err
	}); err != nil || out != nil {
		return out, err
	}
	return &dynamodb.PutItemOutput{}, nil
}

// Update applies in, adding to its update expression a SET of the item's
// fence attribute (GuardOptions.FenceAttribute) to fence and of its token
// attribute (GuardOptions.TokenAttribute) to a random token of this write,
// on the conditions Put uses: the stored item has no fence attribute or one
// not above fence, it does not carry this write's token already, and in's
// own ConditionExpression holds (checked as Put checks it). It refuses
// what Put refuses, and only that: a fence lower than the highest fence
// that wrote this item. in's expressions must not use placeholders
// starting with #ddblease or :ddblease, and its UpdateExpression must not
// refer to the fence or token attribute at the top level (by name or
// through a placeholder), which could lower or remove the mark; either is
// an error wrapping ErrInvalid, before any request, as is a key of a lease
// or job-run item of the lease table. in is not modified.
//
// A write that landed is reported as landed, as with Put; the output then
// holds, when in.ReturnValues is ALL_NEW, the item as read back (which
// carries this write's token), and otherwise nothing. Conflicts with
// transactions are retried as Put's are. One UpdateItem
// request, and a consistent GetItem when it fails and the server returned
// no item with the failure, or no answer came.
func (g *Guard) Update(ctx context.Context, fence int64, in *dynamodb.UpdateItemInput) (*dynamodb.UpdateItemOutput, error) {
	if fence < 1 {
		return nil, invalid("Update: fence %d is below 1", fence)
	}
	if in == nil || aws.ToString(in.TableName) == "" || len(in.Key) == 0 {
		return nil, invalid("Update: the input needs a table name and a key")
	}
	if keptItem(in.TableName, in.Key, g.table) {
		return nil, invalid("Update: the item is a lease or job-run item, which the library keeps")
	}
	tok := randomID(16)
	u := *in
	var err error
	if u.UpdateExpression, err = g.mark.update("Update", in.UpdateExpression, in.ExpressionAttributeNames); err != nil {
		return nil, err
	}
	if u.ConditionExpression, u.ExpressionAttributeNames, u.ExpressionAttributeValues, err =
		g.mark.condition("Update", in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues, fence, tok); err != nil {
		return nil, err
	}
	u.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	var out *dynamodb.UpdateItemOutput
	item, err := g.write(ctx, "Update", fence, tok, action(*in.TableName, in.Key), func(ctx context.Context) (err error) {
		out, err = g.db.UpdateItem(ctx, &u)
		return err
	})
	if err != nil || out != nil {
		return out, err
	}
	out = &dynamodb.UpdateItemOutput{}
	if in.ReturnValues == types.ReturnValueAllNew {
		out.Attributes = item
	}
	return out, nil
}

// write sends a guarded write of the item of it with send, again while it
// conflicts with a transaction, and returns nil when its answer says it
// was applied. Otherwise it returns the stored item and a nil error when
// the item carries the write's token (the write, or an earlier attempt of
// it, was applied); a *StaleFenceError when the item's fence mark is above
// fence; or the error of the write.
func (g *Guard) write(ctx context.Context, op string, fence int64, tok string, it types.TransactWriteItem, send func(context.Context) error) (map[string]types.AttributeValue, error) {
	err := retryConflicts(ctx, g.retry(), send)
	if err == nil {
		return nil, nil
	}
	what := strings.ToLower(op)
	w := condWrite{db: g.db, actions: []types.TransactWriteItem{it}, keys: &g.keys, watch: 0, timeout: g.opts.CallTimeout,
		mine: func(item map[string]types.AttributeValue) bool { return g.mark.carries(item, tok) },
	}.resolve(ctx, nil, err)
	switch {
	case w.outcome == applied:
		return w.item, nil
	case w.outcome == failed:
		// Refused before it could apply (validation, access, a missing
		// table): no earlier attempt of it can have landed either.
		return nil, fmt.Errorf("ddblease: guarded %s %q: %w", what, g.job, err)
	case w.outcome == refused && w.rerr != nil:
		return nil, fmt.Errorf("ddblease: guarded %s %q refused; cannot tell why: %w", what, g.job, errors.Join(err, w.rerr))
	case w.rerr != nil:
		return nil, fmt.Errorf("ddblease: guarded %s %q: outcome unknown: %w", what, g.job, errors.Join(err, w.rerr))
	case w.outcome == unknown:
		return nil, fmt.Errorf("ddblease: guarded %s %q: not applied as far as a consistent read shows: %w", what, g.job, err)
	}
	return nil, g.refusal(op, fence, w.item, err)
}

// withFenceSet adds the guard's fence and token assignments to the SET
// clause of an update expression, creating the clause if there is none.
func withFenceSet(expr string) string {
	const set = fenceName + " = " + fenceValue + ", " + tokenName + " = " + tokenValue
	if strings.TrimSpace(expr) == "" {
		return "SET " + set
	}
	if i := setKeyword(expr); i >= 0 {
		return expr[:i+3] + " " + set + "," + expr[i+3:]
	}
	return "SET " + set + " " + expr
}

// setKeyword returns the index of the SET keyword in an update expression,
// or -1. SET is a reserved word, so outside placeholders it is the keyword.
func setKeyword(expr string) int {
	isName := func(c byte) bool {
		return c == '_' || c == '#' || c == ':' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	for i := 0; i+3 <= len(expr); i++ {
		if !strings.EqualFold(expr[i:i+3], "SET") || i > 0 && isName(expr[i-1]) {
			continue
		}
		if i+3 == len(expr) || !isName(expr[i+3]) || expr[i+3] == '#' || expr[i+3] == ':' {
			return i
		}
	}
	return -1
}
