package ddblease

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// This file owns every error sentinel, the error types, and the
// classification of errors (retryable, conflicted, mayHaveApplied).

var (
	// ErrHeld reports that another owner holds a live lease. The error is a
	// *HeldError, which names the holder.
	ErrHeld = errors.New("ddblease: lease held")

	// ErrLost reports that this replica's tenure is over: the lease item no
	// longer names this owner and fence, or the local deadline passed without
	// a successful heartbeat.
	ErrLost = errors.New("ddblease: lease lost")

	// ErrNotLeader reports a call that needs a tenure on a handle that has
	// none.
	ErrNotLeader = errors.New("ddblease: not the leader")

	// ErrMalformedItem reports an item in the table that this package cannot
	// read: a missing attribute, or one of the wrong type.
	ErrMalformedItem = errors.New("ddblease: malformed item")

	// ErrDrainTimeout reports that the function given to Run was still running
	// when DrainTimeout passed after shutdown began. Run stops renewing the
	// lease at that point, waits for the function anyway, and then returns
	// this error.
	ErrDrainTimeout = errors.New("ddblease: drain timeout")

	// ErrNotResigned reports that Run could not resign when its function
	// returned (after retrying until the lease's deadline): standbys take
	// over when the lease expires, as after a crash.
	ErrNotResigned = errors.New("ddblease: not resigned")

	// ErrInvalid reports bad input to a constructor or method; the message
	// names what was wrong.
	ErrInvalid = errors.New("ddblease: invalid argument")

	// ErrUnknownJob reports an operator call on a job whose lease item does
	// not exist: no replica ever acquired its lease.
	ErrUnknownJob = errors.New("ddblease: unknown job")

	// ErrNotHeld reports a resign request for a lease that no tenure holds:
	// it was resigned, released or has expired.
	ErrNotHeld = errors.New("ddblease: lease not held")

	// ErrResignRequested is the cause (context.Cause) of a leader context that
	// Run cancelled because an operator asked the tenure to resign (see
	// Admin.RequestResign).
	ErrResignRequested = errors.New("ddblease: resignation requested")

	// ErrStaleFence reports a write or check refused because the fence
	// presented is not the job's current one: a newer tenure exists. The
	// error is a *StaleFenceError, which carries both fences.
	ErrStaleFence = errors.New("ddblease: stale fence")

	// ErrTransactionsUnsupported reports that the server answered a
	// TransactWriteItems request with UnknownOperationException (dynalite
	// does, for one).
	ErrTransactionsUnsupported = errors.New("ddblease: server does not support transactions")

	// ErrUnhealthy is wrapped by the errors CheckHealth returns.
	ErrUnhealthy = errors.New("ddblease: unhealthy")

	// ErrSlotTaken reports that a schedule slot already has a run that may not
	// be claimed again. The error is a *SlotTakenError, which holds that run.
	ErrSlotTaken = errors.New("ddblease: slot taken")

	// ErrNoSlot reports that a firing could not be matched to a slot of its
	// schedule: no slot lies within the tolerance of the time it fired
	// (MatchSlot). The scheduler adapters run nothing for such a firing.
	ErrNoSlot = errors.New("ddblease: no slot near the firing")

	// ErrTableSchema reports a table whose key schema is not the one the
	// Layout in use needs: a string partition key and a string sort key with
	// the Layout's names.
	ErrTableSchema = errors.New("ddblease: table has the wrong key schema")
)

// The library's own sentinels: each marks an internal outcome, and
// reaches a user only wrapped in one of the errors above, or not at all.
var (
	// errPending reports a run not finished yet.
	errPending = errors.New("ddblease: run not finished")

	// errPaused is returned by a claim whose pause check (claimSpec.pause)
	// refused it, as a pausedError.
	errPaused = errors.New("ddblease: the job is paused")

	// errClaimedLate marks a claim that was applied but answered once the
	// tenure no longer led by both clocks: fn is not run, and the run is left
	// running for a newer tenure to find. Errors carrying it wrap ErrNotLeader.
	errClaimedLate = errors.New("the tenure ended while the claim was answered; its run is left for the next tenure")

	// errGoexit is recorded as the error of a run whose function called
	// runtime.Goexit (t.FailNow in a test, say) instead of returning.
	errGoexit = errors.New("ddblease: the job's function exited without returning (runtime.Goexit)")

	// errUnprocessed reports keys that BatchGetItem left unprocessed.
	errUnprocessed = errors.New("ddblease: keys left unprocessed")

	// errSessionEnded is a renewal refused: the member item no longer holds
	// the session, or it was ended by a replica that found it lapsed.
	errSessionEnded = errors.New("ddblease: the pool session was ended")

	// errNoSession is an acquisition by a pool's lease while its pool has no
	// live session: it waits for one, as for a held lease.
	errNoSession = errors.New("ddblease: the pool has no live session")
)

// HeldError is returned by TryAcquire when another owner holds a live lease.
// errors.Is(err, ErrHeld) reports true for it.
type HeldError struct {
	Job       string
	Owner     string    // the holder's owner id
	Fence     int64     // the holder's fence
	ExpiresAt time.Time // expiry as recorded by the holder's clock
	Draining  bool      // the holder is draining and about to resign
}

// Error names the job, the holder, its fence and the recorded expiry.
func (e *HeldError) Error() string {
	return fmt.Sprintf("ddblease: lease %q held by %q (fence %d) until %s",
		e.Job, e.Owner, e.Fence, e.ExpiresAt.UTC().Format(time.RFC3339Nano))
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// PanicError is the value Run and RunSchedule panic with, after ending the
// tenure and resigning, when the function given to them panicked. Value is
// what the function panicked with and Stack its goroutine's stack at that
// point; a job run that panicked is recorded as failed with both.
type PanicError struct {
	Value any
	Stack []byte
}

// Error gives the panic's value and stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("ddblease: the leader's function panicked: %v\n\n%s", e.Value, e.Stack)
}

// Unwrap returns the panic's value if it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// soundError returns err, unless it is an interface holding a nil pointer
// (or another nil value), whose methods may panic: such an error is
// replaced by one that says what it was. The library calls methods of
// user errors only through it.
func soundError(err error) error {
	if err == nil {
		return nil
	}
	v := reflect.ValueOf(err)
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		if v.IsNil() {
			return fmt.Errorf("ddblease: a nil %T was returned as a non-nil error", err)
		}
	}
	return err
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

// The classification of errors: every decision to retry, or to resolve
// an unknown outcome, goes through the functions below.

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

// callOutcome classifies a finished request for EventCall.
func callOutcome(op string, err error) CallOutcome {
	if err == nil {
		return CallOK
	}
	if len(failedConditions(err)) > 0 {
		return CallConditionFailed
	}
	var api smithy.APIError
	if errors.As(err, &api) && throttleCodes[api.ErrorCode()] {
		return CallThrottled
	}
	switch op {
	case "GetItem", "BatchGetItem", "DescribeTable", "Query":
		return CallError
	}
	if mayHaveApplied(err) {
		return CallInDoubt
	}
	return CallError
}

// explainTableError adds the table's name to errors the SDK reports
// without it: a missing table, and a key schema that is not ours (checked
// with one DescribeTable).
func explainTableError(ctx context.Context, db DynamoDBAPI, table string, y Layout, err error) error {
	var api smithy.APIError
	if !errors.As(err, &api) {
		return err
	}
	switch api.ErrorCode() {
	case "ResourceNotFoundException":
		return fmt.Errorf("table %q not found (create it with CreateTable or your infrastructure code): %w", table, err)
	case "ValidationException":
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tableCallTimeout)
		defer cancel()
		out, derr := db.DescribeTable(cctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if derr != nil {
			return fmt.Errorf("table %q: %w", table, err)
		}
		if serr := checkSchema(table, out.Table, y); serr != nil {
			return fmt.Errorf("%w (the server said: %w)", serr, err)
		}
		return fmt.Errorf("table %q: %w", table, err)
	case "AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException",
		"MissingAuthenticationTokenException", "InvalidClientTokenId":
		return fmt.Errorf("table %q: access refused, check the credentials and their permissions: %w", table, err)
	}
	return err
}

// warnLimiter rate-limits repeated warnings: one line per key every
// warnEvery, saying how many were left out.
type warnLimiter struct {
	mu   sync.Mutex
	last map[string]warnState
}

type warnState struct {
	at         time.Time
	suppressed int
}

const warnEvery = 30 * time.Second

// allow reports whether a warning with key may be logged at now, and how
// many were suppressed since the last one.
func (w *warnLimiter) allow(key string, now time.Time) (bool, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = make(map[string]warnState)
	}
	s, ok := w.last[key]
	if ok && now.Sub(s.at) < warnEvery && now.Sub(s.at) >= 0 {
		s.suppressed++
		w.last[key] = s
		return false, 0
	}
	w.last[key] = warnState{at: now}
	return true, s.suppressed
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
