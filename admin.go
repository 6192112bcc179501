package ddblease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns Admin: the operator's reads and writes of a job's lease
// item (resign requests, forced releases, pauses, resumptions, triggers) and
// what it reports of a job; for a job held through a pool session, the
// note its holder reads (noteSession) and the session's expiry
// (sessionExpiries).

// defaultAdminCallTimeout is the default of AdminOptions.CallTimeout.
const defaultAdminCallTimeout = 10 * time.Second

// AdminOptions configures an Admin. A zero field takes its default.
type AdminOptions struct {
	// Operator is recorded as who paused, resumed, triggered, asked a
	// resignation or released a lease. Default "<user>@<hostname>".
	Operator string

	// CallTimeout bounds every DynamoDB call. Default 10s.
	CallTimeout time.Duration

	// Now returns the current time, recorded with each request. Default
	// time.Now.
	Now func() time.Time

	// Layout names the table's key attributes and the prefix of the
	// library's keys: the replicas' Options.Layout. Default: the zero
	// Layout.
	Layout Layout
}

// Admin makes the operator's calls on the jobs of a lease table: read
// their state, list runs, pause and resume schedules, trigger runs, ask a
// holder to resign and release a lease by force. Its calls need no tenure
// and take effect through the lease item, which the replicas read. An
// Admin is safe for concurrent use.
type Admin struct {
	db    DynamoDBAPI
	table string
	o     AdminOptions
	// schemaOK records that the table's key schema was found to be the
	// one the layout needs (checkSchema).
	schemaOK atomic.Bool
}

// checkSchema checks, at the first call of this Admin that finds the
// table, that its key schema is the one the layout needs, with one
// DescribeTable: a Query whose key condition names attributes that are
// not the table's keys is refused by DynamoDB, but some test servers
// answer it with no items, which would list no jobs instead of saying the
// table is of another layout.
func (a *Admin) checkSchema(ctx context.Context) error {
	if a.schemaOK.Load() {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, a.o.CallTimeout)
	defer cancel()
	out, err := a.db.DescribeTable(cctx, &dynamodb.DescribeTableInput{TableName: aws.String(a.table)})
	if err != nil {
		return fmt.Errorf("ddblease: describe table %q: %w", a.table, explainTableError(ctx, a.db, a.table, a.o.Layout, err))
	}
	if err := checkSchema(a.table, out.Table, a.o.Layout); err != nil {
		return err
	}
	a.schemaOK.Store(true)
	return nil
}

// NewAdmin returns an Admin for table. It makes no call; the Admin's
// first call checks the table's key schema (one DescribeTable) and refuses
// a table that is not of its Layout with an error wrapping ErrTableSchema.
func NewAdmin(db DynamoDBAPI, table string, optFns ...func(*AdminOptions)) (*Admin, error) {
	if err := CheckClient(db); err != nil {
		return nil, err
	}
	if err := checkTable(table); err != nil {
		return nil, err
	}
	var o AdminOptions
	for _, fn := range optFns {
		if fn != nil {
			fn(&o)
		}
	}
	if o.CallTimeout < 0 {
		return nil, invalid("AdminOptions: CallTimeout is negative (%v)", o.CallTimeout)
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = defaultAdminCallTimeout
	}
	if o.Operator == "" {
		o.Operator = defaultOperator()
	}
	if err := checkName("Operator", o.Operator, 256); err != nil {
		return nil, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	var err error
	if o.Layout, err = o.Layout.withDefaults("AdminOptions"); err != nil {
		return nil, err
	}
	return &Admin{db: db, table: table, o: o}, nil
}

func defaultOperator() string {
	user := os.Getenv("USER")
	if user == "" {
		user = fmt.Sprintf("uid%d", os.Getuid())
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	return user + "@" + host
}

// update applies an operator update to job's lease item, on condition that
// it exists and is well formed, plus cond if not empty, and returns the
// item as written. When the condition fails it returns the item refused,
// as the server returned it or read back, with failed set (ErrUnknownJob
// when there is none): what the refusal means is the caller's to say. A
// lost answer is an error.
func (a *Admin) update(ctx context.Context, job, update, cond string, names map[string]string,
	values map[string]types.AttributeValue) (rec Record, failed bool, err error) {
	if err := checkName("job name", job, MaxJobLength); err != nil {
		return Record{}, false, err
	}
	if err := a.checkSchema(ctx); err != nil {
		return Record{}, false, err
	}
	names["#pk"], names["#fence"], names["#owner"], names["#rv"], names["#exp"] = a.o.Layout.PartitionKey, attrFence, attrOwner, attrVersion, attrExpires
	values[":tn"], values[":ts"] = avS("N"), avS("S")
	full := "attribute_exists(#pk) AND attribute_type(#fence, :tn) AND attribute_type(#owner, :ts) " +
		"AND attribute_type(#rv, :ts) AND attribute_type(#exp, :tn)"
	if cond != "" {
		full += " AND (" + cond + ")"
	}
	key := a.o.Layout.leaseKey(job)
	cctx, cancel := context.WithTimeout(ctx, a.o.CallTimeout)
	out, err := a.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(a.table),
		Key:                                 key,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(full),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	cancel()
	w := condWrite{db: a.db, actions: []types.TransactWriteItem{action(a.table, key)}, watch: -1, timeout: a.o.CallTimeout}.resolve(ctx, attributes(out), err)
	switch w.outcome {
	case applied:
		rec, err := decodeLease(a.o.Layout, w.item)
		if err == nil {
			err = a.noteSession(ctx, job, rec)
		}
		return rec, false, err
	case refused:
		item, err := w.stored(0)
		st, err := a.status(ctx, job, item, err)
		return st.Lease, true, err
	}
	return Record{}, false, fmt.Errorf("ddblease: update lease %q: %w", job, explainTableError(ctx, a.db, a.table, a.o.Layout, err))
}

// ReleaseOptions configures a forced release (Admin.ForceRelease).
type ReleaseOptions struct {
	// HolderDead states that the holder's process is dead, or cut off from
	// the table for good: the release then also sets the expiry to zero,
	// so that a standby leads within one poll instead of waiting for the
	// holder's tenure to end by its clock. If the holder is in fact alive,
	// it still believes it leads until its next heartbeat (up to its
	// HeartbeatInterval) or its local deadline, whichever comes first, and
	// two replicas believe they lead meanwhile; the fence still refuses its
	// writes (guarantee 1 holds, guarantee 2 does not). For a job of a
	// pool, the release also unbinds the item from its holder's session
	// and marks the job declined in the holder's member item, so that the
	// other replicas assign it elsewhere at their next renewal and one of
	// them leads it at once, without waiting for the holder's membership
	// to lapse; a live holder learns of it at its session's next renewal.
	// Default false.
	HolderDead bool
}

// ForceRelease takes the lease of job from its holder with one conditional
// write that raises the fence by one and writes a new renewal version. At
// once, the old holder's heartbeats, claims (where the server has
// transactions) and the guarded writes that check the lease's fence
// (Guard.TransactWrite, JobRun.Commit, Guard.Check and Do) are refused:
// they are conditional on its fence. The holder learns it at its next
// heartbeat (up to its HeartbeatInterval), when its leader context ends
// with a cause wrapping ErrLost that says it was released by an operator.
//
// The recorded expiry is kept, so no other replica leads until the old
// holder's tenure has surely ended by its own clock: a standby takes the
// lease once the recorded expiry is older than its MaxClockSkew (or it has
// watched the lease unchanged for a whole lease duration), as after a
// crash. The holder's local deadline comes before its recorded expiry, so
// guarantee 2 (one leader at a time, with clock offsets under
// MaxClockSkew) holds through the release. With ReleaseOptions.HolderDead
// the expiry is set to zero too and a standby leads at once: see there
// what that gives up.
//
// The item is kept, its fence only grows; the release is recorded in
// Record.Control (JobStatus.Released reports it until the lease is taken
// again). The released replica does not campaign again until another
// owner has taken the lease or a lease duration has passed.
//
// A job of a pool moves, as after RequestResign: its holder learns of the
// release at its session's next renewal (up to its HeartbeatInterval),
// ends its tenure, frees the item and declines the job for as long as its
// Pool.Run lasts, and another replica leads it within a heartbeat
// interval or two. With HolderDead, see there.
//
// The write is conditional on the fence the caller saw (fence), or, when
// fence is zero, on the one a consistent read finds first, so that a
// tenure that began since is not released: a mismatch is an error wrapping
// ErrHeld (a *HeldError naming the current holder). A job never acquired
// is an error wrapping ErrUnknownJob. It returns the item as written.
func (a *Admin) ForceRelease(ctx context.Context, job string, fence int64, optFns ...func(*ReleaseOptions)) (Record, error) {
	if fence < 0 {
		return Record{}, invalid("ForceRelease: fence %d is negative", fence)
	}
	var ro ReleaseOptions
	for _, fn := range optFns {
		if fn != nil {
			fn(&ro)
		}
	}
	// held is the item as read before the release: with HolderDead, the
	// session its tenure is bound to, which the release unbinds it from.
	var held Record
	if fence == 0 || ro.HolderDead {
		st, err := a.Job(ctx, job)
		if err != nil {
			return Record{}, err
		}
		if fence == 0 {
			fence = st.Lease.Fence
		}
		held = st.Lease
	}
	// The fence moves on: its holder, alive, learns at its next renewal
	// that it lost. A dead holder's item is released as by a resignation
	// (and a pool's job unbound from its session), for a standby to take
	// at its next poll.
	now := a.o.Now()
	u := newLeaseUpdate()
	u.add("#fence = #fence + :one, #rf = :seen")
	if ro.HolderDead {
		u.released(now, randomID(8))
		u.unbound()
	} else {
		u.set("rv", attrVersion, avS(randomID(8)))
		u.set("ren", attrRenewedAt, avN(now.UnixMilli()))
		u.set("drn", attrDraining, avBool(false))
	}
	u.set("rby", attrReleasedBy, avS(a.o.Operator))
	u.set("rat", attrReleasedAt, avN(now.UnixMilli()))
	u.names["#rf"], u.values[":one"], u.values[":seen"] = attrReleasedFence, avN(1), avN(fence)
	rec, failed, err := a.update(ctx, job, u.expression(), "#fence = :seen", u.names, u.values)
	switch {
	case err != nil:
		return Record{}, err
	case failed:
		return rec, &HeldError{Job: job, Owner: rec.Owner, Fence: rec.Fence, ExpiresAt: rec.ExpiresAt, Draining: rec.Draining}
	}
	if ro.HolderDead && held.Session != "" && held.Fence == fence {
		// The item written names no session, so update noted none: the
		// holder, were it alive, learns of the release through the
		// session it held; and the others assign the job elsewhere at
		// their next renewal, as if its holder had declined it, instead
		// of leaving it to the dead replica until its membership lapses.
		if err := errors.Join(a.noteSession(ctx, job, held), a.declineFor(ctx, job, held)); err != nil {
			return rec, fmt.Errorf("ddblease: %q was released (fence %d), but the pool's replicas may wait for its holder's membership to lapse: %w",
				job, rec.Fence, err)
		}
	}
	return rec, nil
}

// declineFor adds job to the jobs that the member item of held's session
// declines, while the item holds that session unended, so that the pool's
// replicas assign the job to another of them at their next renewal
// (assign: a job its replica declines goes elsewhere). The replica itself
// writes its declines at each renewal: one that is alive declines the job
// too once it has read the note of the release (Pool.noticeNote). A
// member item that changed between the read and the write is read again.
func (a *Admin) declineFor(ctx context.Context, job string, held Record) error {
	y := a.o.Layout
	key := y.memberKey(held.Pool, held.Owner)
	for range 3 {
		item, err := getItem(ctx, a.db, a.table, key, a.o.CallTimeout)
		if err != nil {
			return fmt.Errorf("read member item %q: %w", y.describe(key), explainTableError(ctx, a.db, a.table, y, err))
		}
		m, err := decodeMember(y, item)
		if len(item) == 0 || err != nil || m.sid != held.Session || m.ended != "" || slices.Contains(m.declined, job) {
			return nil // no session to mend, or already declined
		}
		old, _ := str(item, memberDeclined)
		list, err := json.Marshal(slices.Sorted(slices.Values(append(m.declined, job))))
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, a.o.CallTimeout)
		_, err = a.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(a.table), Key: key,
			UpdateExpression:          aws.String("SET #d = :d"),
			ConditionExpression:       aws.String("#sid = :sid AND #d = :old"),
			ExpressionAttributeNames:  map[string]string{"#d": memberDeclined, "#sid": memberSession},
			ExpressionAttributeValues: map[string]types.AttributeValue{":d": avS(string(list)), ":sid": avS(held.Session), ":old": avS(old)},
		})
		cancel()
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			return nil
		case !errors.As(err, &ccf):
			return fmt.Errorf("update member item %q: %w", y.describe(key), explainTableError(ctx, a.db, a.table, y, err))
		}
	}
	return fmt.Errorf("member item %q keeps changing", y.describe(key))
}

// RequestResign asks the tenure that holds job's lease to hand it over: it
// records the tenure's fence in the lease item, and the leader, at its next
// heartbeat, does what it does on SIGTERM (Run cancels the leader context
// with cause ErrResignRequested, drains and resigns), then lets another
// replica lead: it campaigns again only once another owner has taken the
// lease, or after one lease duration if none has (a lone replica takes it
// back). The request concerns only that tenure; the next one ignores it.
//
// fence, when not zero, is the tenure the caller saw; a mismatch is an
// error wrapping ErrHeld. A lease that no tenure holds (released by
// force, or resigned or expired by its recorded expiry on this Admin's
// clock) is an error wrapping ErrNotHeld. It returns the item as written.
func (a *Admin) RequestResign(ctx context.Context, job string, fence int64) (Record, error) {
	if fence < 0 {
		return Record{}, invalid("RequestResign: fence %d is negative", fence)
	}
	st, err := a.Job(ctx, job)
	if err != nil {
		return Record{}, err
	}
	now := a.o.Now()
	if st.Released() {
		return st.Lease, fmt.Errorf("%w: %q was released by force (fence %d)", ErrNotHeld, job, st.Lease.Control.ReleasedFence)
	}
	if st.Free(now, 0) {
		return st.Lease, fmt.Errorf("%w: %q (fence %d) is free", ErrNotHeld, job, st.Lease.Fence)
	}
	if fence == 0 {
		fence = st.Lease.Fence
	}
	names := map[string]string{"#rqf": attrResignFence, "#rqby": attrResignBy, "#rqat": attrResignAt}
	values := map[string]types.AttributeValue{
		":seen": avN(fence), ":me": avS(a.o.Operator), ":now": avN(now.UnixMilli()), ":zero": avN(0),
	}
	rec, failed, err := a.update(ctx, job, "SET #rqf = :seen, #rqby = :me, #rqat = :now",
		"#fence = :seen AND #exp <> :zero", names, values)
	switch {
	case err != nil:
		return Record{}, err
	case failed && (rec.Fence == fence || rec.forceReleased()):
		return rec, fmt.Errorf("%w: %q (fence %d) was resigned or released meanwhile", ErrNotHeld, job, fence)
	case failed:
		return rec, &HeldError{Job: job, Owner: rec.Owner, Fence: rec.Fence, ExpiresAt: rec.ExpiresAt, Draining: rec.Draining}
	}
	return rec, nil
}

// Pause stops RunSchedule, on every replica, from firing job's slots: the
// leader keeps the lease, and each slot that falls due while the job is
// paused is recorded as a run with status RunSkippedByPause. It takes
// effect for every claim written after it: each slot's claim checks the
// pause, and the span of the latest pause, at the instant of the write (in
// the claim's transaction; by a strongly consistent read just before it on
// a server without transactions), so that a slot that came due in the pause
// is not fired after the resumption either, also when its claim was being
// retried as the pause began or no leader saw the pause. While the claim
// fails the slot neither fires nor is skipped. Triggered runs (Trigger)
// still run. Replicas that use Run rather
// than RunSchedule are not affected: Record.Control.Paused is theirs to
// read. Pausing a paused job changes nothing (who paused it first, and when,
// stay recorded). It returns the item as written.
func (a *Admin) Pause(ctx context.Context, job string) (Record, error) {
	names := map[string]string{"#p": attrPaused, "#pby": attrPausedBy, "#pat": attrPausedAt, "#cuw": attrCatchUpWanted}
	values := map[string]types.AttributeValue{
		":true": avBool(true), ":false": avBool(false), ":me": avS(a.o.Operator), ":now": avN(a.o.Now().UnixMilli()),
	}
	// A catch-up not yet handled is cancelled by the new pause.
	rec, failed, err := a.update(ctx, job, "SET #p = :true, #pby = :me, #pat = :now, #cuw = :false",
		"attribute_not_exists(#p) OR #p <> :true", names, values)
	if err != nil {
		return Record{}, err
	}
	if failed && !rec.Control.Paused {
		return rec, fmt.Errorf("ddblease: pause %q: the lease item changed; try again", job)
	}
	return rec, nil
}

// Resume lets RunSchedule fire job's slots again. The slots skipped during
// the pause are not run, unless catchUp is set: the leader then runs the
// latest slot that fell due during the pause (claiming again its run
// skipped by the pause), once, whatever CatchUpWindow says: the operator
// asked for it. Resuming a job that is not paused is an error wrapping
// ErrInvalid. It returns the item as written.
func (a *Admin) Resume(ctx context.Context, job string, catchUp bool) (Record, error) {
	names := map[string]string{"#p": attrPaused, "#rby": attrResumedBy, "#rat": attrResumedAt,
		"#cu": attrCatchUp, "#cuw": attrCatchUpWanted}
	values := map[string]types.AttributeValue{
		":false": avBool(false), ":true": avBool(true), ":me": avS(a.o.Operator), ":now": avN(a.o.Now().UnixMilli()),
		":cu": avS(randomID(8)), ":cuw": avBool(catchUp),
	}
	update := "SET #p = :false, #rby = :me, #rat = :now, #cu = :cu, #cuw = :cuw"
	rec, failed, err := a.update(ctx, job, update, "#p = :true", names, values)
	switch {
	case err != nil:
		return Record{}, err
	case failed:
		return rec, invalid("resume %q: the job is not paused", job)
	}
	return rec, nil
}

// JobStatus is one job's lease item as an operator sees it.
type JobStatus struct {
	Job   string `json:"job"`
	Lease Record `json:"lease"` // Lease.Control holds the operator state
}

// Free reports whether no tenure holds the lease by its recorded expiry
// and the clock reading now, allowing skew between the holder's clock and
// now's: the lease was resigned or released (a zero expiry), or its expiry
// is older than skew.
func (s JobStatus) Free(now time.Time, skew time.Duration) bool {
	return s.Lease.ExpiresAt.IsZero() || expiredBy(s.Lease.ExpiresAt, now, skew)
}

// Released reports that an operator released the lease by force
// (Admin.ForceRelease) and no tenure has taken it since: the fence was
// raised past the released tenure's and no acquisition has followed. The
// released holder may still believe it leads until its next heartbeat;
// a standby takes the lease as Free says, or at once if the release said
// the holder was dead (the expiry is then zero).
func (s JobStatus) Released() bool { return s.Lease.forceReleased() }

// Job reads one job's lease item with a strongly consistent read. A job
// whose lease was never acquired is an error wrapping ErrUnknownJob.
func (a *Admin) Job(ctx context.Context, job string) (JobStatus, error) {
	if err := checkName("job name", job, MaxJobLength); err != nil {
		return JobStatus{}, err
	}
	if err := a.checkSchema(ctx); err != nil {
		return JobStatus{}, err
	}
	item, err := getItem(ctx, a.db, a.table, a.o.Layout.leaseKey(job), a.o.CallTimeout)
	return a.status(ctx, job, item, err)
}

// status is job's status from its lease item, read with err.
func (a *Admin) status(ctx context.Context, job string, item map[string]types.AttributeValue, err error) (JobStatus, error) {
	if err != nil {
		return JobStatus{}, fmt.Errorf("ddblease: read lease %q: %w", job, explainTableError(ctx, a.db, a.table, a.o.Layout, err))
	}
	if len(item) == 0 {
		return JobStatus{}, fmt.Errorf("%w: %q has no lease item in table %q", ErrUnknownJob, job, a.table)
	}
	rec, err := decodeLease(a.o.Layout, item)
	if err != nil {
		return JobStatus{}, err
	}
	if err := a.sessionExpiries(ctx, []*Record{&rec}); err != nil {
		return JobStatus{}, err
	}
	return JobStatus{Job: job, Lease: rec}, nil
}

// Trigger is a request to run a job once, outside its schedule.
type Trigger struct {
	Job string    `json:"job"`
	ID  string    `json:"id"` // 16 hex digits
	At  time.Time `json:"at"` // when it was requested: the run's slot, in UTC, to the millisecond
}

// RunID is the run's id: the slot, then "#trigger-" and the id.
// JobRun.IdempotencyKey is <job>#<RunID>.
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
	if err := a.checkSchema(ctx); err != nil {
		return RunRecord{}, false, err
	}
	item, err := getItem(ctx, a.db, a.table, a.o.Layout.runKey(t.Job, runSK(t.At, t.ID)), a.o.CallTimeout)
	if err != nil {
		return RunRecord{}, false, fmt.Errorf("ddblease: read run %q %s: %w", t.Job, t.RunID(), explainTableError(ctx, a.db, a.table, a.o.Layout, err))
	}
	if len(item) == 0 {
		return RunRecord{}, false, nil
	}
	rec, err = decodeRun(a.o.Layout, item)
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

// noteSession notes job in the member item of the session its lease item
// is bound to, after an operator changed the item: the session's holder
// reads the item at its next renewal (Pool.noticeNote). A session no
// longer in its item is left alone: no one renews it.
func (a *Admin) noteSession(ctx context.Context, job string, rec Record) error {
	if rec.Session == "" {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, a.o.CallTimeout)
	defer cancel()
	_, err := a.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(a.table), Key: a.o.Layout.memberKey(rec.Pool, rec.Owner),
		UpdateExpression:          aws.String("ADD #n :job"),
		ConditionExpression:       aws.String("#sid = :sid"),
		ExpressionAttributeNames:  map[string]string{"#n": memberNotes, "#sid": memberSession},
		ExpressionAttributeValues: map[string]types.AttributeValue{":job": &types.AttributeValueMemberSS{Value: []string{newNote(job)}}, ":sid": avS(rec.Session)},
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return fmt.Errorf("ddblease: tell the pool session holding %q: %w", job, explainTableError(ctx, a.db, a.table, a.o.Layout, err))
	}
	return nil
}

// sessionExpiries sets the expiry of each record bound to a pool session
// to the session's: its member item's expiry while the item holds the
// session unended, zero (free) otherwise; and, while it holds it, its last
// renewal to the session's (a held job's lease item is not rewritten: its
// session is renewed). It reads each member item once,
// with one strongly consistent BatchGetItem per 100: its cost grows with
// the replicas, not the jobs.
func (a *Admin) sessionExpiries(ctx context.Context, recs []*Record) error {
	y := a.o.Layout
	type mk struct{ pool, owner string }
	var keys []map[string]types.AttributeValue
	seen := map[mk]bool{}
	for _, r := range recs {
		if k := (mk{r.Pool, r.Owner}); r.Session != "" && !seen[k] {
			seen[k] = true
			keys = append(keys, y.memberKey(k.pool, k.owner))
		}
	}
	if len(keys) == 0 {
		return nil
	}
	items, err := batchGet(ctx, a.db, a.table, y, "read pool sessions", keys, time.Second, a.o.CallTimeout)
	if err != nil {
		return err
	}
	members := map[mk]member{}
	for _, item := range items {
		pk, _ := str(item, y.PartitionKey)
		if m, err := decodeMember(y, item); err == nil {
			members[mk{strings.TrimPrefix(pk, y.Prefix+skPoolPrefix), m.owner}] = m
		}
	}
	for _, r := range recs {
		if r.Session == "" {
			continue
		}
		if m, ok := members[mk{r.Pool, r.Owner}]; ok && m.sid == r.Session && m.ended == "" {
			r.ExpiresAt = time.UnixMilli(m.exp)
			if ren := time.UnixMilli(m.renewed); m.renewed > 0 && ren.After(r.RenewedAt) {
				r.RenewedAt = ren
			}
		} else {
			r.ExpiresAt = time.Time{}
		}
	}
	return nil
}
