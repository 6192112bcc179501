package ddblease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

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
	// that it is never emptied: the in-process test server mishandles the
	// removal of a map's last entry, and ignores top-level REMOVE actions
	// (which is why no other control is cleared by removing an attribute).
	attrTriggers = "triggers" // M
	triggerKeep  = "-"
)

// ErrResignRequested is the cause (context.Cause) of a leader context that
// Run cancelled because an operator asked the tenure to resign (see
// Admin.RequestResign).
var ErrResignRequested = errors.New("ddblease: resignation requested")

// Control is the operator state recorded in a lease item: pause, resign
// request, forced release and pending triggers (see Admin). Times are by
// the operator's clock.
type Control struct {
	// Paused reports that RunSchedule fires no slot of the job; slots that
	// fall due are recorded with status RunSkippedByPause.
	Paused    bool
	PausedBy  string    // who paused the job last
	PausedAt  time.Time // when; zero if never paused
	ResumedBy string    // who resumed it last
	ResumedAt time.Time
	// CatchUpPending reports a resumption that asked for the latest slot
	// skipped by the pause to be run, not yet handled by the leader.
	CatchUpPending bool

	// ResignFence is the fence of the tenure an operator asked to resign;
	// the request concerns only that tenure. Zero if none was made.
	ResignFence int64
	ResignBy    string
	ResignAt    time.Time

	// ReleasedFence is the fence of the tenure an operator released by
	// force (the fence was raised past it). Zero if none.
	ReleasedFence int64
	ReleasedBy    string
	ReleasedAt    time.Time

	// Triggers counts the trigger requests the leader has not taken up yet.
	Triggers int

	catchUp  string
	triggers string // ids of the pending triggers, oldest first: a change wakes the runner
}

// pendingTrigger is one trigger request found in a lease item.
type pendingTrigger struct {
	id   string
	slot time.Time
}

// decodeControl reads the operator attributes of a lease item. All are
// optional; one of the wrong type is an error.
func decodeControl(item map[string]types.AttributeValue) (Control, error) {
	var c Control
	var err error
	var catchUpDone string
	var wanted bool
	if c.Paused, err = optBool(item, attrPaused); err != nil {
		return Control{}, err
	}
	if wanted, err = optBool(item, attrCatchUpWanted); err != nil {
		return Control{}, err
	}
	for _, s := range []struct {
		name string
		dst  *string
	}{
		{attrPausedBy, &c.PausedBy}, {attrResumedBy, &c.ResumedBy}, {attrCatchUp, &c.catchUp},
		{attrCatchUpDone, &catchUpDone}, {attrResignBy, &c.ResignBy}, {attrReleasedBy, &c.ReleasedBy},
	} {
		if _, ok := item[s.name]; !ok {
			continue
		}
		if *s.dst, err = str(item, s.name); err != nil {
			return Control{}, err
		}
	}
	if !wanted || c.catchUp == catchUpDone {
		c.catchUp = ""
	}
	c.CatchUpPending = c.catchUp != ""
	for _, t := range []struct {
		name string
		dst  *time.Time
	}{
		{attrPausedAt, &c.PausedAt}, {attrResumedAt, &c.ResumedAt}, {attrResignAt, &c.ResignAt}, {attrReleasedAt, &c.ReleasedAt},
	} {
		ms, err := optNum(item, t.name)
		if err != nil {
			return Control{}, err
		}
		if ms != 0 {
			*t.dst = time.UnixMilli(ms)
		}
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{attrResignFence, &c.ResignFence}, {attrReleasedFence, &c.ReleasedFence}} {
		if *f.dst, err = optNum(item, f.name); err != nil {
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

func optBool(item map[string]types.AttributeValue, name string) (bool, error) {
	v, ok := item[name]
	if !ok {
		return false, nil
	}
	b, ok := v.(*types.AttributeValueMemberBOOL)
	if !ok {
		return false, fmt.Errorf("attribute %s is not a boolean", name)
	}
	return b.Value, nil
}

// controlWatch lets the keeper wake a RunSchedule that waits for its next
// slot when the operator controls in the lease item change.
type controlWatch struct {
	mu   sync.Mutex
	last Control
	seen bool
	wake chan struct{}
}

func (w *controlWatch) ch() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wake == nil {
		w.wake = make(chan struct{}, 1)
	}
	return w.wake
}

// note records c and wakes a waiting runner if it differs from what was
// noted before.
func (w *controlWatch) note(c Control) {
	ch := w.ch()
	w.mu.Lock()
	changed := !w.seen || w.last != c
	w.last, w.seen = c, true
	w.mu.Unlock()
	if changed {
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
	l := k.l
	l.mu.Lock()
	c, ok := l.obs.rec.Control, l.obs.present && l.obs.rec.Fence == k.fence
	l.mu.Unlock()
	if !ok {
		return
	}
	l.ctl.note(c)
	if c.ResignFence == k.fence {
		k.resignOnce.Do(func() { close(k.resign) })
	}
}

// yieldToOthers applies the hand-over rule after an operator ended this
// replica's tenure with fence, by a resign request or a forced release (as
// the lease item last seen shows): Acquire leaves a free lease to the other
// replicas for one LeaseDuration, so that the lease goes to another replica
// instead of straight back to the one asked to let go; a lone replica takes
// it back after that. err, the resignation's own failure if any, is logged.
func (l *Lease) yieldToOthers(fence int64, err error) {
	l.mu.Lock()
	c, present := l.obs.rec.Control, l.obs.present
	asked := present && (c.ResignFence == fence || c.ReleasedFence == fence)
	if asked {
		l.yieldUntil = l.opts.Now().Add(l.opts.LeaseDuration)
	}
	l.mu.Unlock()
	if asked {
		l.log.Info("ddblease: handing the lease over on an operator's request; leaving it to the other replicas for a lease duration",
			"fence", fence, "err", err)
	}
}

// runnerControl is RunSchedule's view of the operator controls.
type runnerControl struct {
	look   bool              // read the controls before waiting for a slot
	paused bool              // as last read
	tokens map[string]string // claim token of each trigger and catch-up tried, by id
}

// wait sleeps for d, or until the keeper sees the operator controls change
// (woken), or ctx ends (err).
func (r *runner) wait(ctx context.Context, d time.Duration) (woken bool, err error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, context.Cause(ctx)
	case <-t.C:
		return false, nil
	case <-r.l.ctl.ch():
		r.ctl.look = true
		return true, nil
	}
}

// lookIfAsked reads the controls when the runner was woken, or its tenure
// just began.
func (r *runner) lookIfAsked(ctx context.Context, fence int64) error {
	if !r.ctl.look {
		return nil
	}
	r.ctl.look = false
	_, _, err := r.control(ctx, fence)
	return err
}

// fireUnlessPaused reads the controls and fires slot, or records it as
// skipped by the pause. While the controls cannot be read, it does
// neither: firing might break a pause. It reads again every RetryInterval,
// and gives the slot up once the next one is due (the catch-up that
// follows counts it as missed, as it does a slot whose claim kept failing).
func (r *runner) fireUnlessPaused(ctx context.Context, fence int64, slot time.Time, missed int) (handled bool, err error) {
	l := r.l
	bo := fixed(l.opts.RetryInterval)
	for {
		paused, known, err := r.control(ctx, fence)
		switch {
		case err != nil || ctx.Err() != nil:
			return false, err
		case known && !paused:
			return r.fire(ctx, fence, slot, missed)
		case known:
			return r.skip(ctx, fence, slot), nil
		}
		if next, nerr := nextSlot(r.sched, slot); nerr == nil && !next.IsZero() && !next.After(l.opts.Now()) {
			l.log.Warn("ddblease: slot given up: the operator controls could not be read before the next one was due", "slot", fmtSlot(slot))
			return false, nil
		}
		if bo.wait(ctx) != nil {
			return false, nil
		}
	}
}

// control reads the lease item with a strongly consistent read, runs the
// pending triggers and catch-up, and returns whether the job is paused.
// known is false when the item could not be read (a transient error, or a
// malformed item: logged). err is set only when the campaign must stop.
func (r *runner) control(ctx context.Context, fence int64) (paused, known bool, err error) {
	l := r.l
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	out, err := l.db.GetItem(cctx, &dynamodb.GetItemInput{
		TableName: aws.String(l.table), Key: l.key, ConsistentRead: aws.Bool(true),
	})
	cancel()
	switch {
	case ctx.Err() != nil:
		return false, false, nil
	case err != nil && retryable(err):
		l.log.Warn("ddblease: could not read the operator controls", "err", err)
		return false, false, nil
	case err != nil:
		return false, false, fmt.Errorf("ddblease: read lease %q: %w", l.job, err)
	case len(out.Item) == 0:
		return r.ctl.paused, true, nil // the tenure is over: the claim will say so
	}
	rec, err := decodeLease(out.Item)
	if err != nil {
		l.log.Error("ddblease: the lease item is malformed", "err", err)
		return false, false, nil
	}
	if rec.Fence != fence {
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
	trs, _ := pendingTriggers(out.Item) // decodeLease checked them
	for _, tr := range trs {
		if ctx.Err() != nil {
			return c.Paused, true, nil
		}
		r.runTrigger(ctx, fence, tr)
	}
	if c.catchUp != "" && !c.Paused && ctx.Err() == nil {
		r.catchUp(ctx, fence, c)
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

// runTrigger claims, runs and finishes a triggered run, then clears its
// request. A claim that fails for a transient reason leaves the request
// for the next look.
func (r *runner) runTrigger(ctx context.Context, fence int64, tr pendingTrigger) {
	l := r.l
	run, err := l.claimRun(ctx, tr.slot, &r.o, r.token(tr.id), 0, claimSpec{trigger: tr.id})
	switch {
	case err == nil:
		l.log.Info("ddblease: running a triggered run", "run", run.id, "fence", fence)
		r.runAndFinish(ctx, fence, run)
	case errors.Is(err, ErrSlotTaken), errors.Is(err, ErrMalformedItem):
		l.log.Warn("ddblease: triggered run already handled", "trigger", tr.id, "err", err)
	default:
		if ctx.Err() == nil && !errors.Is(err, ErrLost) && !errors.Is(err, ErrNotLeader) {
			l.log.Warn("ddblease: could not claim a triggered run; will try again", "trigger", tr.id, "err", err)
		}
		return
	}
	r.clearControl(ctx, "REMOVE #tr.#id", "", map[string]string{"#tr": attrTriggers, "#id": tr.id}, map[string]types.AttributeValue{})
	delete(r.ctl.tokens, tr.id)
}

// catchUp runs the latest slot that fell due during the pause that c ended,
// claiming again its run skipped by the pause, then clears the request.
func (r *runner) catchUp(ctx context.Context, fence int64, c Control) {
	l := r.l
	if !c.PausedAt.IsZero() && !c.ResumedAt.IsZero() {
		first, err := nextSlot(r.sched, c.PausedAt)
		if err == nil && !first.IsZero() && !first.After(c.ResumedAt) {
			var latest time.Time
			if latest, _, _, err = r.dueSlots(first, c.ResumedAt); err == nil {
				run, err := l.claimRun(ctx, latest, &r.o, r.token(c.catchUp), 0, claimSpec{reclaimed: true})
				switch {
				case err == nil:
					l.log.Info("ddblease: running the latest slot skipped by the pause, as the resumption asked", "slot", run.id, "fence", fence)
					r.runAndFinish(ctx, fence, run)
				case errors.Is(err, ErrSlotTaken), errors.Is(err, ErrMalformedItem):
					l.log.Info("ddblease: catch-up: the slot was already handled", "slot", fmtSlot(latest), "err", err)
				default:
					if ctx.Err() == nil && !errors.Is(err, ErrLost) && !errors.Is(err, ErrNotLeader) {
						l.log.Warn("ddblease: catch-up claim failed; will try again", "slot", fmtSlot(latest), "err", err)
					}
					return
				}
				if latest.After(r.last) {
					r.last = latest
				}
			}
		}
		if err != nil {
			l.log.Error("ddblease: catch-up: the schedule failed; dropping the request", "err", err)
		}
	}
	r.clearControl(ctx, "SET #cud = :cu", "#cu = :cu", map[string]string{"#cu": attrCatchUp, "#cud": attrCatchUpDone},
		map[string]types.AttributeValue{":cu": avS(c.catchUp)})
	delete(r.ctl.tokens, c.catchUp)
}

// runAndFinish runs fn for a claimed run and records its outcome, as fire
// does (a panic in fn is recorded and goes on, through r.call).
func (r *runner) runAndFinish(ctx context.Context, fence int64, run *JobRun) {
	fnErr := r.call(ctx, fence, run)
	if fnErr != nil && ctx.Err() != nil && (errors.Is(fnErr, context.Canceled) || errors.Is(fnErr, context.DeadlineExceeded)) {
		fnErr = fmt.Errorf("%w (%v)", fnErr, context.Cause(ctx))
	}
	if fnErr != nil {
		r.l.log.Warn("ddblease: job run failed", "slot", run.id, "fence", fence, "err", fnErr)
	}
	r.finish(ctx, fence, run, fnErr)
}

// skip records slot as skipped by the pause. It reports whether the slot
// was handled (recorded, or found already handled).
func (r *runner) skip(ctx context.Context, fence int64, slot time.Time) bool {
	l := r.l
	_, err := l.claimRun(ctx, slot, &r.o, randomID(8), 0, claimSpec{status: RunSkippedByPause})
	switch {
	case err == nil:
		l.log.Info("ddblease: slot skipped: the job is paused", "slot", fmtSlot(slot), "fence", fence)
		return true
	case errors.Is(err, ErrSlotTaken), errors.Is(err, ErrMalformedItem):
		return true
	case ctx.Err() == nil && !errors.Is(err, ErrLost) && !errors.Is(err, ErrNotLeader):
		// Recorded at the next catch-up, like a slot whose claim failed.
		l.log.Warn("ddblease: could not record a slot skipped by the pause", "slot", fmtSlot(slot), "err", err)
	}
	return false
}

// clearControl removes a handled operator request from the lease item. It
// touches no attribute of the lease protocol, so it cannot disturb the
// holder's writes; a failure leaves the request to be handled again, which
// finds its run already claimed.
func (r *runner) clearControl(ctx context.Context, update, cond string, names map[string]string, values map[string]types.AttributeValue) {
	l := r.l
	names["#pk"] = attrPK
	full := "attribute_exists(#pk)"
	if cond != "" {
		full += " AND " + cond
	}
	in := &dynamodb.UpdateItemInput{
		TableName: aws.String(l.table), Key: l.key, UpdateExpression: aws.String(update),
		ConditionExpression: aws.String(full), ExpressionAttributeNames: names,
	}
	if len(values) > 0 {
		in.ExpressionAttributeValues = values
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.CallTimeout)
	defer cancel()
	var ccf *types.ConditionalCheckFailedException
	if _, err := l.db.UpdateItem(cctx, in); err != nil && !errors.As(err, &ccf) {
		l.log.Warn("ddblease: could not clear a handled operator request", "err", err)
	}
}
