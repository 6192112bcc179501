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

// ListRuns returns the runs recorded for the slots of sched from from to to,
// both included, in slot order; slots without a run are left out. It reads
// the slots' items by key with strongly consistent BatchGetItem requests:
// one request per 100 slots (each slot costs a read unit, found or not),
// and at most MaxListSlots slots per call, so the cost does not grow with
// the table. Runs it cannot decode are left out and reported in an error
// wrapping ErrMalformedItem, returned with the others. It needs no tenure:
// an operator's tool may list with a handle made by New just for that.
func (l *Lease) ListRuns(ctx context.Context, sched Schedule, from, to time.Time) ([]RunRecord, error) {
	if err := checkSchedule(sched); err != nil {
		return nil, fmt.Errorf("ListRuns: %w", err)
	}
	if from.IsZero() || to.IsZero() || to.Before(from) {
		return nil, invalid("ListRuns: from (%v) and to (%v) must be set, from not after to", from, to)
	}
	var ids []string
	for s := from.Add(-time.Nanosecond); ; {
		next, err := nextSlot(sched, s)
		if err != nil {
			return nil, fmt.Errorf("ListRuns: %w", err)
		}
		if next.IsZero() || next.After(to) {
			break
		}
		if len(ids) == MaxListSlots {
			return nil, invalid("ListRuns: %s to %s holds more than %d slots", fmtSlot(from), fmtSlot(to), MaxListSlots)
		}
		id, err := slotID(next)
		if err != nil {
			return nil, fmt.Errorf("ListRuns: %w", err)
		}
		ids = append(ids, id)
		s = next
	}
	items, err := l.getRuns(ctx, ids)
	if err != nil {
		return nil, err
	}
	var runs []RunRecord
	var errs []error
	for _, id := range ids {
		if item, ok := items[runItemKey(l.job, id)]; ok {
			rec, err := decodeRun(item)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			runs = append(runs, rec)
		}
	}
	return runs, errors.Join(errs...)
}

// errUnprocessed reports keys that BatchGetItem left unprocessed.
var errUnprocessed = errors.New("ddblease: keys left unprocessed")

// getRuns reads the run items of the slots ids with strongly consistent
// BatchGetItem requests, and returns them by key.
func (l *Lease) getRuns(ctx context.Context, ids []string) (map[string]map[string]types.AttributeValue, error) {
	found := make(map[string]map[string]types.AttributeValue)
	for start := 0; start < len(ids); start += 100 {
		keys := make([]map[string]types.AttributeValue, 0, 100)
		for _, id := range ids[start:min(start+100, len(ids))] {
			keys = append(keys, map[string]types.AttributeValue{attrPK: avS(runItemKey(l.job, id))})
		}
		req := map[string]types.KeysAndAttributes{l.table: {Keys: keys, ConsistentRead: aws.Bool(true)}}
		again := func(err error) bool { return err == errUnprocessed }
		n, stop, err := retrier{backoff: fixed(l.opts.RetryInterval), again: again, attempts: 11, timeout: l.opts.CallTimeout}.do(ctx,
			func(ctx context.Context) error {
				out, err := l.db.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
				if err != nil {
					return fmt.Errorf("ddblease: list runs %q: %w", l.job, err)
				}
				for _, item := range out.Responses[l.table] {
					if k, err := str(item, attrPK); err == nil {
						found[k] = item
					}
				}
				if req = out.UnprocessedKeys; len(req) > 0 {
					return errUnprocessed
				}
				return nil
			})
		switch {
		case stop == retryAttempts:
			return nil, fmt.Errorf("ddblease: list runs %q: keys still unprocessed after %d rounds", l.job, n)
		case stop == retryEnded:
			return nil, fmt.Errorf("ddblease: list runs %q: %w", l.job, context.Cause(ctx))
		case err != nil:
			return nil, err
		}
	}
	return found, nil
}
