package ddblease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/smithy-go"
)

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

// transient reports whether err is worth retrying: throttling, server-side
// faults, timeouts and network errors. Errors the server blames on the
// request (a missing table, a validation error, denied access) and malformed
// items are not.
func transient(err error) bool {
	if err == nil || errors.Is(err, ErrMalformedItem) || errors.Is(err, ErrInvalid) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
			"TransactionConflictException", "LimitExceededException", "TransactionInProgressException":
			return true
		}
		return api.ErrorFault() != smithy.FaultClient
	}
	return true
}
