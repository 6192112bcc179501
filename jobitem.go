package ddblease

import (
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the run items: RunRecord, runItem and its decoding.

// RunRecord is a job-run item as stored in the table. Its JSON form has
// the field names of ddblease's other JSON output.
type RunRecord struct {
	Job        string    `json:"job"`
	Slot       time.Time `json:"slot"`  // the slot, in UTC
	Fence      int64     `json:"fence"` // the claimant's fence
	Owner      string    `json:"owner"` // the claimant's owner id
	Status     RunStatus `json:"status"`
	StartedAt  time.Time `json:"startedAt"`           // claim time, by the claimant's clock
	FinishedAt time.Time `json:"finishedAt,omitzero"` // zero while running
	Error      string    `json:"error,omitempty"`     // the error of a failed run
	// Claims counts the claims made on the slot: 1, plus one per re-run.
	Claims int `json:"claims"`
	// Missed counts the slots that the catch-up before this run skipped
	// and found without a run, after the latest earlier run (RunSchedule).
	// Only slots within CatchUpWindow of the catch-up are looked at: after
	// an outage longer than the window, older slots went unrun uncounted,
	// and a run an old tenure left running there stays running until its
	// item expires. ListRuns shows them.
	Missed int `json:"missed,omitempty"`
	// MissedUnknown reports that the catch-up could not read the skipped
	// slots back (Missed is then 0).
	MissedUnknown bool `json:"missedUnknown,omitempty"`
	// AbandonedBy is the fence of the tenure that marked the run abandoned.
	AbandonedBy int64 `json:"abandonedBy,omitempty"`
	// ExpiresAt is when the item may be deleted (its time to live).
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	// Trigger is the id of the trigger request (Admin.Trigger) of a run
	// made outside the schedule; empty for a schedule slot.
	Trigger string `json:"trigger,omitempty"`

	claim     string
	unswept   []string
	skippedIn int64 // attrSkippedIn; 0 if not recorded
}

// runID is the id in the run's key: its slot, or for a triggered run the
// slot and the trigger (Trigger.RunID).
func (r RunRecord) runID() string {
	if r.Trigger != "" {
		return triggerRunID(r.Slot, r.Trigger)
	}
	return fmtSlot(r.Slot)
}

// orphanFor reports whether the run was left running by a tenure older
// than the one with fence: the one rule by which a tenure decides that a
// run is abandoned (Claim under NeverRerun, and RunSchedule's sweeps).
// The marking is a write conditional on the run being unchanged
// (Lease.abandon), so it never overrides an outcome the claimant
// recorded late.
func (r RunRecord) orphanFor(fence int64) bool { return r.Status == RunRunning && r.Fence < fence }

// runItem is a job-run item as stored: the record that decodeRun decodes
// with attributevalue and then validates.
type runItem struct {
	Job         sAttr    `dynamodbav:"job"`
	Slot        sAttr    `dynamodbav:"slot"`
	Trigger     sAttr    `dynamodbav:"trigger"`
	Fence       nAttr    `dynamodbav:"fence"`
	Owner       sAttr    `dynamodbav:"owner"`
	Claim       sAttr    `dynamodbav:"claim"`
	Status      sAttr    `dynamodbav:"status"`
	StartedAt   nAttr    `dynamodbav:"startedAt"`
	FinishedAt  nAttr    `dynamodbav:"finishedAt"`
	Error       sAttr    `dynamodbav:"error"`
	Claims      nAttr    `dynamodbav:"claims"`
	Missed      nAttr    `dynamodbav:"missed"`
	AbandonedBy nAttr    `dynamodbav:"abandonedBy"`
	TTL         nAttr    `dynamodbav:"ttl"` // RunTTLAttribute
	Unswept     []string `dynamodbav:"unswept,stringset"`
	SkippedIn   nAttr    `dynamodbav:"skippedIn"`
}

// decodeRun reads a run item. Every attribute the protocol relies on must be
// present with the right type; anything else is ErrMalformedItem.
func decodeRun(y Layout, item map[string]types.AttributeValue) (RunRecord, error) {
	var it runItem
	var r RunRecord
	err := unmarshalItem(item, &it)
	if err == nil {
		err = it.identity(y, item, &r)
	}
	if err == nil {
		err = it.claimed(&r)
	}
	if err == nil {
		err = it.outcome(&r)
	}
	if err != nil {
		return RunRecord{}, fmt.Errorf("%w: run item %q: %v", ErrMalformedItem, y.describe(item), err)
	}
	return r, nil
}

// identity decodes which run the item is (job, slot, trigger) into r and
// checks that its key is that run's.
func (it *runItem) identity(y Layout, item map[string]types.AttributeValue, r *RunRecord) error {
	var err error
	if r.Job, err = it.Job.get(attrJob); err != nil {
		return err
	}
	id, err := it.Slot.get(attrSlot)
	if err != nil {
		return err
	}
	if r.Slot, err = time.Parse(time.RFC3339Nano, id); err != nil {
		return fmt.Errorf("attribute %s is %q, not an RFC 3339 time", attrSlot, id)
	}
	r.Slot = r.Slot.UTC()
	if it.Trigger.set {
		if r.Trigger, err = it.Trigger.get(attrTrigger); err != nil {
			return err
		}
		if !validTriggerID(r.Trigger) {
			return fmt.Errorf("attribute %s is %q, not a trigger id", attrTrigger, r.Trigger)
		}
	}
	pk, _ := str(item, y.PartitionKey)
	sk, _ := str(item, y.SortKey)
	if want := runSK(r.Slot, r.Trigger); pk != y.jobPartition(r.Job) || sk != want {
		return fmt.Errorf("key does not match its job and slot (%q)", y.jobPartition(r.Job)+"/"+want)
	}
	return nil
}

// claimed decodes who claimed the run, under which fence, and its status.
func (it *runItem) claimed(r *RunRecord) error {
	var err error
	if r.Fence, err = it.Fence.get(attrFence); err != nil {
		return err
	}
	if r.Fence < 1 {
		return fmt.Errorf("fence %d is below 1", r.Fence)
	}
	if r.Owner, err = it.Owner.get(attrOwner); err != nil {
		return err
	}
	if r.claim, err = it.Claim.get(attrClaim); err != nil {
		return err
	}
	st, err := it.Status.get(attrStatus)
	if err != nil {
		return err
	}
	switch r.Status = RunStatus(st); r.Status {
	case RunRunning, RunSucceeded, RunFailed, RunAbandoned, RunSkippedByPause:
	default:
		return fmt.Errorf("unknown status %q", st)
	}
	return nil
}

// outcome decodes the run's times, error and counts.
func (it *runItem) outcome(r *RunRecord) error {
	ms, err := it.StartedAt.get(attrStartedAt)
	if err != nil {
		return err
	}
	r.StartedAt = time.UnixMilli(ms)
	if ms, err = it.FinishedAt.opt(attrFinishedAt); err != nil {
		return err
	} else if ms != 0 {
		r.FinishedAt = time.UnixMilli(ms)
	}
	if r.Error, err = it.Error.opt(attrError); err != nil {
		return err
	}
	var n int64
	if n, err = it.Claims.opt(attrClaims); err != nil {
		return err
	}
	r.Claims = int(max(n, 1))
	if n, err = it.Missed.opt(attrMissed); err != nil {
		return err
	}
	switch {
	case n == -1: // written when the catch-up could not count
		r.MissedUnknown = true
	case n < 0:
		return fmt.Errorf("%s %d is below -1", attrMissed, n)
	default:
		r.Missed = int(n)
	}
	if r.AbandonedBy, err = it.AbandonedBy.opt(attrAbandonedBy); err != nil {
		return err
	}
	if n, err = it.TTL.opt(RunTTLAttribute); err != nil {
		return err
	} else if n != 0 {
		r.ExpiresAt = time.Unix(n, 0)
	}
	r.unswept = it.Unswept
	if r.skippedIn, err = it.SkippedIn.opt(attrSkippedIn); err != nil {
		return err
	}
	return nil
}

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
// only if the job is resumed with a catch-up (or, if it turns out to have
// come due after the pause ended, by a leader whose wall clock was ahead
// when it recorded the skip, when it comes due). All but RunRunning are
// final.
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

// mine reports whether rec is the run this claim wrote: its token, under
// this tenure's fence. A token belongs to one tenure: a claim of an earlier
// tenure of this handle that landed unseen is an older tenure's run.
func mine(rec RunRecord, token string, fence int64) bool {
	return rec.claim == token && rec.Fence == fence
}
