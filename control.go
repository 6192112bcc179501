package ddblease

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the runner's handling of the operator's controls in the
// lease item (pause, resume and its catch-up, triggers) before each step
// of RunSchedule; the controls' attributes and their decoding are
// leaseitem.go's, the keeper's reaction to them heartbeat.go's.

// ResignRequested reports whether the lease item, as this handle last saw
// it, asks its current tenure to resign (see Admin.RequestResign). Run and
// RunSchedule honour the request by themselves at the next heartbeat; code
// that drives TryAcquire and Heartbeat itself checks it after each
// heartbeat and calls Resign.
func (l *Lease) ResignRequested() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.ten
	return t != nil && !t.ends.overLocked() && l.obs.present && l.obs.rec.Fence == t.fence && l.obs.rec.control().ResignFence == t.fence
}

// lookIfAsked reads the controls when the runner was woken, or its tenure
// just began.
func (r *runner) lookIfAsked(ctx context.Context, tn *term) error {
	if !r.ctl.look {
		return nil
	}
	r.ctl.look = false
	_, known, err := r.control(ctx, tn)
	if !known && err == nil && ctx.Err() == nil {
		// Not read (a transient error): look again after a
		// RetryInterval (due), rather than wait for the controls to
		// change again.
		r.ctl.look = true
	}
	return err
}

// control reads the lease item with a strongly consistent read, runs the
// pending triggers and catch-up, and returns whether the job is paused.
// known is false when the item could not be read (a transient error, or a
// malformed item: logged). err is set only when the campaign must stop.
func (r *runner) control(ctx context.Context, tn *term) (paused, known bool, err error) {
	l := r.l
	item, err := getItem(ctx, l.db, l.table, l.opts.Layout.leaseKey(l.job), l.opts.CallTimeout)
	switch {
	case ctx.Err() != nil:
		return false, false, nil
	case err != nil && retryable(err):
		l.log().Warn("ddblease: could not read the operator controls", "err", err)
		return false, false, nil
	case err != nil:
		return false, false, fmt.Errorf("ddblease: read lease %q: %w", l.job, err)
	case len(item) == 0:
		return r.ctl.paused, true, nil // the tenure is over: the claim will say so
	}
	rec, err := decodeLease(l.opts.Layout, item)
	if err != nil {
		l.log().Error("ddblease: the lease item is malformed", "err", err)
		return false, false, nil
	}
	if rec.Fence != tn.fence {
		// The tenure is over; the keeper ends it soon. Without a
		// transaction, a claim would rest on the local tenure alone.
		return false, false, nil
	}
	c := rec.Control
	l.ctl.note(c)
	select { // what we just read needs no second look
	case <-l.ctl.ch():
	default:
	}
	if r.ctl.paused != c.Paused {
		l.log().Info("ddblease: operator pause changed", "paused", c.Paused, "pausedBy", c.PausedBy, "resumedBy", c.ResumedBy)
	}
	r.ctl.paused = c.Paused
	trs, _ := pendingTriggers(item) // decodeLease checked them
	for _, tr := range trs {
		if ctx.Err() != nil {
			return c.Paused, true, nil
		}
		if err := r.runTrigger(ctx, tn, tr); err != nil {
			return c.Paused, true, err
		}
	}
	if c.catchUp != "" && !c.Paused && ctx.Err() == nil {
		if err := r.catchUp(ctx, tn, c); err != nil {
			return c.Paused, true, err
		}
	}
	return c.Paused, true, nil
}

// token returns the claim token used for the request id, the same on every
// attempt, so that a claim whose answer was lost is recognised.
func (r *runner) token(id string) string {
	if r.ctl.tokens == nil {
		r.ctl.tokens = map[string]string{}
	}
	if t, ok := r.ctl.tokens[id]; ok {
		return t
	}
	if len(r.ctl.tokens) > maxSweep {
		clear(r.ctl.tokens)
	}
	t := randomID(8)
	r.ctl.tokens[id] = t
	return t
}

// runTrigger runs a triggered run through the one run protocol (execute),
// then clears its request once the run is settled. A run not settled
// (its claim given up, its outcome not recorded, the tenure over) leaves
// the request pending: this tenure looks again after a RetryInterval
// (unless fn ran for it: then only a newer tenure's claim, which finds the
// run it left).
func (r *runner) runTrigger(ctx context.Context, tn *term, tr pendingTrigger) error {
	token := r.token(tr.id)
	done, err := r.execute(ctx, tn, plannedRun{what: "triggered run", slot: tr.slot, token: token,
		spec: claimSpec{trigger: tr.id}})
	if err != nil || !done {
		r.ctl.look = r.ctl.look || err == nil && ctx.Err() == nil && !r.ran[token]
		return err
	}
	r.clearControl(ctx, "REMOVE #tr.#id", "", map[string]string{"#tr": attrTriggers, "#id": tr.id}, map[string]types.AttributeValue{})
	delete(r.ctl.tokens, tr.id)
	return nil
}

// catchUp runs the latest slot that fell due during the pause that c ended,
// claiming again its run skipped by the pause, through the one run
// protocol, then clears the request once the run is settled.
func (r *runner) catchUp(ctx context.Context, tn *term, c Control) error {
	l := r.l
	if !c.PausedAt.IsZero() && !c.ResumedAt.IsZero() {
		first, err := nextSlot(r.sched, c.PausedAt)
		if err == nil && !first.IsZero() && !first.After(c.ResumedAt) {
			var latest time.Time
			if latest, _, _, err = r.dueSlots(first, c.ResumedAt); err == nil {
				// The slots before it were in the pause, or before it: their
				// count is not known.
				token := r.token(c.catchUp)
				done, err := r.execute(ctx, tn, plannedRun{what: "catch-up", slot: latest, token: token, missed: -1,
					spec: claimSpec{reclaimed: true, pause: pauseNow}})
				if err != nil || !done {
					r.ctl.look = r.ctl.look || err == nil && ctx.Err() == nil && !r.ran[token]
					return err
				}
				// r.last is left alone: the schedule's own catch-up still
				// reads back the slots before this one.
			}
		}
		if err != nil {
			l.log().Error("ddblease: catch-up: the schedule failed; dropping the request", "err", err)
		}
	}
	r.clearControl(ctx, "SET #cud = :cu", "#cu = :cu", map[string]string{"#cu": attrCatchUp, "#cud": attrCatchUpDone},
		map[string]types.AttributeValue{":cu": avS(c.catchUp)})
	delete(r.ctl.tokens, c.catchUp)
	return nil
}

// clearControl removes a handled operator request from the lease item. It
// touches no attribute of the lease protocol, so it cannot disturb the
// holder's writes; a failure leaves the request to be handled again, which
// finds its run already claimed.
func (r *runner) clearControl(ctx context.Context, update, cond string, names map[string]string, values map[string]types.AttributeValue) {
	l := r.l
	names["#pk"] = l.opts.Layout.PartitionKey
	full := "attribute_exists(#pk)"
	if cond != "" {
		full += " AND " + cond
	}
	in := &dynamodb.UpdateItemInput{
		TableName: aws.String(l.table), Key: l.opts.Layout.leaseKey(l.job), UpdateExpression: aws.String(update),
		ConditionExpression: aws.String(full), ExpressionAttributeNames: names,
	}
	if len(values) > 0 {
		in.ExpressionAttributeValues = values
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.CallTimeout)
	defer cancel()
	if _, err := l.db.UpdateItem(cctx, in); err != nil && len(failedConditions(err)) == 0 {
		l.log().Warn("ddblease: could not clear a handled operator request", "err", err)
	}
}
