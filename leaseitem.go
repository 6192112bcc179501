package ddblease

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the lease item: Record and its decoding, the writes of
// the attributes the holder keeps in it (leaseUpdate), the operator's
// controls it carries (Control, controlItem, the pending triggers), the
// error of a tenure whose item moved on (movedOn), and the expiry half of
// the takeover rule (expiredBy).

// leaseUpdate builds an update of the lease item. The attributes by which
// other replicas judge a holder (its expiry, its renewal version, the
// lease it is for, its renewal's send time, its drain mark, its session)
// are set by its methods, which every write of them uses: an acquisition
// and a heartbeat (renewal), a resignation and a forced release
// (released), a pool's binding and unbinding of the item. Each attribute
// set is #ref = :ref, so that a condition may refer to the same names.
type leaseUpdate struct {
	sets   []string
	names  map[string]string
	values map[string]types.AttributeValue
}

func newLeaseUpdate() *leaseUpdate {
	return &leaseUpdate{names: map[string]string{}, values: map[string]types.AttributeValue{}}
}

// set sets attribute attr, named #ref, to v, as :ref.
func (u *leaseUpdate) set(ref, attr string, v types.AttributeValue) {
	u.names["#"+ref], u.values[":"+ref] = attr, v
	u.sets = append(u.sets, "#"+ref+" = :"+ref)
}

// add adds a clause of the SET action as it is; its names and values are
// the caller's to add.
func (u *leaseUpdate) add(clause string) { u.sets = append(u.sets, clause) }

// renewal sets what a holder's write keeps in the item, sent at at with
// version rv: the expiry it records (Options.expiry), the lease it is for,
// when it was sent, and whether the holder drains.
func (u *leaseUpdate) renewal(o *Options, at time.Time, rv string, draining bool) {
	u.set("exp", attrExpires, avN(o.expiry(at)))
	u.set("rv", attrVersion, avS(rv))
	u.set("lms", attrLeaseMs, avN(o.LeaseDuration.Milliseconds()))
	u.set("ren", attrRenewedAt, avN(at.UnixMilli()))
	u.set("drn", attrDraining, avBool(draining))
}

// released sets what a write that lets the lease go keeps: expired, a new
// version rv, written at at, not draining.
func (u *leaseUpdate) released(at time.Time, rv string) {
	u.set("exp", attrExpires, avN(0))
	u.set("rv", attrVersion, avS(rv))
	u.set("ren", attrRenewedAt, avN(at.UnixMilli()))
	u.set("drn", attrDraining, avBool(false))
}

// bound binds the item to session sid of pool; unbound clears the binding,
// so that any replica of the pool may take it.
func (u *leaseUpdate) bound(sid, pool string) {
	u.set("ses", attrSession, avS(sid))
	u.set("pool", attrPool, avS(pool))
}

func (u *leaseUpdate) unbound() { u.set("ses", attrSession, avS(noSession)) }

// expression is the update expression.
func (u *leaseUpdate) expression() string { return "SET " + strings.Join(u.sets, ", ") }

// Record is a lease item as stored in the table. Its JSON form (see
// MarshalJSON) has the field names of ddblease's other JSON output.
type Record struct {
	Owner      string        `json:"owner"`
	Fence      int64         `json:"fence"`
	ExpiresAt  time.Time     `json:"expiresAt,omitzero"` // recorded expiry, by the writer's clock; zero once resigned
	Duration   time.Duration `json:"-"`                  // lease duration the writer used ("leaseDurationSeconds" in JSON)
	AcquiredAt time.Time     `json:"acquiredAt,omitzero"`
	RenewedAt  time.Time     `json:"renewedAt,omitzero"`
	Draining   bool          `json:"draining"` // the holder announced it is about to resign
	// Control is the operator state kept in the item (see Admin).
	Control Control `json:"control"`
	// Pool and Session name the pool session the lease is bound to, when
	// a replica of a pool holds it (docs/sessions.md): the session's
	// renewal keeps the lease, and ExpiresAt is then the expiry written at
	// its acquisition. Admin reports the session's expiry instead, and a
	// zero expiry once the session ended. Empty for a lease of its own.
	Pool    string `json:"pool,omitempty"`
	Session string `json:"session,omitempty"`
	// LastFailedRun is the id of the job's latest run recorded failed
	// (JobRun.Finish with an error, RunSchedule's function returning
	// one): a slot id, or a triggered run's Trigger.RunID. Admin.Run reads
	// that run by key, however many runs came after it; a later success
	// does not clear it. Empty if no run has failed since the replicas
	// run a version that records it (older ones do not), and while the
	// write that records it fails (the replica logs it at Warn).
	LastFailedRun string `json:"lastFailedRun,omitempty"`

	version string
	listed  bool // attrListed
}

// recordJSON is Record's JSON form, with Duration in seconds.
type recordJSON struct {
	plainRecord
	Duration float64 `json:"leaseDurationSeconds,omitempty"`
}

type plainRecord Record // Record without its JSON methods

// MarshalJSON encodes the record with the field names of its json tags
// and Duration as "leaseDurationSeconds", a number of seconds such as 30
// or 0.5.
func (r Record) MarshalJSON() ([]byte, error) {
	return json.Marshal(recordJSON{plainRecord: plainRecord(r), Duration: r.Duration.Seconds()})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (r *Record) UnmarshalJSON(b []byte) error {
	var v recordJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if v.Duration < 0 || v.Duration > math.MaxInt64/float64(time.Second) {
		return fmt.Errorf("ddblease: record's leaseDurationSeconds %v is out of range", v.Duration)
	}
	*r = Record(v.plainRecord)
	r.Duration = time.Duration(math.Round(v.Duration * float64(time.Second)))
	return nil
}

// leaseItem is the lease item as stored: the record that decodeLease
// decodes with attributevalue and then validates.
type leaseItem struct {
	Owner      sAttr    `dynamodbav:"owner"`
	Fence      nAttr    `dynamodbav:"fence"`
	ExpiresAt  nAttr    `dynamodbav:"expiresAt"`
	Version    sAttr    `dynamodbav:"rv"`
	LeaseMs    nAttr    `dynamodbav:"leaseMs"`
	AcquiredAt nAttr    `dynamodbav:"acquiredAt"`
	RenewedAt  nAttr    `dynamodbav:"renewedAt"`
	Draining   boolAttr `dynamodbav:"draining"`
	Listed     boolAttr `dynamodbav:"listed"`
	Pool       sAttr    `dynamodbav:"pool"`
	Session    sAttr    `dynamodbav:"session"`
	LastFailed sAttr    `dynamodbav:"lastFailed"`
	controlItem
}

// decodeLease reads a lease item. Every attribute the protocol relies on must
// be present with the right type; anything else is ErrMalformedItem.
func decodeLease(y Layout, item map[string]types.AttributeValue) (Record, error) {
	var it leaseItem
	fail := func(e error) (Record, error) {
		return Record{}, fmt.Errorf("%w: lease item %q: %v", ErrMalformedItem, y.describe(item), e)
	}
	if err := unmarshalItem(item, &it); err != nil {
		return fail(err)
	}
	var r Record
	var err error
	if r.Owner, err = it.Owner.get(attrOwner); err != nil {
		return fail(err)
	}
	if r.Fence, err = it.Fence.get(attrFence); err != nil {
		return fail(err)
	}
	if r.Fence < 1 {
		return fail(fmt.Errorf("fence %d is below 1", r.Fence))
	}
	exp, err := it.ExpiresAt.get(attrExpires)
	if err != nil {
		return fail(err)
	}
	if exp != 0 {
		r.ExpiresAt = time.UnixMilli(exp)
	}
	if r.version, err = it.Version.get(attrVersion); err != nil {
		return fail(err)
	}
	if ms, err := it.LeaseMs.opt(attrLeaseMs); err != nil {
		return fail(err)
	} else if ms < 0 {
		return fail(fmt.Errorf("%s %d is negative", attrLeaseMs, ms))
	} else if ms > int64(math.MaxInt64/time.Millisecond) {
		return fail(fmt.Errorf("%s %d is out of range (at most %d ms)", attrLeaseMs, ms, int64(math.MaxInt64/time.Millisecond)))
	} else {
		r.Duration = time.Duration(ms) * time.Millisecond
	}
	if ms, err := it.AcquiredAt.opt(attrAcquiredAt); err != nil {
		return fail(err)
	} else if ms != 0 {
		r.AcquiredAt = time.UnixMilli(ms)
	}
	if ms, err := it.RenewedAt.opt(attrRenewedAt); err != nil {
		return fail(err)
	} else if ms != 0 {
		r.RenewedAt = time.UnixMilli(ms)
	}
	if r.Draining, err = it.Draining.opt(attrDraining); err != nil {
		return fail(err)
	}
	if r.listed, err = it.Listed.opt(attrListed); err != nil {
		return fail(err)
	}
	if r.Pool, err = it.Pool.opt(attrPool); err != nil {
		return fail(err)
	}
	if r.Session, err = it.Session.opt(attrSession); err != nil {
		return fail(err)
	}
	if r.Session == noSession {
		r.Pool, r.Session = "", "" // unbound
	}
	if (r.Pool == "") != (r.Session == "") {
		return fail(fmt.Errorf("attribute %q must name a pool when %q names a session", attrPool, attrSession))
	}
	// attrLastFailed is no part of the lease protocol: one that is not a
	// run's sort key is left out, never a reason to refuse the item.
	if sk, err := it.LastFailed.opt(attrLastFailed); err == nil && sk != "" {
		if id, err := runIDOfSK(sk); err == nil {
			r.LastFailedRun = id
		}
	}
	if r.Control, err = it.controlItem.decode(item); err != nil {
		return fail(err)
	}
	return r, nil
}

// bounded returns timeout, or less if until (when not zero) comes sooner.
func bounded(timeout time.Duration, until, now time.Time) time.Duration {
	if until.IsZero() {
		return timeout
	}
	return min(timeout, until.Sub(now))
}

// singleAttempt turns the SDK's retries off for one request.
func singleAttempt(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }

// fenceCheck is a ConditionCheck that the lease item holds exactly fence.
func fenceCheck(table string, key map[string]types.AttributeValue, fence int64) *types.ConditionCheck {
	return &types.ConditionCheck{
		TableName:                           aws.String(table),
		Key:                                 key,
		ConditionExpression:                 aws.String("#fence = :fence"),
		ExpressionAttributeNames:            map[string]string{"#fence": attrFence},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":fence": avN(fence)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}

// fenceOf returns the fence of a lease item; 0 for no item.
func fenceOf(y Layout, item map[string]types.AttributeValue) (int64, error) {
	if len(item) == 0 {
		return 0, nil
	}
	f, err := num(item, attrFence)
	if err == nil && f < 1 {
		err = fmt.Errorf("fence %d is below 1", f)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: lease item %q: %v", ErrMalformedItem, y.describe(item), err)
	}
	return f, nil
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

// forceReleased reports that an operator released the lease by force
// (Admin.ForceRelease) and no tenure has taken it since: its fence is the
// one the release raised past the released tenure's (JobStatus.Released).
func (r Record) forceReleased() bool {
	return r.Control.ReleasedFence != 0 && r.Control.ReleasedFence+1 == r.Fence
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

// expiredBy is the expiry half of the takeover rule, for every record a
// reader judges by an expiry that another clock wrote (a lease item, a
// pool member and its session, a job's status): it has passed once the
// reader's clock (now) is more than skew past it.
func expiredBy(expires, now time.Time, skew time.Duration) bool { return now.After(expires.Add(skew)) }
