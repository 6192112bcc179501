package ddblease

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// This file owns the one waiting policy (backoff, jitter), the one retry
// loop (retrier.do), and what an error from the table says: whether it is
// worth a retry (retryable), whether a write that failed with it may have
// applied (mayHaveApplied, unsent), whether it only conflicted
// (conflicted), read from a cancelled transaction's reasons by the one
// reader of them (cancelReasons).

// The library's one waiting policy between attempts of a step that failed
// with a retryable error (see retryable): a backoff, whose waits start at
// base and double up to max (max equal to base gives a fixed interval),
// each less the common jitter. The standby's poll uses the same jitter.
//
// Where each loop waits:
//   - a failed acquisition or poll: RetryInterval (the standby's poll
//     itself waits a jittered RetryInterval, or less when the lease becomes
//     takeable sooner);
//   - a heartbeat: from RetryInterval up to HeartbeatInterval/2, until the
//     tenure's deadline;
//   - a resignation, a RunSchedule claim, finish or control read, and a
//     catch-up's reads: RetryInterval;
//   - a write refused by a conflict with a transaction: from 20ms up to
//     320ms, until the call's deadline;
//   - BatchGetItem's unprocessed keys: RetryInterval, up to 10 rounds.

// jitter returns d less a random 5-25%, the spread every wait of the
// library uses so that replicas started together do not act in step.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.75 + 0.2*rand.Float64()))
}

// backoff gives the waits between the attempts of one step.
type backoff struct {
	base, max time.Duration
	n         int // waits given so far
}

// fixed returns a backoff that always waits about d.
func fixed(d time.Duration) *backoff { return &backoff{base: d, max: d} }

// next returns the wait before the next attempt.
func (b *backoff) next() time.Duration {
	d := b.base
	for i := 0; i < b.n && d < b.max; i++ {
		d *= 2
	}
	b.n++
	return jitter(min(d, b.max))
}

// reset starts the waits again from base, after a success.
func (b *backoff) reset() { b.n = 0 }

// wait sleeps for the next wait, or until ctx ends (its cause then).
func (b *backoff) wait(ctx context.Context) error { return sleep(ctx, b.next()) }

// retrier says how retrier.do retries a step. A zero field leaves its
// bound out.
type retrier struct {
	backoff  *backoff         // the waits between attempts (required)
	again    func(error) bool // whether an error is worth another attempt; nil: retryable
	attempts int              // at most this many attempts
	now      func() time.Time // the clock of deadline
	deadline time.Time        // no attempt but the first starts, and no wait ends, at or after it
	timeout  time.Duration    // bound on each attempt; on those after the first, deadline bounds it too
	onRetry  func(err error)  // told of each failed attempt that will be retried, before the wait
}

// Why retry stopped.
const (
	retryDone     = iota // the step succeeded, or failed with an error not worth retrying
	retryEnded           // ctx ended
	retryDeadline        // the next attempt would start at or after the deadline
	retryAttempts        // the attempts were used up
)

// do is the library's one retry loop: it calls step, and calls it again
// after the next wait of r.backoff while it fails with an error worth
// retrying (r.again), until ctx ends, the attempts are used up or the next
// attempt would start at or after r.deadline. It returns the number of
// attempts made, why it stopped, and step's last error.
func (r retrier) do(ctx context.Context, step func(ctx context.Context) error) (n int, stop int, err error) {
	again := r.again
	if again == nil {
		again = retryable
	}
	for n = 1; ; n++ {
		t := r.timeout
		if n > 1 && !r.deadline.IsZero() {
			left := r.deadline.Sub(r.now())
			if left <= 0 {
				return n - 1, retryDeadline, err
			}
			if t > 0 {
				t = min(t, left)
			}
		}
		actx, cancel := ctx, context.CancelFunc(func() {})
		if t > 0 {
			actx, cancel = context.WithTimeout(ctx, t)
		}
		err = step(actx)
		cancel()
		switch {
		case err == nil || !again(err):
			return n, retryDone, err
		case ctx.Err() != nil:
			return n, retryEnded, err
		case r.attempts > 0 && n >= r.attempts:
			return n, retryAttempts, err
		}
		d := r.backoff.next()
		if !r.deadline.IsZero() && !r.now().Add(d).Before(r.deadline) {
			return n, retryDeadline, err
		}
		if r.onRetry != nil {
			r.onRetry(err)
		}
		if sleep(ctx, d) != nil {
			return n, retryEnded, err
		}
	}
}

// sleep waits d, or until ctx ends (its cause then).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
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

// unsent reports whether err is, or wraps, an unsentError.
func unsent(err error) bool {
	var u *unsentError
	return errors.As(err, &u)
}
