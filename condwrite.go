package ddblease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// This file owns the one resolver of a conditional write whose answer may be
// lost (condWrite, and the read back of the item a lost write targeted:
// target, keyOf) and the one reader of the conditions that failed
// (failedConditions); what an error says (retryable, mayHaveApplied,
// conflicted) is retry.go's.

// Back-off between attempts of a write refused by a conflict: from
// conflictBackoff, doubling up to maxConflictBackoff (see backoff).
const (
	conflictBackoff    = 20 * time.Millisecond
	maxConflictBackoff = 320 * time.Millisecond
)

// retryConflicts calls attempt, and calls it again with jittered back-off
// while it fails with a conflict (see conflicted), which certainly did not
// apply, until r.deadline passes or ctx ends (r gives now, deadline and
// timeout; retryConflicts the rest). The error then says so and
// wraps the last conflict.
func retryConflicts(ctx context.Context, r retrier, attempt func(ctx context.Context) error) error {
	began := r.now()
	var last error // the last conflict
	r.backoff, r.again = &backoff{base: conflictBackoff, max: maxConflictBackoff}, conflicted
	n, stop, err := r.do(ctx, func(ctx context.Context) error {
		err := attempt(ctx)
		if conflicted(err) {
			last = err
		}
		return err
	})
	switch {
	case stop == retryDeadline:
		return fmt.Errorf("kept conflicting with other writes (%d attempts in %v) until its deadline: %w",
			n, r.now().Sub(began).Round(time.Millisecond), err)
	case stop == retryEnded:
		return fmt.Errorf("kept conflicting with other writes (%d attempts), then %w: %w", n, ended(ctx), err)
	case err != nil && last != nil && ctx.Err() != nil:
		return fmt.Errorf("kept conflicting with other writes (%d attempts), then %w: %w", n-1, ended(ctx), errors.Join(last, err))
	}
	return err
}

// transactRetrying sends items in one TransactWriteItems with a fresh
// client request token, and sends it again with the same token while it
// is cancelled only by conflicts with other writes (or throttled), as
// retryConflicts does. A server that does not know the operation gets an
// error wrapping ErrTransactionsUnsupported; a token that the server saw
// with other parameters (IdempotentParameterMismatch) is not retried.
//
// resent reports that the transaction was sent more than once under its
// token, by the SDK's retries or by this loop. DynamoDB answers a token it
// has applied with success, without checking the conditions again, so a
// success then may be the answer to an earlier attempt, which landed at an
// instant not known.
func transactRetrying(ctx context.Context, db DynamoDBAPI, items []types.TransactWriteItem, r retrier) (resent bool, err error) {
	in := &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: aws.String(randomID(16))}
	sends := 0
	err = retryConflicts(ctx, r, func(ctx context.Context) error {
		sends++
		out, err := db.TransactWriteItems(ctx, in)
		if sends > 1 {
			resent = true
		} else if out != nil {
			if ar, ok := retry.GetAttemptResults(out.ResultMetadata); ok && len(ar.Results) > 1 {
				resent = true
			}
		}
		return err
	})
	var api smithy.APIError
	switch {
	case errors.As(err, &api) && api.ErrorCode() == "UnknownOperationException":
		return resent, fmt.Errorf("%w: %w", ErrTransactionsUnsupported, err)
	case mismatch(err):
		return resent, fmt.Errorf("client request token %s was used before with other parameters: %w", aws.ToString(in.ClientRequestToken), err)
	}
	return resent, err
}

// failedConditions decodes the error of a conditional write: the actions
// whose condition failed, each with the item the server returned with the
// failure (nil if none). A plain write (UpdateItem, PutItem, DeleteItem)
// is action 0; a cancelled transaction lists its actions in order. It is
// empty when no condition failed.
func failedConditions(err error) map[int]map[string]types.AttributeValue {
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return map[int]map[string]types.AttributeValue{0: ccf.Item}
	}
	reasons, ok := cancelReasons(err)
	if !ok {
		return nil
	}
	fails := map[int]map[string]types.AttributeValue{}
	for i, r := range reasons {
		if r.kind == cancelCondition {
			fails[i] = r.item
		}
	}
	return fails
}

// outcome is what became of a conditional write.
type outcome int

const (
	applied outcome = iota // in the table: its answer says so, or the stored item shows it (mine)
	refused                // not in the table: a condition failed, and the stored item is not mine
	failed                 // not in the table: refused outright or never sent, no condition failed
	unknown                // may be in the table: its answer was lost, and the stored item does not show it
)

// condWrite is what tells the outcome of a conditional write whose answer
// may be lost: the items its actions act on, and which of them shows
// whether it was applied.
type condWrite struct {
	db      DynamoDBAPI
	actions []types.TransactWriteItem // the write's actions (a plain write is one); only their tables and keys are read
	keys    *sync.Map                 // the key schemas of tables learned (keyOf), for a Put's key; nil: none kept
	// watch is the action whose stored item shows whether the write was
	// applied, as mine says; -1: none (a lost answer stays unknown).
	watch int
	// mine reports that the stored item of action watch shows the write
	// applied (it carries the write's token). nil: no item does.
	mine func(item map[string]types.AttributeValue) bool
	// once is set for a write sent once, with the SDK's retries off: then
	// any refusal, throttling included, shows it did not apply.
	once    bool
	timeout time.Duration    // bound on each read
	until   time.Time        // no read after it (zero: no bound but timeout)
	now     func() time.Time // until's clock
}

// written is a resolved conditional write.
type written struct {
	outcome
	// item is the stored item of action watch: as the answer returned it
	// (applied), returned with the failure or read back (refused, unknown),
	// nil if there is none or it is not known (rerr).
	item  map[string]types.AttributeValue
	fails map[int]map[string]types.AttributeValue // refused: failedConditions
	err   error                                   // the write's error; nil when its answer said applied
	rerr  error                                   // the error that kept item from being read
	cw    condWrite
	ctx   context.Context
}

// resolve finds out what became of a conditional write whose answer was
// item (on success: its ReturnValues) or err. The stored item of action
// watch is read back when the answer was lost, or when its condition
// failed and the server returned no item with the failure (dynalite
// returns none), even when ctx has ended; an item that is mine makes the
// write applied (an SDK retry of an attempt that landed).
func (c condWrite) resolve(ctx context.Context, item map[string]types.AttributeValue, err error) written {
	w := written{outcome: applied, item: item, err: err, cw: c, ctx: ctx}
	switch w.fails = failedConditions(err); {
	case err == nil:
		return w
	case len(w.fails) > 0:
		w.outcome, w.item = refused, nil
		if _, ok := w.fails[c.watch]; !ok {
			return w
		}
	case c.once && !mayHaveApplied(err), !c.once && (unsent(err) || !retryable(err) && !mismatch(err)):
		w.outcome, w.item = failed, nil
		return w
	default:
		w.outcome, w.item = unknown, nil
		if c.watch < 0 {
			return w
		}
	}
	if w.item, w.rerr = w.stored(c.watch); w.rerr == nil && c.mine != nil && c.mine(w.item) {
		w.outcome = applied
	}
	return w
}

// stored returns the stored item of action i: the one returned with its
// failed condition, or one read with a strongly consistent read, even when
// the caller's context has ended (nil when there is none).
func (w *written) stored(i int) (map[string]types.AttributeValue, error) {
	if item := w.fails[i]; len(item) > 0 {
		return item, nil
	}
	c := w.cw
	t := c.timeout
	if !c.until.IsZero() {
		t = min(t, c.until.Sub(c.now()))
	}
	if t <= 0 {
		return nil, errors.New("ddblease: no time left to read the item back")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), t)
	defer cancel()
	table, key := target(c.actions[i])
	if c.actions[i].Put != nil {
		var err error
		if key, err = keyOf(ctx, c.db, c.keys, aws.ToString(table), key, c.timeout); err != nil {
			return nil, err
		}
	}
	return getItem(ctx, c.db, aws.ToString(table), key, c.timeout)
}

// attributes returns the item an UpdateItem answer returned, if any.
func attributes(out *dynamodb.UpdateItemOutput) map[string]types.AttributeValue {
	if out == nil {
		return nil
	}
	return out.Attributes
}

// action is a write's action that acts on key of table, for condWrite.
func action(table string, key map[string]types.AttributeValue) types.TransactWriteItem {
	return types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{TableName: aws.String(table), Key: key}}
}

// updateItemInput is the UpdateItem request that applies upd on its own,
// where a server has no transactions.
func updateItemInput(upd *types.Update) *dynamodb.UpdateItemInput {
	return &dynamodb.UpdateItemInput{
		TableName:                           upd.TableName,
		Key:                                 upd.Key,
		UpdateExpression:                    upd.UpdateExpression,
		ConditionExpression:                 upd.ConditionExpression,
		ExpressionAttributeNames:            upd.ExpressionAttributeNames,
		ExpressionAttributeValues:           upd.ExpressionAttributeValues,
		ReturnValuesOnConditionCheckFailure: upd.ReturnValuesOnConditionCheckFailure,
	}
}

// ended returns the error of a context that has ended, with its cause if
// that differs: both context.Canceled and the cause are in the chain.
func ended(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return err
	}
	return fmt.Errorf("%w: %w", err, cause)
}

// keyOf returns the key attributes of item in table, learning the table's
// key schema with DescribeTable, even when ctx has ended; keys, if not nil,
// keeps the schemas learned.
func keyOf(ctx context.Context, db DynamoDBAPI, keys *sync.Map, table string, item map[string]types.AttributeValue, timeout time.Duration) (map[string]types.AttributeValue, error) {
	var names []string
	if keys != nil {
		if v, ok := keys.Load(table); ok {
			names = v.([]string)
		}
	}
	if names == nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		out, err := db.DescribeTable(cctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("describe table %q: %w", table, err)
		}
		if out.Table == nil || len(out.Table.KeySchema) == 0 {
			return nil, fmt.Errorf("describe table %q: no key schema returned", table)
		}
		for _, k := range out.Table.KeySchema {
			names = append(names, aws.ToString(k.AttributeName))
		}
		if keys != nil {
			keys.Store(table, names)
		}
	}
	key := make(map[string]types.AttributeValue, len(names))
	for _, n := range names {
		v, ok := item[n]
		if !ok {
			return nil, fmt.Errorf("the item lacks key attribute %q", n)
		}
		key[n] = v
	}
	return key, nil
}

// target returns the table and the key that an action acts on: a Put's
// key is in its item, which target returns whole.
func target(it types.TransactWriteItem) (*string, map[string]types.AttributeValue) {
	switch {
	case it.Put != nil:
		return it.Put.TableName, it.Put.Item
	case it.Update != nil:
		return it.Update.TableName, it.Update.Key
	case it.Delete != nil:
		return it.Delete.TableName, it.Delete.Key
	case it.ConditionCheck != nil:
		return it.ConditionCheck.TableName, it.ConditionCheck.Key
	}
	return nil, nil
}
