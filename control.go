package ddblease

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the operator's controls in the lease item (pause, resign
// request, release, triggers) as the replicas read them, and the runner's
// handling of them.

// controlWatch lets the keeper wake a RunSchedule that waits for its next
// slot when the operator controls in the lease item change. Its channel is
// made by RunSchedule (watch), so that a Lease that only runs Run holds
// none; nor does it hold a copy of controls that are all unset (the usual
// case): a lease costs little in a process that holds thousands.
type controlWatch struct {
	mu   sync.Mutex
	seen bool
	last *Control // as last noted; nil when all unset
	wake chan struct{}
	fn   func() // called on a change, besides the channel (Pool.RunSchedule)
}

// watch makes the channel that note wakes, before a runner first reads the
// controls, so that no change noted after that read is missed.
func (w *controlWatch) watch() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wake == nil {
		w.wake = make(chan struct{}, 1)
	}
}

// watchFunc makes note call fn on each change, before a runner first
// reads the controls.
func (w *controlWatch) watchFunc(fn func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fn = fn
}

// ch returns the channel note wakes; nil (never ready) before watch.
func (w *controlWatch) ch() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wake
}

// note records c and wakes a waiting runner if it differs from what was
// noted before.
func (w *controlWatch) note(c Control) {
	w.mu.Lock()
	var prev Control
	if w.last != nil {
		prev = *w.last
	}
	changed := !w.seen || prev != c
	if changed {
		w.last = nil
		if c != (Control{}) {
			w.last = &c
		}
	}
	w.seen = true
	ch, fn := w.wake, w.fn
	w.mu.Unlock()
	if changed && fn != nil {
		fn()
	}
	if changed && ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// ResignRequested reports whether the lease item, as this handle last saw
// it, asks its current tenure to resign (see Admin.RequestResign). Run and
// RunSchedule honour the request by themselves at the next heartbeat; code
// that drives TryAcquire and Heartbeat itself checks it after each
// heartbeat and calls Resign.
func (l *Lease) ResignRequested() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.ten
	return t != nil && !t.over && l.obs.present && l.obs.rec.Fence == t.fence && l.obs.rec.Control.ResignFence == t.fence
}

// noticeControl is called by the keeper after each successful heartbeat,
// with the item that heartbeat returned already observed. It wakes a
// runner waiting for a slot when the controls changed, and asks Run to
// resign when the item carries a resign request for this tenure.
func (k *keeper) noticeControl() {
	l := k.t.l
	l.mu.Lock()
	c, ok := l.obs.rec.Control, l.obs.present && l.obs.rec.Fence == k.t.fence
	l.mu.Unlock()
	if !ok {
		return
	}
	l.ctl.note(c)
	if c.ResignFence == k.t.fence && k.onResign != nil {
		k.resignOnce.Do(k.onResign)
	}
}

// yieldToOthers applies the hand-over rule after an operator ended this
// replica's tenure, by a resign request or a forced release (as
// the lease item last seen shows): Acquire leaves a free lease to the other
// replicas for one LeaseDuration, so that the lease goes to another replica
// instead of straight back to the one asked to let go; a lone replica takes
// it back after that. err, the resignation's own failure if any, is logged.
func (t *term) yieldToOthers(err error) {
	l, fence := t.l, t.fence
	l.mu.Lock()
	c, present := l.obs.rec.Control, l.obs.present
	asked := present && (c.ResignFence == fence || c.ReleasedFence == fence)
	if asked {
		l.yieldUntil = time.Now().Add(l.opts.LeaseDuration)
	}
	l.mu.Unlock()
	if asked {
		l.log.Info("ddblease: handing the lease over on an operator's request; leaving it to the other replicas for a lease duration",
			"fence", fence, "err", err)
	}
}

// movedOn is the cause of the end of the tenure with fence when the lease
// item, rec, names another owner or fence: an operator's forced release of
// this tenure, or another tenure.
func movedOn(job string, fence int64, rec Record) error {
	c := rec.Control
	if c.ReleasedFence != fence {
		return fmt.Errorf("%w: %q fence %d: now held by %q with fence %d", ErrLost, job, fence, rec.Owner, rec.Fence)
	}
	held := ""
	if c.ReleasedFence+1 != rec.Fence {
		held = fmt.Sprintf(", held by %q", rec.Owner)
	}
	return fmt.Errorf("%w: %q fence %d: released by force by operator %q at %s; the fence is now %d%s",
		ErrLost, job, fence, c.ReleasedBy, c.ReleasedAt.UTC().Format(time.RFC3339), rec.Fence, held)
}

// Attribute names of the operator controls kept in the lease item (see
// Admin). Writes of the lease protocol never touch them, and operator writes
// never touch the protocol's attributes except ForceRelease, which raises
// the fence like an acquisition does.
const (
	attrPaused        = "paused"        // BOOL: RunSchedule fires no slot
	attrPausedBy      = "pausedBy"      // S: operator of the latest pause
	attrPausedAt      = "pausedAt"      // N: Unix ms, operator's clock
	attrResumedBy     = "resumedBy"     // S
	attrResumedAt     = "resumedAt"     // N: Unix ms
	attrCatchUp       = "catchUp"       // S: token of the latest resumption
	attrCatchUpWanted = "catchUpWanted" // BOOL: that resumption asked for a catch-up
	attrCatchUpDone   = "catchUpDone"   // S: token of the latest catch-up handled
	attrResignFence   = "resignFence"   // N: the tenure asked to resign
	attrResignBy      = "resignBy"      // S
	attrResignAt      = "resignAt"      // N: Unix ms
	attrReleasedFence = "releasedFence" // N: the tenure force-released
	attrReleasedBy    = "releasedBy"    // S
	attrReleasedAt    = "releasedAt"    // N: Unix ms
	// attrTriggers maps the id of each pending trigger request to its
	// slot (N, Unix ms). Handled requests are removed from the map with a
	// nested REMOVE. The map keeps a placeholder entry, triggerKeep, so
	// that it is never emptied: minidyn v0.8.2 cannot return an empty map,
	// and ignores top-level REMOVE actions (which is why no other control
	// is cleared by removing an attribute).
	attrTriggers = "triggers" // M
	triggerKeep  = "-"
)

// Control is the operator state recorded in a lease item: pause, resign
// request, forced release and pending triggers (see Admin). Times are by
// the operator's clock.
type Control struct {
	// Paused reports that RunSchedule fires no slot of the job; slots that
	// fall due are recorded with status RunSkippedByPause.
	Paused    bool      `json:"paused"`
	PausedBy  string    `json:"pausedBy,omitempty"`  // who paused the job last
	PausedAt  time.Time `json:"pausedAt,omitzero"`   // when; zero if never paused
	ResumedBy string    `json:"resumedBy,omitempty"` // who resumed it last
	ResumedAt time.Time `json:"resumedAt,omitzero"`
	// CatchUpPending reports a resumption that asked for the latest slot
	// skipped by the pause to be run, not yet handled by the leader.
	CatchUpPending bool `json:"catchUpPending,omitempty"`

	// ResignFence is the fence of the tenure an operator asked to resign;
	// the request concerns only that tenure. Zero if none was made.
	ResignFence int64     `json:"resignRequestedFence,omitempty"`
	ResignBy    string    `json:"resignRequestedBy,omitempty"`
	ResignAt    time.Time `json:"resignRequestedAt,omitzero"`

	// ReleasedFence is the fence of the tenure an operator released by
	// force (the fence was raised past it). Zero if none.
	ReleasedFence int64     `json:"releasedFence,omitempty"`
	ReleasedBy    string    `json:"releasedBy,omitempty"`
	ReleasedAt    time.Time `json:"releasedAt,omitzero"`

	// Triggers counts the trigger requests the leader has not taken up yet.
	Triggers int `json:"pendingTriggers,omitempty"`

	catchUp  string
	triggers string // ids of the pending triggers, oldest first: a change wakes the runner
}

// pendingTrigger is one trigger request found in a lease item.
type pendingTrigger struct {
	id   string
	slot time.Time
}

// controlItem is the operator attributes of a lease item (embedded in
// leaseItem). The pending triggers, a map, are read by pendingTriggers.
type controlItem struct {
	Paused        boolAttr `dynamodbav:"paused"`
	PausedBy      sAttr    `dynamodbav:"pausedBy"`
	PausedAt      nAttr    `dynamodbav:"pausedAt"`
	ResumedBy     sAttr    `dynamodbav:"resumedBy"`
	ResumedAt     nAttr    `dynamodbav:"resumedAt"`
	CatchUp       sAttr    `dynamodbav:"catchUp"`
	CatchUpWanted boolAttr `dynamodbav:"catchUpWanted"`
	CatchUpDone   sAttr    `dynamodbav:"catchUpDone"`
	ResignFence   nAttr    `dynamodbav:"resignFence"`
	ResignBy      sAttr    `dynamodbav:"resignBy"`
	ResignAt      nAttr    `dynamodbav:"resignAt"`
	ReleasedFence nAttr    `dynamodbav:"releasedFence"`
	ReleasedBy    sAttr    `dynamodbav:"releasedBy"`
	ReleasedAt    nAttr    `dynamodbav:"releasedAt"`
}

// decode validates the operator attributes of item, decoded into it. All
// are optional; one of the wrong type is an error.
func (it *controlItem) decode(item map[string]types.AttributeValue) (Control, error) {
	var c Control
	var err error
	var catchUpDone string
	var wanted bool
	if c.Paused, err = it.Paused.opt(attrPaused); err != nil {
		return Control{}, err
	}
	if wanted, err = it.CatchUpWanted.opt(attrCatchUpWanted); err != nil {
		return Control{}, err
	}
	for _, s := range []struct {
		name string
		a    sAttr
		dst  *string
	}{
		{attrPausedBy, it.PausedBy, &c.PausedBy}, {attrResumedBy, it.ResumedBy, &c.ResumedBy}, {attrCatchUp, it.CatchUp, &c.catchUp},
		{attrCatchUpDone, it.CatchUpDone, &catchUpDone}, {attrResignBy, it.ResignBy, &c.ResignBy}, {attrReleasedBy, it.ReleasedBy, &c.ReleasedBy},
	} {
		if *s.dst, err = s.a.opt(s.name); err != nil {
			return Control{}, err
		}
	}
	if !wanted || c.catchUp == catchUpDone {
		c.catchUp = ""
	}
	c.CatchUpPending = c.catchUp != ""
	for _, t := range []struct {
		name string
		a    nAttr
		dst  *time.Time
	}{
		{attrPausedAt, it.PausedAt, &c.PausedAt}, {attrResumedAt, it.ResumedAt, &c.ResumedAt},
		{attrResignAt, it.ResignAt, &c.ResignAt}, {attrReleasedAt, it.ReleasedAt, &c.ReleasedAt},
	} {
		ms, err := t.a.opt(t.name)
		if err != nil {
			return Control{}, err
		}
		if ms != 0 {
			*t.dst = time.UnixMilli(ms)
		}
	}
	for _, f := range []struct {
		name string
		a    nAttr
		dst  *int64
	}{{attrResignFence, it.ResignFence, &c.ResignFence}, {attrReleasedFence, it.ReleasedFence, &c.ReleasedFence}} {
		if *f.dst, err = f.a.opt(f.name); err != nil {
			return Control{}, err
		}
		if *f.dst < 0 {
			return Control{}, fmt.Errorf("%s %d is negative", f.name, *f.dst)
		}
	}
	trs, err := pendingTriggers(item)
	if err != nil {
		return Control{}, err
	}
	c.Triggers = len(trs)
	for _, t := range trs {
		c.triggers += t.id
	}
	return c, nil
}

// pendingTriggers returns the trigger requests of a lease item, oldest
// first.
func pendingTriggers(item map[string]types.AttributeValue) ([]pendingTrigger, error) {
	v, ok := item[attrTriggers]
	if !ok {
		return nil, nil
	}
	m, ok := v.(*types.AttributeValueMemberM)
	if !ok {
		return nil, fmt.Errorf("attribute %s is not a map", attrTriggers)
	}
	var out []pendingTrigger
	for id := range m.Value {
		if id == triggerKeep {
			continue
		}
		if !validTriggerID(id) {
			return nil, fmt.Errorf("attribute %s: %q is not a trigger id", attrTriggers, id)
		}
		ms, err := num(m.Value, id)
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %v", attrTriggers, err)
		}
		slot := time.UnixMilli(ms).UTC()
		if _, err := slotID(slot); err != nil {
			return nil, fmt.Errorf("attribute %s: trigger %s: %v", attrTriggers, id, err)
		}
		out = append(out, pendingTrigger{id: id, slot: slot})
	}
	// Oldest first; ties by id, so that the order is stable.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && (out[j].slot.Before(out[j-1].slot) ||
			out[j].slot.Equal(out[j-1].slot) && out[j].id < out[j-1].id); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}

// validTriggerID reports whether id has the form Admin.Trigger gives: 16
// lowercase hex digits.
func validTriggerID(id string) bool {
	if len(id) != 16 {
		return false
	}
	for _, r := range id {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// triggerRunID is the run id of a triggered run: its slot, then the
// trigger id, so that it never collides with a schedule slot.
func triggerRunID(slot time.Time, id string) string { return fmtSlot(slot) + "#trigger-" + id }

// runnerControl is RunSchedule's view of the operator controls.
type runnerControl struct {
	look   bool              // read the controls before waiting for a slot
	paused bool              // as last read
	tokens map[string]string // claim token of each trigger and catch-up tried, by id
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
		l.log.Warn("ddblease: could not read the operator controls", "err", err)
		return false, false, nil
	case err != nil:
		return false, false, fmt.Errorf("ddblease: read lease %q: %w", l.job, err)
	case len(item) == 0:
		return r.ctl.paused, true, nil // the tenure is over: the claim will say so
	}
	rec, err := decodeLease(l.opts.Layout, item)
	if err != nil {
		l.log.Error("ddblease: the lease item is malformed", "err", err)
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
		l.log.Info("ddblease: operator pause changed", "paused", c.Paused, "pausedBy", c.PausedBy, "resumedBy", c.ResumedBy)
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
	done, err := r.execute(ctx, tn, firing{what: "triggered run", slot: tr.slot, token: token,
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
				done, err := r.execute(ctx, tn, firing{what: "catch-up", slot: latest, token: token, missed: -1,
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
			l.log.Error("ddblease: catch-up: the schedule failed; dropping the request", "err", err)
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
		l.log.Warn("ddblease: could not clear a handled operator request", "err", err)
	}
}
