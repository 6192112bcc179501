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
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// This file owns the one resolver of a conditional write whose answer may be
// lost (condWrite, and the read back of the item a lost write targeted:
// target, keyOf), the one reader of the conditions that failed
// (failedConditions, cancelReasons), and the classification of errors
// that rests on them: which are worth a retry (retryable), which may have
// applied (mayHaveApplied, unsent), which are conflicts (conflicted).

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

// cancelKind is what a cancelled transaction says of one of its actions.
type cancelKind int

const (
	cancelNone      cancelKind = iota // the action was not the cause
	cancelTransient                   // a conflict with another write, or throttling: sending again may pass
	cancelCondition                   // its condition failed
	cancelOther                       // anything else (a validation error, an item too large): sending again fails the same way
)

// cancelReason is the reason a cancelled transaction gives for one action.
type cancelReason struct {
	kind cancelKind
	item map[string]types.AttributeValue // the item the server returned with a failed condition, if any
}

// cancelReasons reads the reasons of a cancelled transaction, one per
// action in order; ok is false when err is not a cancelled transaction.
// It is the one reader of CancellationReasons.
func cancelReasons(err error) (reasons []cancelReason, ok bool) {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return nil, false
	}
	for _, r := range tce.CancellationReasons {
		k := cancelOther
		switch aws.ToString(r.Code) {
		case "", "None":
			k = cancelNone
		case "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded":
			k = cancelTransient
		case "ConditionalCheckFailed":
			k = cancelCondition
		}
		reasons = append(reasons, cancelReason{kind: k, item: r.Item})
	}
	return reasons, true
}

// onlyTransient reports whether no reason of a cancelled transaction is
// lasting (a failed condition or another error), and whether one of them
// is transient.
func onlyTransient(reasons []cancelReason) (only, some bool) {
	for _, r := range reasons {
		switch r.kind {
		case cancelNone:
		case cancelTransient:
			some = true
		default:
			return false, some
		}
	}
	return true, some
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

// permanentCodes are the error codes of requests the server refuses for
// what they are, not for the moment they were sent: retrying cannot help.
var permanentCodes = map[string]bool{
	"ValidationException":                 true,
	"ResourceNotFoundException":           true,
	"AccessDeniedException":               true,
	"UnrecognizedClientException":         true,
	"InvalidSignatureException":           true,
	"MissingAuthenticationTokenException": true,
	"IncompleteSignatureException":        true,
	"InvalidClientTokenId":                true,
	"SerializationException":              true,
	"UnknownOperationException":           true,
}

// throttleCodes are the error codes of requests refused for load.
var throttleCodes = map[string]bool{
	"ProvisionedThroughputExceededException": true,
	"ThrottlingException":                    true,
	"RequestLimitExceeded":                   true,
	"LimitExceededException":                 true,
}

// retryable reports whether err is worth retrying: throttling, conflicts
// with a transaction, server-side faults, timeouts and network errors, and
// a transaction cancelled only by conflicts or throttling. Errors the
// server blames on the request (a missing table, a validation error,
// denied access, bad credentials), malformed items, invalid input and this
// package's verdicts (a lost tenure, a taken slot, a stale fence) are not.
func retryable(err error) bool {
	if err == nil {
		return false
	}
	for _, final := range []error{ErrLost, ErrNotLeader, ErrSlotTaken, ErrStaleFence, ErrTransactionsUnsupported,
		ErrMalformedItem, ErrInvalid, ErrTableSchema} {
		if errors.Is(err, final) {
			return false
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || unsent(err) {
		// A request never sent was not refused by the table, whatever a
		// credentials service answered: Acquire decides whether a start
		// that has never reached the table gives up (fence.go).
		return true
	}
	if reasons, ok := cancelReasons(err); ok {
		only, _ := onlyTransient(reasons)
		return only
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		code := api.ErrorCode()
		switch {
		case permanentCodes[code]:
			return false
		case throttleCodes[code], code == "TransactionConflictException", code == "TransactionInProgressException":
			return true
		}
		return api.ErrorFault() != smithy.FaultClient
	}
	return true
}

// conflicted reports whether err certainly did not apply and is worth
// sending again at once: a transaction cancelled only by conflicts with
// other writes or by throttling, a plain write refused because a
// transaction is using its item, or a transaction with the same token
// still in progress.
func conflicted(err error) bool {
	if reasons, ok := cancelReasons(err); ok {
		only, some := onlyTransient(reasons)
		return only && some
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "TransactionConflictException", "TransactionInProgressException":
			return true
		}
	}
	return false
}

// mismatch reports whether err is DynamoDB's answer to a client request
// token reused with other parameters within its idempotency window.
func mismatch(err error) bool {
	var api smithy.APIError
	return errors.As(err, &api) && api.ErrorCode() == "IdempotentParameterMismatchException"
}

// mayHaveApplied reports whether a write that failed with err may have
// been applied all the same: its answer was lost or the server failed
// while handling it. A request refused (throttled, invalid, denied,
// conditional) did not apply, nor did one the client never sent. Valid for
// requests sent once (singleAttempt).
func mayHaveApplied(err error) bool {
	if unsent(err) {
		return false
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		var re *smithyhttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() >= 500 {
			return true
		}
		return api.ErrorFault() == smithy.FaultServer
	}
	return true
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

// unsent reports whether err is, or wraps, an unsentError.
func unsent(err error) bool {
	var u *unsentError
	return errors.As(err, &u)
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
