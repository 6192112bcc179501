package ddblease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the claim of a run: Lease.Claim, and the claim value whose
// steps write the run item under a tenure's fence.

// Claim records a run of slot for this handle's tenure, with one
// conditional write of the slot's run item (in the job's partition, sort
// key run#<slot>: see Layout), and returns the run. The slot is the
// schedule's nominal fire time, never time.Now(). Its identity is the
// instant: its id (JobRun.ID) is the slot in UTC, RFC 3339 with as many
// fractional digits as it needs (2026-11-30T02:00:00Z); the zero time and
// years outside 0001-9999 are errors wrapping ErrInvalid.
//
// Only the current holder can claim: a handle with no tenure, or past its
// local deadline by Options.Now or by the runtime's clock, gets
// ErrNotLeader; where the server supports transactions
// the write carries a check that the lease item still names this owner and
// fence, and a deposed holder gets ErrLost (its tenure ends). The write
// succeeds only if the slot has no run, or, under the Rerun policy, a run
// that an older fence left running. Otherwise Claim returns a
// *SlotTakenError (errors.Is(err, ErrSlotTaken)) holding the run found;
// under NeverRerun, a run an older fence left running is first marked
// abandoned. A malformed item in the slot is an error wrapping
// ErrMalformedItem. A claim answered once the tenure no longer leads by
// both clocks (a slow answer, a paused process) returns an error wrapping
// ErrNotLeader, not the run: the run is left running under this tenure's
// fence, for a newer tenure to find (RunSchedule's catch-up marks it
// abandoned).
//
// The write is retried by the SDK on transient errors; a retry that finds
// its own earlier attempt applied is recognised by the claim's random
// token and this tenure's fence. A transaction cancelled by a conflict with another write to one
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
	t := l.current()
	if t == nil {
		return nil, fmt.Errorf("%w: claim %q", ErrNotLeader, l.job)
	}
	return t.claim(ctx, slot, &o, randomID(8), 0, claimSpec{})
}

// claimSpec says how claimRun departs from a plain claim (control.go).
type claimSpec struct {
	trigger   string    // a triggered run's trigger id: the run id is triggerRunID
	status    RunStatus // the status written, if not RunRunning: a final one
	reclaimed bool      // a run skipped by a pause may be claimed again
	// pause is what the claim checks of the operator's pause, with the
	// lease's fence, at the instant of the write (in the transaction, or by
	// a consistent read just before it where there is none): a refusal for
	// that reason is errPaused.
	pause pauseCheck
	// unswept lists slots whose runs an older tenure may have left
	// running, not yet marked abandoned: the claim records them in the run
	// item, so that the catch-up of a later tenure that stops at this run
	// reads them back (catchup.go).
	unswept []string
	// skippedIn is, for a run recorded skipped by a pause (status
	// RunSkippedByPause), when that pause began (Unix ms; 0 unknown).
	skippedIn int64
	// overSkip, set (Unix ms) for a slot found recorded skipped by the pause
	// that began then, though it came due after that pause began: the claim
	// may replace that record if the check finds that pause the latest one
	// and the slot outside it (it came due after the resumption: the skip
	// was recorded by a wall clock ahead).
	overSkip int64
}

// condition returns the part of the lease check that the claim adds to the
// owner and fence, and sets its names and values.
func (s claimSpec) condition(slot time.Time, names map[string]string, values map[string]types.AttributeValue) string {
	cond := s.pause.condition(slot, names, values)
	if s.overSkip != 0 {
		names["#pat"], values[":over"] = attrPausedAt, avN(s.overSkip)
		cond += " AND #pat = :over"
	}
	return cond
}

// refuses reports whether the lease check refuses the claim of slot under
// the controls c: the pause check does, or the skip to replace is no
// longer the latest pause's.
func (s claimSpec) refuses(c Control, slot time.Time) bool {
	return s.pause.refuses(c, slot) || s.overSkip != 0 && c.PausedAt.UnixMilli() != s.overSkip
}

// pauseCheck says what a claim checks of the operator's pause.
type pauseCheck uint8

const (
	pauseIgnored pauseCheck = iota // triggers, the adapters' claims
	pauseNow                       // the job is not paused (a resumption's catch-up)
	// pauseSlot: the job is not paused, and the slot did not come due
	// during the latest pause (RunSchedule's slots: a slot whose claim was
	// retried across a pause, or that came due in a pause no leader saw,
	// is skipped rather than fired after the resumption).
	pauseSlot
)

// condition returns the part of the lease check that p adds, and sets its
// names and values.
func (p pauseCheck) condition(slot time.Time, names map[string]string, values map[string]types.AttributeValue) string {
	if p == pauseIgnored {
		return ""
	}
	names["#paused"] = attrPaused
	values[":true"] = &types.AttributeValueMemberBOOL{Value: true}
	cond := " AND NOT #paused = :true"
	if p == pauseSlot {
		names["#pat"], names["#rat"] = attrPausedAt, attrResumedAt
		values[":slotms"] = avN(slot.UnixMilli())
		cond += " AND NOT (#pat <= :slotms AND #rat >= :slotms)"
	}
	return cond
}

// refuses reports whether p refuses a claim of slot under the controls c.
func (p pauseCheck) refuses(c Control, slot time.Time) bool {
	switch {
	case p == pauseIgnored:
		return false
	case c.Paused:
		return true
	}
	ms := slot.UnixMilli()
	return p == pauseSlot && !c.PausedAt.IsZero() && !c.ResumedAt.IsZero() &&
		c.PausedAt.UnixMilli() <= ms && c.ResumedAt.UnixMilli() >= ms
}

// claim is Claim under this term, with the given token (one per firing,
// reused by its retries) and claimSpec.
func (t *term) claim(ctx context.Context, slot time.Time, o *JobOptions, token string, missed int, spec claimSpec) (*JobRun, error) {
	l := t.l
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
	if !t.leads() {
		return nil, fmt.Errorf("%w: claim %q slot %s", ErrNotLeader, l.job, id)
	}
	sn := t.snapshot()
	c := claim{tm: t, t: sn, o: o, spec: spec, slot: slot, id: id, token: token}
	key := l.opts.Layout.runKey(l.job, runSK(slot, spec.trigger))
	upd := c.update(key, slotText, now, missed)
	run := &JobRun{l: l, slot: slot, id: id, key: key, fence: sn.fence, claim: token, started: now.Round(0), missed: missed,
		trigger: spec.trigger, finished: spec.status != RunRunning}
	actions, resent, err := c.write(ctx, upd)
	if errors.Is(err, ErrLost) || errors.Is(err, errPaused) {
		return nil, err
	}
	w := condWrite{db: l.db, actions: actions, watch: len(actions) - 1, timeout: l.opts.CallTimeout,
		mine: func(item map[string]types.AttributeValue) bool {
			rec, err := decodeRun(l.opts.Layout, item)
			return len(item) > 0 && err == nil && mine(rec, token, sn.fence)
		}}.resolve(ctx, nil, err)
	if err := c.checked(w, len(actions) == 2, resent, run); err != nil {
		return nil, err
	}
	switch {
	case w.outcome == applied:
		return t.claimed(run) // perhaps an SDK retry of a write that did land
	case w.outcome == refused && w.rerr != nil:
		// Refused, and the run item could not be read to tell why: nothing
		// was written, and the claim is tried again (as the read's failure
		// says), not given up as a refusal.
		return nil, fmt.Errorf("ddblease: claim %q slot %s: refused, and the run item could not be read to tell why: %w", l.job, id, w.rerr)
	case w.outcome != refused || w.rerr != nil:
		return nil, fmt.Errorf("ddblease: claim %q slot %s: %w", l.job, id, errors.Join(err, w.rerr))
	}
	return nil, c.refused(ctx, w.item)
}

// update is the claim's write to the run item: it creates the run,
// running under this tenure's fence with the claim's token, on condition
// that no run of the slot exists, or that the one there may be claimed
// again (a running run of an older fence under the Rerun policy; a run
// skipped by a pause, as spec says).
func (c claim) update(key map[string]types.AttributeValue, slotText string, now time.Time, missed int) *types.Update {
	l, fence, token, o, spec := c.tm.l, c.t.fence, c.token, c.o, c.spec
	names := map[string]string{
		"#pk": l.opts.Layout.PartitionKey, "#job": attrJob, "#slot": attrSlot, "#fence": attrFence, "#owner": attrOwner,
		"#claim": attrClaim, "#status": attrStatus, "#start": attrStartedAt, "#ttl": RunTTLAttribute,
		"#claims": attrClaims, "#missed": attrMissed,
	}
	values := map[string]types.AttributeValue{
		":job": avS(l.job), ":slot": avS(slotText), ":fence": avN(fence), ":me": avS(l.opts.Owner),
		":claim": avS(token), ":running": avS(string(RunRunning)), ":now": avN(now.UnixMilli()),
		":ttl": avN(now.Add(o.Retention).Unix()), ":zero": avN(0), ":one": avN(1), ":missed": avN(int64(missed)),
		":st": avS(string(spec.status)),
	}
	cond := "attribute_not_exists(#pk)"
	if o.Rerun == Rerun {
		cond += " OR (#status = :running AND #fence < :fence)"
	} else {
		delete(values, ":running")
	}
	update := "SET #job = :job, #slot = :slot, #fence = :fence, #owner = :me, #claim = :claim, " +
		"#status = :st, #start = :now, #ttl = :ttl, #missed = :missed, " +
		"#claims = if_not_exists(#claims, :zero) + :one" + spec.claimFields(names, values)
	if spec.reclaimed || spec.overSkip != 0 {
		// A run skipped by a pause is claimed again: by the resumption's
		// catch-up, or when it came due after that pause (claimSpec).
		if spec.reclaimed {
			cond += " OR #status = :skipped"
		} else {
			cond += " OR (#status = :skipped AND #skin = :over)"
			values[":over"] = avN(spec.overSkip)
		}
		values[":skipped"] = avS(string(RunSkippedByPause))
	}
	return &types.Update{
		TableName:                           aws.String(l.table),
		Key:                                 key,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}

// claimFields returns the part of the claim's SET that depends on spec,
// and sets its names and values. A run that may be claimed again is
// running, so it has none of the attributes a finished run has, except a
// run skipped by a pause: its finish time and pause are overwritten, with
// zero ("none", as decodeRun reads them) where the claim has none to
// write. They are not removed: a server that ignores REMOVE (minidyn
// v0.8.2 does) would keep them.
func (s claimSpec) claimFields(names map[string]string, values map[string]types.AttributeValue) string {
	over := s.reclaimed || s.overSkip != 0
	var update string
	switch {
	case s.status != RunRunning:
		update += ", #fin = :now"
		names["#fin"] = attrFinishedAt
	case over:
		update += ", #fin = :zero"
		names["#fin"] = attrFinishedAt
	}
	if s.trigger != "" {
		update += ", #trig = :trig"
		names["#trig"], values[":trig"] = attrTrigger, avS(s.trigger)
	}
	if len(s.unswept) > 0 {
		update += ", #unswept = :unswept"
		names["#unswept"], values[":unswept"] = attrUnswept, &types.AttributeValueMemberSS{Value: s.unswept}
	}
	switch {
	case s.skippedIn != 0:
		update += ", #skin = :skin"
		names["#skin"], values[":skin"] = attrSkippedIn, avN(s.skippedIn)
	case over:
		update += ", #skin = :zero"
		names["#skin"] = attrSkippedIn
	}
	return update
}

// checked judges the check on the lease item of a claim sent in a
// transaction (checked), once the write is resolved (w): nil when the
// claim may go on to its outcome, or the error that ends it.
func (c claim) checked(w written, checked, resent bool, run *JobRun) error {
	tm, l, spec, id := c.tm, c.tm.l, c.spec, c.id
	if _, ok := w.fails[0]; ok && checked && w.outcome != applied {
		// The check on the lease item failed: the item, returned or read
		// back, tells a pause from a loss.
		item, err := w.stored(0)
		if err == nil {
			if err = tm.checkLease(item, spec, run.slot); err == nil {
				err = errors.New("the lease item changed while the claim checked it; try again")
			}
		}
		if errors.Is(err, ErrLost) || errors.Is(err, errPaused) {
			return err
		}
		return fmt.Errorf("ddblease: claim %q slot %s: %w", l.job, id, err)
	}
	if w.outcome != applied || w.err == nil && !resent || !checked || spec.pause != pauseSlot || run.finished {
		return nil
	}
	// The run item is this claim's, but perhaps not by this attempt's
	// check: an earlier attempt landed, its answer lost, at an instant not
	// known (the item showed it, or DynamoDB answered the resent token
	// without checking again). A slot whose claim was being retried as a
	// pause began is skipped, so the lease is checked as of now (the item
	// returned with the failure, or read back) before fn may run.
	item, err := w.stored(0)
	if err == nil {
		err = tm.checkLease(item, spec, run.slot)
	}
	if errors.Is(err, errPaused) || errors.Is(err, ErrLost) {
		return err
	}
	if err != nil {
		// Whether the job is paused is not known: fn does not run on that.
		// The claim is tried again (it finds its own run), or given up
		// with the firing, and its run marked abandoned.
		return fmt.Errorf("ddblease: claim %q slot %s: the claim landed, but the lease item could not be read to check for a pause: %w", l.job, id, err)
	}
	return nil
}

// refused returns the error of a claim refused by the run item
// (item, as stored): the slot is taken. A run that an older tenure left
// running is marked abandoned on the way, under NeverRerun.
func (c claim) refused(ctx context.Context, item map[string]types.AttributeValue) error {
	tm, l, fence, o, id := c.tm, c.tm.l, c.t.fence, c.o, c.id
	if len(item) == 0 {
		return fmt.Errorf("ddblease: claim %q slot %s: the condition failed but the run item is gone; try again", l.job, id)
	}
	rec, err := decodeRun(l.opts.Layout, item)
	if err != nil {
		return fmt.Errorf("ddblease: claim %q slot %s: %w", l.job, id, err)
	}
	taken := &SlotTakenError{Run: rec}
	if rec.orphanFor(fence) && o.Rerun == NeverRerun {
		var err error
		if taken.Run, taken.Abandoned, err = tm.abandon(ctx, rec); err != nil {
			l.log().Warn("ddblease: could not mark an orphaned run abandoned", "slot", id, "fence", rec.Fence, "err", err)
		}
	}
	return taken
}

// claim is one claim of a run under a tenure, from its write to its
// answer: the tenure as it stood when the claim began (t), the slot and
// the run's id, the claim's token, the options and what the claim checks
// (spec). Its methods are the claim's steps; term.claim makes one.
type claim struct {
	tm    *term
	t     tenure
	o     *JobOptions
	spec  claimSpec
	slot  time.Time
	id    string
	token string
}

// claimed reports a claimed run, once the answer is in: unless the tenure
// still leads by both clocks (its deadline may have passed while the claim
// was in flight: a slow answer, a paused process), the run is not handed
// out, and is left running for a newer tenure to find.
func (t *term) claimed(run *JobRun) (*JobRun, error) {
	l := t.l
	if run.finished { // jobrunner.go: a slot recorded as skipped by a pause
		l.notify.emit(l.event(EventRunFinished, Event{Slot: run.slot, Fence: run.fence, Status: RunSkippedByPause}))
		return run, nil
	}
	if !t.leads() {
		return nil, fmt.Errorf("%w: claim %q slot %s: %w", ErrNotLeader, l.job, run.id, errClaimedLate)
	}
	l.notify.emit(l.event(EventRunClaimed, Event{Slot: run.slot, Fence: run.fence}))
	return run, nil
}

// write writes the claim, in a transaction with a check on the lease
// item where the server supports them, and returns the write's actions
// (the run's update last) and its error, for condWrite.
func (c claim) write(ctx context.Context, upd *types.Update) ([]types.TransactWriteItem, bool, error) {
	tm, l, t, o, spec, slot := c.tm, c.tm.l, c.t, c.o, c.spec, c.slot
	if !o.NoTransactions && !l.noTxn.Load() {
		check := &types.ConditionCheck{
			TableName:                           aws.String(l.table),
			Key:                                 l.opts.Layout.leaseKey(l.job),
			ConditionExpression:                 aws.String("#owner = :me AND #fence = :fence"),
			ExpressionAttributeNames:            map[string]string{"#owner": attrOwner, "#fence": attrFence},
			ExpressionAttributeValues:           map[string]types.AttributeValue{":me": avS(l.opts.Owner), ":fence": avN(t.fence)},
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}
		*check.ConditionExpression += spec.condition(slot, check.ExpressionAttributeNames, check.ExpressionAttributeValues)
		// Conflicts (a heartbeat renewing the lease item as the claim
		// checks it) are retried until CallTimeout has passed, and never
		// past the tenure's local deadline.
		deadline := l.opts.Now().Add(l.opts.CallTimeout)
		if t.deadline.Before(deadline) {
			deadline = t.deadline
		}
		actions := []types.TransactWriteItem{{ConditionCheck: check}, {Update: upd}}
		resent, err := transactRetrying(ctx, l.db, actions, retrier{now: l.opts.Now, deadline: deadline, timeout: l.opts.CallTimeout})
		if !errors.Is(err, ErrTransactionsUnsupported) {
			return actions, resent, err
		}
		l.log().Info("ddblease: the server does not support transactions; claims will not check the lease item", "err", err)
		l.noTxn.Store(true)
	}
	plain := []types.TransactWriteItem{{Update: upd}}
	if spec.pause != pauseIgnored {
		// No transaction: the pause (and the fence, which the keeper checks
		// too) is read just before the write.
		item, err := getItem(ctx, l.db, l.table, l.opts.Layout.leaseKey(l.job), l.opts.CallTimeout)
		if err != nil {
			return plain, false, fmt.Errorf("read lease %q: %w", l.job, err)
		}
		if err := tm.checkLease(item, spec, slot); err != nil {
			return plain, false, err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	defer cancel()
	_, err := l.db.UpdateItem(cctx, updateItemInput(upd))
	return plain, false, err
}

// checkLease judges the lease item as the table holds it, seen by a
// claim's check (empty: there is none): nil when it names this owner and
// fence and the pause check passes, errPaused when it refuses, and
// otherwise ErrLost, ending the tenure.
func (t *term) checkLease(item map[string]types.AttributeValue, spec claimSpec, slot time.Time) error {
	l := t.l
	lost := fmt.Errorf("%w: %q fence %d: the lease item no longer names this owner and fence", ErrLost, l.job, t.fence)
	if rec, err := decodeLease(l.opts.Layout, item); len(item) > 0 && err == nil {
		if rec.Owner == l.opts.Owner && rec.Fence == t.fence {
			if spec.refuses(rec.Control, slot) {
				var at int64
				if !rec.Control.PausedAt.IsZero() {
					at = rec.Control.PausedAt.UnixMilli()
				}
				return pausedError{pausedAt: at}
			}
			return nil
		}
		lost = movedOn(l.job, t.fence, rec)
	}
	t.end(lost, LossDeposed)
	return lost
}

// abandon marks rec, which an older tenure left running (or this one gave
// up), abandoned by this tenure. ok reports that this call did it; the
// record returned is the run as it now stands, as far as known.
func (t *term) abandon(ctx context.Context, rec RunRecord) (RunRecord, bool, error) {
	l, fence := t.l, t.fence
	id := rec.runID()
	now := l.opts.Now()
	key := l.opts.Layout.runKey(l.job, runSK(rec.Slot, rec.Trigger))
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	defer cancel()
	_, err := l.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(l.table),
		Key:                 key,
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
	item, refused := failedConditions(err)[0]
	switch {
	case err == nil:
		rec.Status, rec.AbandonedBy, rec.FinishedAt = RunAbandoned, fence, time.UnixMilli(now.UnixMilli())
		return rec, true, nil
	case refused:
		if cur, derr := decodeRun(l.opts.Layout, item); len(item) > 0 && derr == nil {
			return cur, false, nil
		}
		return rec, false, nil
	}
	return rec, false, fmt.Errorf("ddblease: abandon run %q slot %s: %w", l.job, id, err)
}
