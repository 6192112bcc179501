package ddblease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// txRetry says how retryConflicts retries.
type txRetry struct {
	now      func() time.Time // the clock of deadline
	deadline time.Time        // no attempt after the first starts at or after it
	timeout  time.Duration    // bound on each attempt, further bounded by deadline
}

// Back-off between attempts of a write refused by a conflict: from
// conflictBackoff, doubling up to maxConflictBackoff (see backoff).
const (
	conflictBackoff    = 20 * time.Millisecond
	maxConflictBackoff = 320 * time.Millisecond
)

// retryConflicts calls attempt, and calls it again with jittered back-off
// while it fails with a conflict (see conflicted), which certainly did not
// apply, until r.deadline passes or ctx ends. The error then says so and
// wraps the last conflict.
func retryConflicts(ctx context.Context, r txRetry, attempt func(ctx context.Context) error) error {
	began := r.now()
	var last error // the last conflict
	n, stop, err := retrier{backoff: &backoff{base: conflictBackoff, max: maxConflictBackoff}, again: conflicted,
		now: r.now, deadline: r.deadline, timeout: r.timeout}.do(ctx, func(ctx context.Context) error {
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
func transactRetrying(ctx context.Context, db DynamoDBAPI, items []types.TransactWriteItem, r txRetry) error {
	in := &dynamodb.TransactWriteItemsInput{TransactItems: items, ClientRequestToken: aws.String(randomID(16))}
	err := retryConflicts(ctx, r, func(ctx context.Context) error {
		_, err := db.TransactWriteItems(ctx, in)
		return err
	})
	var api smithy.APIError
	switch {
	case errors.As(err, &api) && api.ErrorCode() == "UnknownOperationException":
		return fmt.Errorf("%w: %w", ErrTransactionsUnsupported, err)
	case mismatch(err):
		return fmt.Errorf("client request token %s was used before with other parameters: %w", aws.ToString(in.ClientRequestToken), err)
	}
	return err
}

// conditionFailed reports whether err is a cancelled transaction whose
// action i failed its condition, and returns the item the server sent with
// the failure, if any.
func conditionFailed(err error, i int) (map[string]types.AttributeValue, bool) {
	var tce *types.TransactionCanceledException
	if err == nil || !errors.As(err, &tce) || i >= len(tce.CancellationReasons) {
		return nil, false
	}
	r := tce.CancellationReasons[i]
	return r.Item, aws.ToString(r.Code) == "ConditionalCheckFailed"
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
