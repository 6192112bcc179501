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

// This file owns JobRun: a claimed run, its Finish and its Commit.

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

// CommitOptions configures one JobRun.Commit. A zero field takes its
// default.
type CommitOptions struct {
	// FenceAttribute names the attribute in which Commit keeps the fence
	// high-water mark of the items it writes, as a Guard does: give it the
	// GuardOptions.FenceAttribute of every guard that writes the same
	// items. Default DefaultGuardFenceAttribute ("fence").
	FenceAttribute string

	// TokenAttribute names the attribute in which Commit stores the token
	// of its write on the items it writes (GuardOptions.TokenAttribute); it
	// must differ from FenceAttribute. Default DefaultGuardTokenAttribute
	// ("fenceWrite").
	TokenAttribute string
}

// Commit applies items (Put, Update, Delete or ConditionCheck, at most
// MaxCommitItems) and marks the run succeeded in one TransactWriteItems,
// with a check that the lease item still holds the run's fence. Either all
// of it happens or none, which makes the slot's effect happen exactly once
// even under the Rerun policy: a newer tenure re-runs a slot only while its
// run is still running, that is, while its effect is not committed.
//
// The items carry the fence high-water mark as Guard.TransactWrite's do
// (see there): each Put and Update sets the item's fence attribute
// (CommitOptions.FenceAttribute) to the run's fence, each Put, Update and
// Delete is on condition that the stored mark is not above it, so that a
// stale Guard.Put or Guard.Update of a committed item is refused, and a
// commit never writes over a higher mark.
//
// items must not act on a lease or job-run item of the lease table (the
// job's, the run's own or another's: an error wrapping ErrInvalid), and
// their expressions are checked as Guard.TransactWrite checks them. A
// stale claimant gets a
// *StaleFenceError and nothing is written; so does a commit refused by an
// item's mark, with that mark as Current. A failed condition among items
// that is the caller's own is returned as the SDK's
// TransactionCanceledException, whose CancellationReasons list the lease
// check first, then the run's update, then items in order. A server
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
func (r *JobRun) Commit(ctx context.Context, items []types.TransactWriteItem, optFns ...func(*CommitOptions)) error {
	if len(items) == 0 || len(items) > MaxCommitItems {
		return invalid("Commit: %d items; between 1 and %d are allowed", len(items), MaxCommitItems)
	}
	if i := onItem(items, r.l.table, r.l.opts.Layout.leaseKey(r.l.job)); i >= 0 {
		return invalid("Commit: item %d acts on the job's lease item", i)
	}
	if i := onItem(items, r.l.table, r.key); i >= 0 {
		return invalid("Commit: item %d acts on the run's own item", i)
	}
	if i := libraryItem(items, r.l.table, r.l.opts.Layout); i >= 0 {
		return invalid("Commit: item %d acts on a lease or job-run item, which the library keeps", i)
	}
	var o CommitOptions
	for _, fn := range optFns {
		if fn != nil {
			fn(&o)
		}
	}
	m, err := newMarker("CommitOptions", o.FenceAttribute, o.TokenAttribute)
	if err != nil {
		return err
	}
	tok := randomID(16)
	marked, err := m.transactItems("Commit", items, r.fence, tok)
	if err != nil {
		return err
	}
	return r.finish(ctx, RunSucceeded, nil, &commit{mark: m, items: items, marked: marked})
}

// commit is what a Commit writes beside the run's update: the caller's
// items, and the same items marked (marker.transactItems).
type commit struct {
	mark          marker
	items, marked []types.TransactWriteItem
}

func (r *JobRun) finish(ctx context.Context, st RunStatus, runErr error, c *commit) error {
	l := r.l
	// EventRunFinished is delivered once the run's lock is released, so
	// that an observer may call the run's methods.
	defer l.notify.flush()
	r.mu.Lock()
	defer r.mu.Unlock()
	what := "finish"
	if c != nil {
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
	err := r.write(ctx, upd, st, c)
	if err == nil {
		r.finished = true
		if st == RunFailed {
			r.noteFailure(ctx)
		}
		now := l.opts.Now()
		l.notify.push(l.event(EventRunFinished, Event{Slot: r.slot, Fence: r.fence, Status: st, Err: runErr,
			Duration: now.Sub(r.started)}))
		return nil
	}
	return fmt.Errorf("ddblease: %s run %q slot %s: %w", what, l.job, r.id, err)
}

// write applies the run's final update upd: alone (Finish), or in one
// transaction with a check on the lease item's fence and the commit's
// items (Commit, fencedTxn). Whatever failed, the run item tells whether
// the write landed (an SDK retry of a write that was applied).
func (r *JobRun) write(ctx context.Context, upd *types.Update, st RunStatus, c *commit) error {
	l := r.l
	mine := func(item map[string]types.AttributeValue) bool {
		rec, err := decodeRun(l.opts.Layout, item)
		return len(item) > 0 && err == nil && rec.claim == r.claim && rec.Status == st
	}
	if c == nil {
		cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
		_, err := l.db.UpdateItem(cctx, updateItemInput(upd))
		cancel()
		w := condWrite{db: l.db, actions: []types.TransactWriteItem{{Update: upd}}, watch: 0, timeout: l.opts.CallTimeout,
			mine: mine}.resolve(ctx, nil, err)
		_, runFailed := w.fails[0]
		switch {
		case w.outcome == applied:
			return nil
		case runFailed && w.rerr == nil:
			return r.refused(w.item, err)
		case runFailed:
			return w.rerr
		}
		return err
	}
	f := fencedTxn{db: l.db, table: l.table, leaseKey: l.opts.Layout.leaseKey(l.job), layout: l.opts.Layout, job: l.job,
		fence: r.fence, own: []types.TransactWriteItem{{Update: upd}}, mark: c.mark, items: c.items, marked: c.marked,
		watch: 1, mine: mine, timeout: l.opts.CallTimeout,
		retry: retrier{now: l.opts.Now, deadline: l.opts.Now().Add(l.opts.CallTimeout), timeout: l.opts.CallTimeout}}
	out := f.send(ctx)
	_, runFailed := out.w.fails[1]
	switch {
	case out.err == nil:
		return nil
	case errors.Is(out.err, ErrTransactionsUnsupported):
		return out.err // before out.w, which was not resolved
	case out.w.outcome == applied:
		return nil
	case out.stale != nil:
		return errors.Join(out.stale, out.rerr)
	case runFailed && out.w.rerr == nil:
		return r.refused(out.w.item, out.err)
	}
	// Otherwise an item's condition may have refused the commit: its mark,
	// or the caller's own. Whether it landed is the run item's to say, not
	// the items' tokens (landedTok "").
	_, mark, merr := f.markRefusal(&out)
	if mark > 0 {
		return &StaleFenceError{Job: l.job, Fence: r.fence, Current: mark, err: out.err}
	}
	return errors.Join(out.err, out.w.rerr, merr)
}

// noteFailure records the run, just recorded failed, as the job's latest
// failure in the lease item (attrLastFailed), unless a later run is there
// already: an operator reads the last failure by key, whatever the runs
// since (Admin.Run). One UpdateItem that sets no attribute of the lease
// protocol (not the renewal version: a heartbeat's condition still holds,
// and a standby still sees the lease unchanged) and needs no tenure: it
// is sent even once the leader context has ended. Every writer of the
// lease item updates it in place (UpdateItem), so the attribute survives
// acquisitions. The run's outcome does not depend on it: a failed write
// is only logged, and the status shows an earlier failure.
func (r *JobRun) noteFailure(ctx context.Context) {
	l := r.l
	y := l.opts.Layout
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.CallTimeout)
	defer cancel()
	_, err := l.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(l.table),
		Key:                       y.leaseKey(l.job),
		UpdateExpression:          aws.String("SET #lf = :sk"),
		ConditionExpression:       aws.String("attribute_exists(#pk) AND (attribute_not_exists(#lf) OR #lf < :sk)"),
		ExpressionAttributeNames:  map[string]string{"#pk": y.PartitionKey, "#lf": attrLastFailed},
		ExpressionAttributeValues: map[string]types.AttributeValue{":sk": avS(runSK(r.slot, r.trigger))},
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		l.log().Warn("ddblease: could not record the failed run in the lease item; status shows an earlier failure",
			"job", l.job, "slot", r.id, "err", err)
	}
}

// refused explains a failed condition on the run item, from the stored
// item.
func (r *JobRun) refused(item map[string]types.AttributeValue, cause error) error {
	if len(item) == 0 {
		return fmt.Errorf("%w: the run item is gone", ErrLost)
	}
	rec, err := decodeRun(r.l.opts.Layout, item)
	switch {
	case err != nil:
		return err
	case rec.claim != r.claim:
		return &StaleFenceError{Job: r.l.job, Fence: r.fence, Current: rec.Fence, err: cause}
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
