package ddblease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the lease item: its attributes, Record and its decoding,
// and the lease's conditional write (Lease.write).

// Attribute names of the lease item. Several are DynamoDB reserved words, so
// expressions always refer to them through expression attribute names.
const (
	attrOwner      = "owner"
	attrFence      = "fence"
	attrExpires    = "expiresAt"  // N: writer's wall clock, Unix ms
	attrVersion    = "rv"         // S: renewal version, new on every write
	attrLeaseMs    = "leaseMs"    // N: lease duration written, ms
	attrAcquiredAt = "acquiredAt" // N: Unix ms
	attrRenewedAt  = "renewedAt"  // N: Unix ms
	attrDraining   = "draining"   // BOOL: the holder is about to resign
	// attrListed records that the job's directory entry was written
	// (Lease.list): until it is, each acquisition writes it.
	attrListed = "listed" // BOOL
)

// Record is a lease item as stored in the table. Its JSON form (see
// MarshalJSON) has the field names of ddblease's other JSON output.
type Record struct {
	Owner      string        `json:"owner"`
	Fence      int64         `json:"fence"`
	ExpiresAt  time.Time     `json:"expiresAt,omitzero"` // recorded expiry, by the writer's clock; zero once resigned
	Duration   time.Duration `json:"-"`                  // lease duration the writer used ("leaseDuration" in JSON)
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

	version string
	listed  bool // attrListed
}

// recordJSON is Record's JSON form, with Duration as a Go duration text.
type recordJSON struct {
	plainRecord
	Duration string `json:"leaseDuration,omitempty"`
}

type plainRecord Record // Record without its JSON methods

// MarshalJSON encodes the record with the field names of its json tags
// and Duration as "leaseDuration", a Go duration such as "30s".
func (r Record) MarshalJSON() ([]byte, error) {
	v := recordJSON{plainRecord: plainRecord(r)}
	if r.Duration != 0 {
		v.Duration = r.Duration.String()
	}
	return json.Marshal(v)
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (r *Record) UnmarshalJSON(b []byte) error {
	var v recordJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = Record(v.plainRecord)
	if v.Duration != "" {
		d, err := time.ParseDuration(v.Duration)
		if err != nil {
			return fmt.Errorf("ddblease: record's leaseDuration: %w", err)
		}
		r.Duration = d
	}
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
	if r.Control, err = it.controlItem.decode(item); err != nil {
		return fail(err)
	}
	return r, nil
}

// write sends a conditional write that sets the renewal version rv, and
// finds out whether it was applied. ours reports that the item now carries
// rv. Otherwise rec is the item as read (zero if absent) and err is nil
// when the condition failed, or the error when the outcome is unknown.
//
// The write is made once: the SDK's own retries are turned off for it, so
// that a refusal (throttling, a validation error) proves it did not apply.
// When the outcome is unknown the item is read back (condWrite), even when
// ctx has ended, but never past until (zero: no bound but timeout): past
// it, the write stays in doubt.
func (l *Lease) write(ctx context.Context, timeout time.Duration, until time.Time, in *dynamodb.UpdateItemInput, rv string) (rec Record, ours bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, bounded(timeout, until, l.opts.Now()))
	out, err := l.db.UpdateItem(cctx, in, singleAttempt)
	cancel()
	w := condWrite{db: l.db, actions: []types.TransactWriteItem{action(l.table, l.opts.Layout.leaseKey(l.job))}, watch: 0, once: true,
		timeout: min(timeout, l.opts.CallTimeout), until: until, now: l.opts.Now,
		mine: func(item map[string]types.AttributeValue) bool {
			v, ok := item[attrVersion].(*types.AttributeValueMemberS)
			return ok && v.Value == rv
		},
	}.resolve(ctx, attributes(out), err)
	doubt := w.outcome == unknown
	if !doubt {
		err = nil
	}
	switch {
	case w.outcome == failed:
		return Record{}, false, w.err // refused before it could apply: nothing is in doubt
	case w.rerr != nil:
		// Even a failed condition leaves the write in doubt here: the write
		// might still be delivered late.
		l.wrote(rv, false, true)
		return Record{}, false, errors.Join(err, fmt.Errorf("ddblease: read lease %q: %w", l.job, explainTableError(ctx, l.db, l.table, l.opts.Layout, w.rerr)))
	case len(w.item) == 0:
		l.wrote(rv, false, doubt)
		return Record{}, false, err
	}
	r, derr := decodeLease(l.opts.Layout, w.item)
	if derr != nil {
		l.wrote(rv, false, doubt)
		return Record{}, false, errors.Join(err, fmt.Errorf("%w (table %q)", derr, l.table))
	}
	l.observe(r, true)
	l.wrote(rv, w.outcome == applied, doubt)
	return r, w.outcome == applied, err
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

// wrote records the outcome of a write of version rv: applied, or in doubt
// (it may still land).
func (l *Lease) wrote(rv string, applied, inDoubt bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case applied:
		// Writes in doubt were conditioned on versions the item no longer
		// carries: none of them can land any more.
		l.confirmed, l.doubt = rv, nil
	case inDoubt:
		l.doubt = append(l.doubt, rv)
		if len(l.doubt) > maxDoubt {
			l.doubt = l.doubt[len(l.doubt)-maxDoubt:]
		}
	}
}

// mineIn returns the condition that the item carries a version this handle
// wrote, adding its values; "" when there is none.
func (l *Lease) mineIn(values map[string]types.AttributeValue) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	mine := l.doubt
	if l.confirmed != "" {
		mine = append([]string{l.confirmed}, l.doubt...)
	}
	if len(mine) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("#rv IN (")
	for i, v := range mine {
		if i > 0 {
			b.WriteString(", ")
		}
		k := ":mine" + strconv.Itoa(i)
		values[k] = avS(v)
		b.WriteString(k)
	}
	b.WriteString(")")
	return b.String()
}

// read gets the lease item; consistent selects a strongly consistent read.
func (l *Lease) read(ctx context.Context, consistent bool) (Record, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	defer cancel()
	out, err := l.db.GetItem(cctx, &dynamodb.GetItemInput{
		TableName:      aws.String(l.table),
		Key:            l.opts.Layout.leaseKey(l.job),
		ConsistentRead: aws.Bool(consistent),
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("ddblease: read lease %q: %w", l.job, explainTableError(ctx, l.db, l.table, l.opts.Layout, err))
	}
	if len(out.Item) == 0 {
		return Record{}, false, nil
	}
	r, err := decodeLease(l.opts.Layout, out.Item)
	if err != nil {
		return Record{}, false, fmt.Errorf("%w (table %q)", err, l.table)
	}
	return r, true, nil
}

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
