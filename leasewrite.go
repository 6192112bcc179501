package ddblease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// write sends a conditional write that sets the renewal version rv, and
// finds out whether it was applied. ours reports that the item now carries
// rv. Otherwise rec is the item as read (zero if absent) and err is nil
// when the condition failed, or the error when the outcome is unknown.
//
// The write is made once: the SDK's own retries are turned off for it, so
// that a refusal (throttling, a validation error) proves it did not apply.
// When the outcome is unknown the item is read back, even when ctx has
// ended, but never past until (zero: no bound but timeout): past it, the
// write stays in doubt.
func (l *Lease) write(ctx context.Context, timeout time.Duration, until time.Time, in *dynamodb.UpdateItemInput, rv string) (rec Record, ours bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, bounded(timeout, until, l.opts.Now()))
	out, err := l.db.UpdateItem(cctx, in, singleAttempt)
	cancel()
	var item map[string]types.AttributeValue
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil && len(out.Attributes) > 0:
		item = out.Attributes
	case errors.As(err, &ccf) && len(ccf.Item) > 0:
		item = ccf.Item
		err = nil
	case err != nil && !errors.As(err, &ccf) && !mayHaveApplied(err):
		// Refused before it could apply: nothing is in doubt.
		return Record{}, false, err
	case errors.As(err, &ccf):
		err = nil
		fallthrough
	default:
		// Either the server returned no item with its answer, or the outcome
		// is unknown: read the item back. The read must be made even when ctx
		// has ended, so that a write that did land is known.
		t := bounded(timeout, until, l.opts.Now())
		if t <= 0 {
			l.wrote(rv, false, true)
			return Record{}, false, errors.Join(err, errors.New("ddblease: no time left to read the lease back"))
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t)
		r, present, rerr := l.read(rctx, true)
		cancel()
		if rerr != nil {
			// Even a conditional failure leaves the write in doubt here: the
			// write might still be delivered late.
			l.wrote(rv, false, true)
			return Record{}, false, errors.Join(err, rerr)
		}
		if !present {
			l.wrote(rv, false, err != nil)
			return Record{}, false, err
		}
		l.observe(r, true)
		l.wrote(rv, r.version == rv, err != nil)
		return r, r.version == rv, err
	}
	r, derr := decodeLease(item)
	if derr != nil {
		return Record{}, false, fmt.Errorf("%w (table %q)", derr, l.table)
	}
	l.observe(r, true)
	l.wrote(rv, r.version == rv, false)
	return r, r.version == rv, nil
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
		Key:            l.key,
		ConsistentRead: aws.Bool(consistent),
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("ddblease: read lease %q: %w", l.job, explainTableError(ctx, l.db, l.table, err))
	}
	if len(out.Item) == 0 {
		return Record{}, false, nil
	}
	r, err := decodeLease(out.Item)
	if err != nil {
		return Record{}, false, fmt.Errorf("%w (table %q)", err, l.table)
	}
	return r, true, nil
}
