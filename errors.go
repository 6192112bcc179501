package ddblease

import (
	"errors"
	"fmt"
	"reflect"
	"time"
)

// This file owns every error sentinel and the library's error types
// (StaleFenceError and SlotTakenError stand beside the guard and the run
// item they describe); which errors are worth a retry is condwrite.go's.

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

// The classification of errors: every decision to retry, or to resolve
// an unknown outcome, goes through the functions below.

// unsentError is the error of a request that the SDK client failed to
// build, address or sign, so that it was never sent: no credentials, no
// region, an endpoint that cannot be resolved. Retrying mends it only when
// the cause is passing (credentials that could not be refreshed once, a
// credentials endpoint not reachable yet); the table never refused it.
type unsentError struct{ err error }

func (e *unsentError) Error() string { return e.err.Error() }

func (e *unsentError) Unwrap() error { return e.err }

// movedOnError reports that the lease item names another owner or fence.
// inDoubt: the write's own outcome is unknown (it may have landed before
// the item moved on).
type movedOnError struct {
	err     error
	inDoubt bool
}

func (e *movedOnError) Error() string { return e.err.Error() }

func (e *movedOnError) Unwrap() error { return e.err }

// pausedError is errPaused with the pause's start as the lease item held
// it (Unix ms; 0 if not recorded), which a skip record keeps.
type pausedError struct{ pausedAt int64 }

func (e pausedError) Error() string { return errPaused.Error() }

func (e pausedError) Is(target error) bool { return target == errPaused }

// endedBeforeRun is the error of a campaign whose ctx had ended before it
// began: nothing was attempted.
type endedBeforeRun struct{ err error }

func (e endedBeforeRun) Error() string { return e.err.Error() }

func (e endedBeforeRun) Unwrap() error { return e.err }

// schemaError is the error of a key schema mismatch; it wraps
// ErrTableSchema.
type schemaError struct{ msg string }

func (e *schemaError) Error() string { return e.msg }

func (e *schemaError) Unwrap() error { return ErrTableSchema }
