package ddblease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
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

// Default values of JobOptions.
const (
	DefaultRetention     = 30 * 24 * time.Hour
	DefaultCatchUpWindow = 15 * time.Minute
)

// Limits on the job-run calls.
const (
	// MaxListSlots is the most slots one ListRuns call covers.
	MaxListSlots = 1000
	// MaxCommitItems is the most writes JobRun.Commit accepts: DynamoDB's
	// 100 actions per transaction, less the run's update and the lease check.
	MaxCommitItems = 98
	// maxErrorText bounds the error text stored in a run item, in bytes.
	maxErrorText = 4096
)

// RunTTLAttribute is the attribute in which run items carry their expiry,
// in Unix seconds. Enable DynamoDB's time to live on it for old runs to be
// deleted; lease items never carry it.
const RunTTLAttribute = "ttl"

// JobOptions configures the job-run calls (Claim, RunSchedule). All
// replicas of a job must use the same values. A zero field takes its
// default; a negative duration is an error.
type JobOptions struct {
	// Rerun is the policy for a slot whose run an older tenure left running.
	// Default NeverRerun.
	Rerun RerunPolicy

	// Retention is how long a run item is kept: its RunTTLAttribute is the
	// claim time plus Retention. It must exceed CatchUpWindow, since a slot
	// whose item has expired may be claimed again. DynamoDB deletes expired
	// items only when time to live is enabled, and up to a few days late.
	// Default 30 days.
	Retention time.Duration

	// CatchUpWindow is how late RunSchedule may still fire a slot: the most
	// recent slot that came due while no one led is fired if it is at most
	// this old, and older ones are skipped. It must exceed the timer and
	// takeover delays a firing may suffer: a slot found later than this is
	// never fired. Default 15 minutes, which covers a failover
	// (LeaseDuration plus RetryInterval) and a rolling deploy with margin,
	// while a replica that starts hours after a nightly slot does not fire
	// it at a surprising time.
	CatchUpWindow time.Duration

	// NoTransactions makes Claim write the run item with a plain
	// conditional write, without a check on the lease item. By default Claim
	// uses TransactWriteItems so that a deposed leader cannot claim; on a
	// server that answers UnknownOperationException (dynalite, for one) it
	// falls back to the plain write, and remembers that for the Lease. The
	// plain write still refuses a slot that has a run; it only rests on the
	// local tenure check to refuse a deposed leader.
	NoTransactions bool
}

func newJobOptions(optFns []func(*JobOptions)) (JobOptions, error) {
	var o JobOptions
	for _, fn := range optFns {
		if fn != nil {
			fn(&o)
		}
	}
	return o, o.setDefaults()
}

func (o *JobOptions) setDefaults() error {
	if o.Rerun != NeverRerun && o.Rerun != Rerun {
		return invalid("JobOptions: unknown RerunPolicy %d", int(o.Rerun))
	}
	if o.Retention < 0 || o.CatchUpWindow < 0 {
		return invalid("JobOptions: Retention (%v) and CatchUpWindow (%v) must not be negative", o.Retention, o.CatchUpWindow)
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.CatchUpWindow == 0 {
		o.CatchUpWindow = DefaultCatchUpWindow
	}
	if o.Retention <= o.CatchUpWindow {
		return invalid("JobOptions: Retention %v must exceed CatchUpWindow %v", o.Retention, o.CatchUpWindow)
	}
	return nil
}

// Attribute names of a job-run item (pk, owner and fence as in the lease
// item). Several are reserved words: expressions use expression attribute
// names throughout.
const (
	attrJob         = "job"
	attrSlot        = "slot"        // S: the slot, RFC 3339 in UTC
	attrClaim       = "claim"       // S: random token of the claim
	attrStatus      = "status"      // S: a RunStatus
	attrStartedAt   = "startedAt"   // N: Unix ms, claimant's clock
	attrFinishedAt  = "finishedAt"  // N: Unix ms
	attrError       = "error"       // S: error text of a failed run
	attrClaims      = "claims"      // N: claims made, 1 + re-runs
	attrMissed      = "missed"      // N: slots found missed by the catch-up; -1: unknown
	attrAbandonedBy = "abandonedBy" // N: fence of the tenure that abandoned it
	attrTrigger     = "trigger"     // S: id of the trigger request of a triggered run
)

// slotID formats a slot for the run item's key: RFC 3339 in UTC, with as
// many fractional digits as it needs (2026-11-30T02:00:00Z). A zero slot,
// or one outside years 0001-9999, is an error wrapping ErrInvalid.
func slotID(slot time.Time) (string, error) {
	if slot.IsZero() {
		return "", invalid("slot is the zero time")
	}
	if y := slot.UTC().Year(); y < 1 || y > 9999 {
		return "", invalid("slot %v is outside years 0001-9999", slot)
	}
	return fmtSlot(slot), nil
}

func runItemKey(job, id string) string { return "jobrun#" + job + "#" + id }

// RunRecord is a job-run item as stored in the table.
type RunRecord struct {
	Job        string
	Slot       time.Time // the slot, in UTC
	Fence      int64     // the claimant's fence
	Owner      string    // the claimant's owner id
	Status     RunStatus
	StartedAt  time.Time // claim time, by the claimant's clock
	FinishedAt time.Time // zero while running
	Error      string    // the error of a failed run
	// Claims counts the claims made on the slot: 1, plus one per re-run.
	Claims int
	// Missed counts the slots that the catch-up before this run skipped
	// and found without a run, after the latest earlier run (RunSchedule).
	// Only slots within CatchUpWindow of the catch-up are looked at: after
	// an outage longer than the window, older slots went unrun uncounted,
	// and a run an old tenure left running there stays running until its
	// item expires. ListRuns shows them.
	Missed int
	// MissedUnknown reports that the catch-up could not read the skipped
	// slots back (Missed is then 0).
	MissedUnknown bool
	// AbandonedBy is the fence of the tenure that marked the run abandoned.
	AbandonedBy int64
	// ExpiresAt is when the item may be deleted (its time to live).
	ExpiresAt time.Time
	// Trigger is the id of the trigger request (Admin.Trigger) of a run
	// made outside the schedule; empty for a schedule slot.
	Trigger string

	claim string
}

// decodeRun reads a run item. Every attribute the protocol relies on must be
// present with the right type; anything else is ErrMalformedItem.
func decodeRun(item map[string]types.AttributeValue) (RunRecord, error) {
	var r RunRecord
	key, _ := str(item, attrPK)
	fail := func(e error) (RunRecord, error) {
		return RunRecord{}, fmt.Errorf("%w: run item %q: %v", ErrMalformedItem, key, e)
	}
	var err error
	if r.Job, err = str(item, attrJob); err != nil {
		return fail(err)
	}
	id, err := str(item, attrSlot)
	if err != nil {
		return fail(err)
	}
	if r.Slot, err = time.Parse(time.RFC3339Nano, id); err != nil {
		return fail(fmt.Errorf("attribute %s is %q, not an RFC 3339 time", attrSlot, id))
	}
	r.Slot = r.Slot.UTC()
	want := runItemKey(r.Job, fmtSlot(r.Slot))
	if _, ok := item[attrTrigger]; ok {
		if r.Trigger, err = str(item, attrTrigger); err != nil {
			return fail(err)
		}
		if !validTriggerID(r.Trigger) {
			return fail(fmt.Errorf("attribute %s is %q, not a trigger id", attrTrigger, r.Trigger))
		}
		want = runItemKey(r.Job, triggerRunID(r.Slot, r.Trigger))
	}
	if key != want {
		return fail(fmt.Errorf("key does not match its job and slot (%q)", want))
	}
	if r.Fence, err = num(item, attrFence); err != nil {
		return fail(err)
	}
	if r.Fence < 1 {
		return fail(fmt.Errorf("fence %d is below 1", r.Fence))
	}
	if r.Owner, err = str(item, attrOwner); err != nil {
		return fail(err)
	}
	if r.claim, err = str(item, attrClaim); err != nil {
		return fail(err)
	}
	st, err := str(item, attrStatus)
	if err != nil {
		return fail(err)
	}
	switch r.Status = RunStatus(st); r.Status {
	case RunRunning, RunSucceeded, RunFailed, RunAbandoned, RunSkippedByPause:
	default:
		return fail(fmt.Errorf("unknown status %q", st))
	}
	ms, err := num(item, attrStartedAt)
	if err != nil {
		return fail(err)
	}
	r.StartedAt = time.UnixMilli(ms)
	if ms, err = optNum(item, attrFinishedAt); err != nil {
		return fail(err)
	} else if ms != 0 {
		r.FinishedAt = time.UnixMilli(ms)
	}
	if _, ok := item[attrError]; ok {
		if r.Error, err = str(item, attrError); err != nil {
			return fail(err)
		}
	}
	var n int64
	if n, err = optNum(item, attrClaims); err != nil {
		return fail(err)
	}
	r.Claims = int(max(n, 1))
	if n, err = optNum(item, attrMissed); err != nil {
		return fail(err)
	}
	switch {
	case n == -1: // written when the catch-up could not count
		r.MissedUnknown = true
	case n < 0:
		return fail(fmt.Errorf("%s %d is below -1", attrMissed, n))
	default:
		r.Missed = int(n)
	}
	if r.AbandonedBy, err = optNum(item, attrAbandonedBy); err != nil {
		return fail(err)
	}
	if n, err = optNum(item, RunTTLAttribute); err != nil {
		return fail(err)
	} else if n != 0 {
		r.ExpiresAt = time.Unix(n, 0)
	}
	return r, nil
}

// JobRun is a claimed run of one slot of a job: the handle that Claim and
// RunSchedule return, with which the claimant records the outcome. Its
// methods are safe for concurrent use.
type JobRun struct {
	l       *Lease
	slot    time.Time
	id      string
	key     map[string]types.AttributeValue
	fence   int64
	claim   string
	started time.Time
	missed  int
	trigger string

	mu       sync.Mutex // held across Finish and Commit
	finished bool
}

// Job returns the job name.
func (r *JobRun) Job() string { return r.l.job }

// Slot returns the slot: the schedule's nominal fire time, in UTC; for a
// triggered run, the time the trigger was requested.
func (r *JobRun) Slot() time.Time { return r.slot }

// Trigger returns the id of the trigger request (Admin.Trigger) of a run
// made outside the schedule, and "" for a schedule slot.
func (r *JobRun) Trigger() string { return r.trigger }

// Fence returns the claimant's fence. Pass it to every guarded write.
func (r *JobRun) Fence() int64 { return r.fence }

// Owner returns the claimant's owner id.
func (r *JobRun) Owner() string { return r.l.opts.Owner }

// StartedAt returns the claim time, by the claimant's clock.
func (r *JobRun) StartedAt() time.Time { return r.started }

// Missed returns how many slots the catch-up before this run skipped and
// found without a run, after the latest earlier run: the slots missed since
// then (RunSchedule; zero for Claim). known is false when the catch-up
// could not read the skipped slots back.
func (r *JobRun) Missed() (n int, known bool) {
	if r.missed < 0 {
		return 0, false
	}
	return r.missed, true
}

// IdempotencyKey returns "<job>#<slot>" ("<job>#<slot>#trigger-<id>" for
// a triggered run), the same for every claim of the slot, whatever the
// fence. A sink that refuses a key it has seen makes the
// slot's effect happen at most once even when the slot is run again (see
// Rerun); pass the fence along as well, so that a stale leader is refused.
func (r *JobRun) IdempotencyKey() string { return r.l.job + "#" + r.id }

func (r *JobRun) isFinished() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.finished
}

// Claim records a run of slot for this handle's tenure, with one
// conditional write of the item jobrun#<job>#<slot>, and returns the run.
// The slot is the schedule's nominal fire time, never time.Now(). Its
// identity is the instant: the key holds it in UTC, RFC 3339 with as many
// fractional digits as it needs (2026-11-30T02:00:00Z); the zero time and
// years outside 0001-9999 are errors wrapping ErrInvalid.
//
// Only the current holder can claim: a handle with no tenure, or past its
// local deadline, gets ErrNotLeader; where the server supports transactions
// the write carries a check that the lease item still names this owner and
// fence, and a deposed holder gets ErrLost (its tenure ends). The write
// succeeds only if the slot has no run, or, under the Rerun policy, a run
// that an older fence left running. Otherwise Claim returns a
// *SlotTakenError (errors.Is(err, ErrSlotTaken)) holding the run found;
// under NeverRerun, a run an older fence left running is first marked
// abandoned. A malformed item in the slot is an error wrapping
// ErrMalformedItem.
//
// The write is retried by the SDK on transient errors; a retry that finds
// its own earlier attempt applied is recognised by the claim's random
// token. A transaction cancelled by a conflict with another write to one
// of its items (a heartbeat renewing the lease item, on DynamoDB) is sent
// again with jittered back-off, under the same ClientRequestToken, until
// Options.CallTimeout has passed since the call began, and never past the
// tenure's local deadline. Claim makes one request (two on the first claim of a Lease whose
// server lacks transactions), plus one to abandon a run and, when the
// outcome of the write is unknown, one consistent read.
func (l *Lease) Claim(ctx context.Context, slot time.Time, optFns ...func(*JobOptions)) (*JobRun, error) {
	o, err := newJobOptions(optFns)
	if err != nil {
		return nil, err
	}
	return l.claim(ctx, slot, &o, randomID(8), 0)
}

func (l *Lease) claim(ctx context.Context, slot time.Time, o *JobOptions, token string, missed int) (*JobRun, error) {
	return l.claimRun(ctx, slot, o, token, missed, claimSpec{})
}

// claimSpec says how claimRun departs from a plain claim (control.go).
type claimSpec struct {
	trigger   string    // a triggered run's trigger id: the run id is triggerRunID
	status    RunStatus // the status written, if not RunRunning: a final one
	reclaimed bool      // a run skipped by a pause may be claimed again
}

func (l *Lease) claimRun(ctx context.Context, slot time.Time, o *JobOptions, token string, missed int, spec claimSpec) (*JobRun, error) {
	id, err := slotID(slot)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	slot = slot.Round(0).UTC()
	slotText := id
	if spec.trigger != "" {
		id = triggerRunID(slot, spec.trigger)
	}
	if spec.status == "" {
		spec.status = RunRunning
	}
	now := l.opts.Now()
	t := l.current()
	if !t.held || !now.Before(t.deadline) {
		return nil, fmt.Errorf("%w: claim %q slot %s", ErrNotLeader, l.job, id)
	}
	key := map[string]types.AttributeValue{attrPK: avS(runItemKey(l.job, id))}
	names := map[string]string{
		"#pk": attrPK, "#job": attrJob, "#slot": attrSlot, "#fence": attrFence, "#owner": attrOwner,
		"#claim": attrClaim, "#status": attrStatus, "#start": attrStartedAt, "#ttl": RunTTLAttribute,
		"#claims": attrClaims, "#missed": attrMissed,
	}
	values := map[string]types.AttributeValue{
		":job": avS(l.job), ":slot": avS(slotText), ":fence": avN(t.fence), ":me": avS(l.opts.Owner),
		":claim": avS(token), ":running": avS(string(RunRunning)), ":now": avN(now.UnixMilli()),
		":ttl": avN(now.Add(o.Retention).Unix()), ":zero": avN(0), ":one": avN(1), ":missed": avN(int64(missed)),
	}
	cond := "attribute_not_exists(#pk)"
	if o.Rerun == Rerun {
		cond += " OR (#status = :running AND #fence < :fence)"
	}
	// A run that may be claimed again is running, so it has none of the
	// attributes a finished run has: nothing needs removing, except from a
	// run skipped by a pause, claimed again for a catch-up.
	update := "SET #job = :job, #slot = :slot, #fence = :fence, #owner = :me, #claim = :claim, " +
		"#status = :st, #start = :now, #ttl = :ttl, #missed = :missed, " +
		"#claims = if_not_exists(#claims, :zero) + :one"
	values[":st"] = avS(string(spec.status))
	if o.Rerun != Rerun {
		delete(values, ":running")
	}
	if spec.status != RunRunning {
		update += ", #fin = :now"
		names["#fin"] = attrFinishedAt
	}
	if spec.trigger != "" {
		update += ", #trig = :trig"
		names["#trig"], values[":trig"] = attrTrigger, avS(spec.trigger)
	}
	if spec.reclaimed {
		cond += " OR #status = :skipped"
		values[":skipped"] = avS(string(RunSkippedByPause))
		if spec.status == RunRunning {
			update += " REMOVE #fin"
			names["#fin"] = attrFinishedAt
		}
	}
	upd := &types.Update{
		TableName:                           aws.String(l.table),
		Key:                                 key,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	run := &JobRun{l: l, slot: slot, id: id, key: key, fence: t.fence, claim: token, started: now.Round(0), missed: missed,
		trigger: spec.trigger, finished: spec.status != RunRunning}
	failed, old, err := l.claimWrite(ctx, t, upd, o)
	switch {
	case errors.Is(err, ErrLost):
		return nil, err
	case err != nil && !retryable(err) && !mismatch(err):
		return nil, fmt.Errorf("ddblease: claim %q slot %s: %w", l.job, id, err)
	case err != nil:
		// The outcome is unknown (or the server saw this request's token
		// before, with other parameters): read the item back.
		rec, present, rerr := l.readRun(ctx, key)
		if rerr == nil && present && rec.claim == token {
			return l.claimed(run), nil
		}
		return nil, fmt.Errorf("ddblease: claim %q slot %s: %w", l.job, id, errors.Join(err, rerr))
	case !failed:
		return l.claimed(run), nil
	}
	rec, present, err := l.runFromFailure(ctx, key, old)
	switch {
	case err != nil:
		return nil, fmt.Errorf("ddblease: claim %q slot %s: %w", l.job, id, err)
	case !present:
		return nil, fmt.Errorf("ddblease: claim %q slot %s: the condition failed but the run item is gone; try again", l.job, id)
	case rec.claim == token:
		return l.claimed(run), nil // an SDK retry of a write that did land
	}
	taken := &SlotTakenError{Run: rec}
	if rec.Status == RunRunning && rec.Fence < t.fence && o.Rerun == NeverRerun {
		var err error
		if taken.Run, taken.Abandoned, err = l.abandon(ctx, rec, t.fence); err != nil {
			l.log.Warn("ddblease: could not mark an orphaned run abandoned", "slot", id, "fence", rec.Fence, "err", err)
		}
	}
	return nil, taken
}

// claimed reports a claimed run.
func (l *Lease) claimed(run *JobRun) *JobRun {
	if run.finished { // control.go: a slot recorded as skipped by a pause
		l.notify.emit(l.event(EventRunFinished, Event{Slot: run.slot, Fence: run.fence, Status: RunSkippedByPause}))
		return run
	}
	l.notify.emit(l.event(EventRunClaimed, Event{Slot: run.slot, Fence: run.fence}))
	return run
}

// claimWrite writes the claim, in a transaction with a check on the lease
// item where the server supports them. failed reports that the run item's
// condition failed, old is the item then returned, if any. A failed check
// on the lease item ends the tenure and returns ErrLost.
func (l *Lease) claimWrite(ctx context.Context, t tenure, upd *types.Update, o *JobOptions) (failed bool, old map[string]types.AttributeValue, err error) {
	if !o.NoTransactions && !l.noTxn.Load() {
		check := &types.ConditionCheck{
			TableName:                           aws.String(l.table),
			Key:                                 l.key,
			ConditionExpression:                 aws.String("#owner = :me AND #fence = :fence"),
			ExpressionAttributeNames:            map[string]string{"#owner": attrOwner, "#fence": attrFence},
			ExpressionAttributeValues:           map[string]types.AttributeValue{":me": avS(l.opts.Owner), ":fence": avN(t.fence)},
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}
		// Conflicts (a heartbeat renewing the lease item as the claim
		// checks it) are retried until CallTimeout has passed, and never
		// past the tenure's local deadline.
		deadline := l.opts.Now().Add(l.opts.CallTimeout)
		if t.deadline.Before(deadline) {
			deadline = t.deadline
		}
		err := transactRetrying(ctx, l.db, []types.TransactWriteItem{{ConditionCheck: check}, {Update: upd}},
			txRetry{now: l.opts.Now, deadline: deadline, timeout: l.opts.CallTimeout})
		if !errors.Is(err, ErrTransactionsUnsupported) {
			if item, ok := conditionFailed(err, 0); ok {
				lost := l.lostError(t.fence, item)
				l.end(t.fence, lost, LossDeposed)
				return false, nil, lost
			}
			if item, ok := conditionFailed(err, 1); ok {
				return true, item, nil
			}
			return false, nil, err
		}
		l.log.Info("ddblease: the server does not support transactions; claims will not check the lease item", "err", err)
		l.noTxn.Store(true)
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                           upd.TableName,
		Key:                                 upd.Key,
		UpdateExpression:                    upd.UpdateExpression,
		ConditionExpression:                 upd.ConditionExpression,
		ExpressionAttributeNames:            upd.ExpressionAttributeNames,
		ExpressionAttributeValues:           upd.ExpressionAttributeValues,
		ReturnValuesOnConditionCheckFailure: upd.ReturnValuesOnConditionCheckFailure,
	}
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	defer cancel()
	_, err = l.db.UpdateItem(cctx, in)
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return true, ccf.Item, nil
	}
	return false, nil, err
}

// lostError describes a failed check on the lease item, from the item the
// server returned with the failure, if any.
func (l *Lease) lostError(fence int64, item map[string]types.AttributeValue) error {
	if rec, err := decodeLease(item); len(item) > 0 && err == nil {
		return fmt.Errorf("%w: %q fence %d: now held by %q with fence %d", ErrLost, l.job, fence, rec.Owner, rec.Fence)
	}
	return fmt.Errorf("%w: %q fence %d: the lease item no longer names this owner and fence", ErrLost, l.job, fence)
}

// runFromFailure decodes the run item returned with a failed condition, or
// reads it when the server returned none.
func (l *Lease) runFromFailure(ctx context.Context, key, item map[string]types.AttributeValue) (RunRecord, bool, error) {
	if len(item) > 0 {
		rec, err := decodeRun(item)
		return rec, err == nil, err
	}
	return l.readRun(ctx, key)
}

// readRun reads a run item with a strongly consistent read, even when ctx
// has ended, so that an applied write is known.
func (l *Lease) readRun(ctx context.Context, key map[string]types.AttributeValue) (RunRecord, bool, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.CallTimeout)
	defer cancel()
	out, err := l.db.GetItem(cctx, &dynamodb.GetItemInput{
		TableName:      aws.String(l.table),
		Key:            key,
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return RunRecord{}, false, fmt.Errorf("ddblease: read run item: %w", err)
	}
	if len(out.Item) == 0 {
		return RunRecord{}, false, nil
	}
	rec, err := decodeRun(out.Item)
	return rec, err == nil, err
}

// abandon marks rec, which an older tenure left running, abandoned by
// fence. ok reports that this call did it; the record returned is the run
// as it now stands, as far as known.
func (l *Lease) abandon(ctx context.Context, rec RunRecord, fence int64) (RunRecord, bool, error) {
	id := fmtSlot(rec.Slot)
	now := l.opts.Now()
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	defer cancel()
	_, err := l.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(l.table),
		Key:                 map[string]types.AttributeValue{attrPK: avS(runItemKey(l.job, id))},
		UpdateExpression:    aws.String("SET #status = :abandoned, #by = :by, #fin = :now"),
		ConditionExpression: aws.String("#status = :running AND #claim = :claim AND #fence = :old"),
		ExpressionAttributeNames: map[string]string{
			"#status": attrStatus, "#by": attrAbandonedBy, "#fin": attrFinishedAt, "#claim": attrClaim, "#fence": attrFence,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":abandoned": avS(string(RunAbandoned)), ":by": avN(fence), ":now": avN(now.UnixMilli()),
			":running": avS(string(RunRunning)), ":claim": avS(rec.claim), ":old": avN(rec.Fence),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		rec.Status, rec.AbandonedBy, rec.FinishedAt = RunAbandoned, fence, time.UnixMilli(now.UnixMilli())
		return rec, true, nil
	case errors.As(err, &ccf):
		if cur, derr := decodeRun(ccf.Item); len(ccf.Item) > 0 && derr == nil {
			return cur, false, nil
		}
		return rec, false, nil
	}
	return rec, false, fmt.Errorf("ddblease: abandon run %q slot %s: %w", l.job, id, err)
}

// Finish records the run's outcome: succeeded when runErr is nil, else
// failed with runErr's text (up to 4 KiB). The write is conditional on the
// item still holding this claim, running: a stale claimant is refused with
// a *StaleFenceError (errors.Is(err, ErrStaleFence)) whose Current is the
// fence of the newer tenure that claimed the slot again (Rerun) or marked
// the run abandoned (NeverRerun). The condition is on the run item only:
// a claimant that lost its lease but whose run no newer tenure touched may
// still record what it did. Finish makes one UpdateItem request, plus a
// consistent read when the server returns no item with a failed condition
// or the outcome is unknown; a write found already applied counts as
// success. Finishing a finished run is an error wrapping ErrInvalid.
func (r *JobRun) Finish(ctx context.Context, runErr error) error {
	runErr = soundError(runErr)
	st := RunSucceeded
	if runErr != nil {
		st = RunFailed
	}
	return r.finish(ctx, st, runErr, nil)
}

// Commit applies items (Put, Update, Delete or ConditionCheck, at most
// MaxCommitItems) and marks the run succeeded in one TransactWriteItems,
// with a check that the lease item still holds the run's fence. Either all
// of it happens or none, which makes the slot's effect happen exactly once
// even under the Rerun policy: a newer tenure re-runs a slot only while its
// run is still running, that is, while its effect is not committed.
//
// items must not act on the lease item or the run's own item (an error
// wrapping ErrInvalid). A stale claimant gets a *StaleFenceError and
// nothing is written; a failed condition among items is returned as the
// SDK's TransactionCanceledException, whose CancellationReasons list the
// lease check first, then the run's update, then items in order. A server
// without transactions gets an error wrapping ErrTransactionsUnsupported.
//
// A transaction cancelled by a conflict with another write to one of its
// items (a heartbeat renewing the lease item, on DynamoDB) is sent again
// with jittered back-off, under the same ClientRequestToken, until
// Options.CallTimeout has passed since the call began or ctx ends; then
// the error says so and wraps the last TransactionCanceledException, and
// the run stays running. Whatever the failure, the run item is read back:
// a commit found applied (an earlier attempt whose answer was lost)
// counts as success.
func (r *JobRun) Commit(ctx context.Context, items []types.TransactWriteItem) error {
	if len(items) == 0 || len(items) > MaxCommitItems {
		return invalid("Commit: %d items; between 1 and %d are allowed", len(items), MaxCommitItems)
	}
	if i := onItem(items, r.l.table, r.l.key); i >= 0 {
		return invalid("Commit: item %d acts on the job's lease item", i)
	}
	if i := onItem(items, r.l.table, r.key); i >= 0 {
		return invalid("Commit: item %d acts on the run's own item", i)
	}
	return r.finish(ctx, RunSucceeded, nil, items)
}

func (r *JobRun) finish(ctx context.Context, st RunStatus, runErr error, items []types.TransactWriteItem) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.l
	what := "finish"
	if items != nil {
		what = "commit"
	}
	if r.finished {
		return invalid("%s: run %q slot %s is already finished", what, l.job, r.id)
	}
	names := map[string]string{"#status": attrStatus, "#fin": attrFinishedAt, "#claim": attrClaim, "#fence": attrFence}
	values := map[string]types.AttributeValue{
		":st": avS(string(st)), ":now": avN(l.opts.Now().UnixMilli()), ":claim": avS(r.claim),
		":fence": avN(r.fence), ":running": avS(string(RunRunning)),
	}
	update := "SET #status = :st, #fin = :now"
	if runErr != nil {
		update += ", #err = :err"
		names["#err"] = attrError
		values[":err"] = avS(errorText(runErr))
	}
	upd := &types.Update{
		TableName:                           aws.String(l.table),
		Key:                                 r.key,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String("#fence = :fence AND #claim = :claim AND #status = :running"),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	var err error
	if items == nil {
		err = r.finishWrite(ctx, upd, st)
	} else {
		err = r.commitWrite(ctx, upd, items)
	}
	if err == nil {
		r.finished = true
		now := l.opts.Now()
		l.notify.emit(l.event(EventRunFinished, Event{Slot: r.slot, Fence: r.fence, Status: st, Err: runErr,
			Duration: now.Sub(r.started)}))
		return nil
	}
	return fmt.Errorf("ddblease: %s run %q slot %s: %w", what, l.job, r.id, err)
}

// finishWrite applies the run's final update with a plain conditional write.
func (r *JobRun) finishWrite(ctx context.Context, upd *types.Update, st RunStatus) error {
	l := r.l
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	_, err := l.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName:                           upd.TableName,
		Key:                                 upd.Key,
		UpdateExpression:                    upd.UpdateExpression,
		ConditionExpression:                 upd.ConditionExpression,
		ExpressionAttributeNames:            upd.ExpressionAttributeNames,
		ExpressionAttributeValues:           upd.ExpressionAttributeValues,
		ReturnValuesOnConditionCheckFailure: upd.ReturnValuesOnConditionCheckFailure,
	})
	cancel()
	if err == nil {
		return nil
	}
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return r.refused(ctx, ccf.Item, st)
	}
	// Unknown outcome: the item tells whether the write landed.
	if rec, present, rerr := l.readRun(ctx, r.key); rerr == nil && present && rec.claim == r.claim && rec.Status == st {
		return nil
	}
	return err
}

// commitWrite applies the run's final update, the user's items and a check
// on the lease item's fence in one transaction.
func (r *JobRun) commitWrite(ctx context.Context, upd *types.Update, items []types.TransactWriteItem) error {
	l := r.l
	all := make([]types.TransactWriteItem, 0, len(items)+2)
	all = append(all, types.TransactWriteItem{ConditionCheck: fenceCheck(l.table, l.key, r.fence)}, types.TransactWriteItem{Update: upd})
	all = append(all, items...)
	err := transactRetrying(ctx, l.db, all, txRetry{now: l.opts.Now, deadline: l.opts.Now().Add(l.opts.CallTimeout), timeout: l.opts.CallTimeout})
	if err == nil || errors.Is(err, ErrTransactionsUnsupported) {
		return err
	}
	// Whatever failed, the run item tells whether the transaction landed
	// (an SDK retry of a transaction that was applied).
	rec, present, rerr := l.readRun(ctx, r.key)
	if rerr == nil && present && rec.claim == r.claim && rec.Status == RunSucceeded {
		return nil
	}
	if item, ok := conditionFailed(err, 0); ok {
		cur, cerr := fenceOf(item)
		if cerr != nil || len(item) == 0 {
			cur, cerr = readFence(ctx, l.db, l.table, l.key, l.opts.CallTimeout)
		}
		return errors.Join(&StaleFenceError{Job: l.job, Fence: r.fence, Current: cur, err: err}, cerr)
	}
	if _, ok := conditionFailed(err, 1); ok && rerr == nil {
		return r.refusedRecord(rec, present, RunSucceeded, err)
	}
	return errors.Join(err, rerr)
}

// refused explains a failed condition on the run item, given the item the
// server returned with the failure (read back if none).
func (r *JobRun) refused(ctx context.Context, item map[string]types.AttributeValue, st RunStatus) error {
	rec, present, err := r.l.runFromFailure(ctx, r.key, item)
	if err != nil {
		return err
	}
	return r.refusedRecord(rec, present, st, nil)
}

func (r *JobRun) refusedRecord(rec RunRecord, present bool, st RunStatus, cause error) error {
	switch {
	case !present:
		return fmt.Errorf("%w: the run item is gone", ErrLost)
	case rec.claim != r.claim:
		return &StaleFenceError{Job: r.l.job, Fence: r.fence, Current: rec.Fence, err: cause}
	case rec.Status == st:
		return nil // an SDK retry of a write that did land
	case rec.Status == RunAbandoned:
		return &StaleFenceError{Job: r.l.job, Fence: r.fence, Current: rec.AbandonedBy, err: cause}
	}
	return invalid("the run is already %s", rec.Status)
}

// errorText returns err's text fit for a run item: valid UTF-8, not empty,
// at most maxErrorText bytes.
func errorText(err error) string {
	s := strings.ToValidUTF8(soundError(err).Error(), "\uFFFD")
	if s == "" {
		return fmt.Sprintf("%T with an empty message", err)
	}
	if len(s) <= maxErrorText {
		return s
	}
	cut := maxErrorText - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// ListRuns returns the runs recorded for the slots of sched from from to to,
// both included, in slot order; slots without a run are left out. It reads
// the slots' items by key with strongly consistent BatchGetItem requests:
// one request per 100 slots (each slot costs a read unit, found or not),
// and at most MaxListSlots slots per call, so the cost does not grow with
// the table. Runs it cannot decode are left out and reported in an error
// wrapping ErrMalformedItem, returned with the others. It needs no tenure:
// an operator's tool may list with a handle made by New just for that.
func (l *Lease) ListRuns(ctx context.Context, sched Schedule, from, to time.Time) ([]RunRecord, error) {
	if err := checkSchedule(sched); err != nil {
		return nil, fmt.Errorf("ListRuns: %w", err)
	}
	if from.IsZero() || to.IsZero() || to.Before(from) {
		return nil, invalid("ListRuns: from (%v) and to (%v) must be set, from not after to", from, to)
	}
	var ids []string
	for s := from.Add(-time.Nanosecond); ; {
		next, err := nextSlot(sched, s)
		if err != nil {
			return nil, fmt.Errorf("ListRuns: %w", err)
		}
		if next.IsZero() || next.After(to) {
			break
		}
		if len(ids) == MaxListSlots {
			return nil, invalid("ListRuns: %s to %s holds more than %d slots", fmtSlot(from), fmtSlot(to), MaxListSlots)
		}
		id, err := slotID(next)
		if err != nil {
			return nil, fmt.Errorf("ListRuns: %w", err)
		}
		ids = append(ids, id)
		s = next
	}
	items, err := l.getRuns(ctx, ids)
	if err != nil {
		return nil, err
	}
	var runs []RunRecord
	var errs []error
	for _, id := range ids {
		if item, ok := items[runItemKey(l.job, id)]; ok {
			rec, err := decodeRun(item)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			runs = append(runs, rec)
		}
	}
	return runs, errors.Join(errs...)
}

// getRuns reads the run items of the slots ids with strongly consistent
// BatchGetItem requests, and returns them by key.
func (l *Lease) getRuns(ctx context.Context, ids []string) (map[string]map[string]types.AttributeValue, error) {
	found := make(map[string]map[string]types.AttributeValue)
	for start := 0; start < len(ids); start += 100 {
		keys := make([]map[string]types.AttributeValue, 0, 100)
		for _, id := range ids[start:min(start+100, len(ids))] {
			keys = append(keys, map[string]types.AttributeValue{attrPK: avS(runItemKey(l.job, id))})
		}
		req := map[string]types.KeysAndAttributes{l.table: {Keys: keys, ConsistentRead: aws.Bool(true)}}
		bo := fixed(l.opts.RetryInterval)
		for round := 0; len(req) > 0; round++ {
			if round > 0 {
				if round > 10 {
					return nil, fmt.Errorf("ddblease: list runs %q: keys still unprocessed after %d rounds", l.job, round)
				}
				if err := bo.wait(ctx); err != nil {
					return nil, fmt.Errorf("ddblease: list runs %q: %w", l.job, err)
				}
			}
			cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
			out, err := l.db.BatchGetItem(cctx, &dynamodb.BatchGetItemInput{RequestItems: req})
			cancel()
			if err != nil {
				return nil, fmt.Errorf("ddblease: list runs %q: %w", l.job, err)
			}
			for _, item := range out.Responses[l.table] {
				if k, err := str(item, attrPK); err == nil {
					found[k] = item
				}
			}
			req = out.UnprocessedKeys
		}
	}
	return found, nil
}
