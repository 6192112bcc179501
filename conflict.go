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

// ended returns the error of a context that has ended, with its cause if
// that differs: both context.Canceled and the cause are in the chain.
func ended(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return err
	}
	return fmt.Errorf("%w: %w", err, cause)
}

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
	bo := &backoff{base: conflictBackoff, max: maxConflictBackoff}
	var last error
	for n := 1; ; n++ {
		timeout := r.timeout
		if n > 1 {
			left := r.deadline.Sub(r.now())
			if left <= 0 {
				return fmt.Errorf("kept conflicting with other writes (%d attempts in %v) until its deadline: %w",
					n-1, r.now().Sub(began).Round(time.Millisecond), last)
			}
			timeout = min(timeout, left)
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err := attempt(cctx)
		cancel()
		switch {
		case err == nil:
			return nil
		case !conflicted(err) && last != nil && ctx.Err() != nil:
			return fmt.Errorf("kept conflicting with other writes (%d attempts), then %w: %w", n-1, ended(ctx), errors.Join(last, err))
		case !conflicted(err):
			return err
		}
		last = err
		d := bo.next()
		if !r.now().Add(d).Before(r.deadline) {
			return fmt.Errorf("kept conflicting with other writes (%d attempts in %v) until its deadline: %w",
				n, r.now().Sub(began).Round(time.Millisecond), err)
		}
		if ctx.Err() == nil {
			_ = sleep(ctx, d)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("kept conflicting with other writes (%d attempts), then %w: %w", n, ended(ctx), err)
		}
	}
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
