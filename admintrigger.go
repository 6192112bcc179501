package ddblease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Trigger is a request to run a job once, outside its schedule.
type Trigger struct {
	Job string
	ID  string    // 16 hex digits
	At  time.Time // when it was requested: the run's slot, in UTC, to the millisecond
}

// RunID is the run's slot id: the slot, then "#trigger-" and the id. The
// run item's key is jobrun#<job>#<RunID>; JobRun.IdempotencyKey is
// <job>#<RunID>.
func (t Trigger) RunID() string { return triggerRunID(t.At, t.ID) }

// Trigger asks the leader of job to run it once now, as an extra run with
// its own id (Trigger.RunID): the leader's RunSchedule claims it like any
// slot (fenced, one run per id, the same RerunPolicy), runs the job's
// function with it, records the outcome and clears the request once the
// run is settled (a run whose tenure ended before its outcome was
// recorded leaves the request for the next tenure, which finds that run).
// The leader notices the request at its next heartbeat, or when its tenure
// begins; it runs triggers while the job is paused too.
// Use WaitRun to wait for the outcome. Only RunSchedule takes requests up:
// with replicas that use Run, or none running, a request stays pending. A
// job never acquired is an error wrapping ErrUnknownJob.
func (a *Admin) Trigger(ctx context.Context, job string) (Trigger, error) {
	t := Trigger{Job: job, ID: randomID(8), At: time.UnixMilli(a.o.Now().UnixMilli()).UTC()}
	// The map of requests is created by the first one; a nested SET needs
	// it to exist. Two tries cover a race with another first request.
	for range 3 {
		names := map[string]string{"#tr": attrTriggers, "#id": t.ID}
		values := map[string]types.AttributeValue{":at": avN(t.At.UnixMilli())}
		_, failed, err := a.update(ctx, job, "SET #tr.#id = :at", "attribute_type(#tr, :tm)", names,
			map[string]types.AttributeValue{":at": values[":at"], ":tm": avS("M")})
		if err != nil {
			return Trigger{}, err
		}
		if !failed {
			return t, nil
		}
		names = map[string]string{"#tr": attrTriggers}
		values[":m"] = &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{t.ID: values[":at"], triggerKeep: avN(0)}}
		delete(values, ":at")
		_, failed, err = a.update(ctx, job, "SET #tr = :m", "attribute_not_exists(#tr)", names, values)
		if err != nil {
			return Trigger{}, err
		}
		if !failed {
			return t, nil
		}
	}
	return Trigger{}, fmt.Errorf("ddblease: trigger %q: the lease item keeps changing; try again", job)
}

// TriggerRun reads the run of a trigger with a strongly consistent read.
// ok is false while the leader has not claimed it.
func (a *Admin) TriggerRun(ctx context.Context, t Trigger) (rec RunRecord, ok bool, err error) {
	if err := checkName("job name", t.Job, MaxJobLength); err != nil {
		return RunRecord{}, false, err
	}
	if !validTriggerID(t.ID) {
		return RunRecord{}, false, invalid("trigger id %q is not 16 hex digits", t.ID)
	}
	item, err := getItem(ctx, a.db, a.table, map[string]types.AttributeValue{attrPK: avS(runItemKey(t.Job, t.RunID()))}, a.o.CallTimeout)
	if err != nil {
		return RunRecord{}, false, fmt.Errorf("ddblease: read run %q %s: %w", t.Job, t.RunID(), explainTableError(ctx, a.db, a.table, err))
	}
	if len(item) == 0 {
		return RunRecord{}, false, nil
	}
	rec, err = decodeRun(item)
	return rec, err == nil, err
}

// WaitRun waits until the run of t is finished (succeeded, failed or
// abandoned) and returns it, reading it about every poll (1s when zero;
// less the jitter every wait of the library has), until ctx ends.
func (a *Admin) WaitRun(ctx context.Context, t Trigger, poll time.Duration) (RunRecord, error) {
	if poll <= 0 {
		poll = time.Second
	}
	var rec RunRecord
	var ok bool
	_, stop, err := retrier{backoff: fixed(poll), again: func(err error) bool { return err == errPending || retryable(err) }}.do(ctx,
		func(context.Context) error {
			var err error
			if rec, ok, err = a.TriggerRun(ctx, t); err == nil && (!ok || rec.Status == RunRunning) {
				return errPending
			}
			return err
		})
	switch {
	case stop == retryEnded && err == errPending:
		what := "not claimed yet"
		if ok {
			what = "still " + string(rec.Status)
		}
		return rec, fmt.Errorf("ddblease: run %s of %q %s: %w", t.RunID(), t.Job, what, context.Cause(ctx))
	case err != nil:
		return RunRecord{}, err
	}
	return rec, nil
}

// errPending reports a run not finished yet.
var errPending = errors.New("ddblease: run not finished")
