package ddblease

import (
	"errors"
	"fmt"
)

// ErrSlotTaken reports that a schedule slot already has a run that may not
// be claimed again. The error is a *SlotTakenError, which holds that run.
var ErrSlotTaken = errors.New("ddblease: slot taken")

// SlotTakenError is returned by Claim when the slot already has a run that
// may not be claimed again. errors.Is(err, ErrSlotTaken) reports true for it.
type SlotTakenError struct {
	Run RunRecord // the run found in the slot
	// Abandoned reports that this Claim marked Run abandoned: an older
	// tenure had left it running, and the policy is NeverRerun.
	Abandoned bool
}

// Error names the slot and the run that holds it.
func (e *SlotTakenError) Error() string {
	return fmt.Sprintf("ddblease: slot %s of %q taken: %s by %q (fence %d)",
		fmtSlot(e.Run.Slot), e.Run.Job, e.Run.Status, e.Run.Owner, e.Run.Fence)
}

// Unwrap returns ErrSlotTaken.
func (e *SlotTakenError) Unwrap() error { return ErrSlotTaken }

// RunStatus is the state of a job run.
type RunStatus string

// Run states. A run is created running; Finish makes it succeeded or
// failed; a newer tenure marks abandoned a run that an older one left
// running (see RerunPolicy). RunSkippedByPause records a slot that fell
// due while the job was paused (Admin.Pause): it did not run, and is run
// only if the job is resumed with a catch-up. All but RunRunning are final.
const (
	RunRunning        RunStatus = "running"
	RunSucceeded      RunStatus = "succeeded"
	RunFailed         RunStatus = "failed"
	RunAbandoned      RunStatus = "abandoned"
	RunSkippedByPause RunStatus = "skipped-by-pause"
)

// RerunPolicy says what a newer tenure does with a slot whose run an older
// tenure left running: its leader died, was paused or was partitioned
// mid-run, and whether the run's effect happened is unknown.
type RerunPolicy int

const (
	// NeverRerun, the default, marks such a run abandoned and does not run
	// the slot again: Claim returns a *SlotTakenError with Abandoned set.
	// It suits jobs that move money: a re-run repeats the effect unless the
	// effect is deduplicated by slot, and an abandoned run is something for
	// an operator to look at.
	NeverRerun RerunPolicy = iota
	// Rerun lets the newer tenure claim the slot again with its own fence
	// and run it. Use it when the job is idempotent per slot: its effect is
	// committed with JobRun.Commit, or keyed by JobRun.IdempotencyKey in a
	// sink that refuses a key twice. The stale claimant's Finish and fenced
	// writes are then refused.
	Rerun
)

// String returns the policy's name.
func (p RerunPolicy) String() string {
	switch p {
	case NeverRerun:
		return "NeverRerun"
	case Rerun:
		return "Rerun"
	}
	return fmt.Sprintf("RerunPolicy(%d)", int(p))
}
