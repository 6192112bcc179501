package ddblease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// JobStatus is one job's lease item as an operator sees it.
type JobStatus struct {
	Job   string
	Lease Record // Lease.Control holds the operator state
}

// Free reports whether no tenure holds the lease by its recorded expiry
// and the clock reading now, allowing skew between the holder's clock and
// now's: the lease was resigned or released (a zero expiry), or its expiry
// is older than skew.
func (s JobStatus) Free(now time.Time, skew time.Duration) bool {
	return s.Lease.ExpiresAt.IsZero() || s.Lease.ExpiresAt.Before(now.Add(-skew))
}

// Released reports that an operator released the lease by force
// (Admin.ForceRelease) and no tenure has taken it since: the fence was
// raised past the released tenure's and no acquisition has followed. The
// released holder may still believe it leads until its next heartbeat;
// a standby takes the lease as Free says, or at once if the release said
// the holder was dead (the expiry is then zero).
func (s JobStatus) Released() bool {
	c := s.Lease.Control
	return c.ReleasedFence != 0 && c.ReleasedFence+1 == s.Lease.Fence
}

// Job reads one job's lease item with a strongly consistent read. A job
// whose lease was never acquired is an error wrapping ErrUnknownJob.
func (a *Admin) Job(ctx context.Context, job string) (JobStatus, error) {
	if err := checkName("job name", job, MaxJobLength); err != nil {
		return JobStatus{}, err
	}
	item, err := getItem(ctx, a.db, a.table, map[string]types.AttributeValue{attrPK: avS(leaseKey(job))}, a.o.CallTimeout)
	return a.status(ctx, job, item, err)
}

// status is job's status from its lease item, read with err.
func (a *Admin) status(ctx context.Context, job string, item map[string]types.AttributeValue, err error) (JobStatus, error) {
	if err != nil {
		return JobStatus{}, fmt.Errorf("ddblease: read lease %q: %w", job, explainTableError(ctx, a.db, a.table, err))
	}
	if len(item) == 0 {
		return JobStatus{}, fmt.Errorf("%w: %q has no lease item in table %q", ErrUnknownJob, job, a.table)
	}
	rec, err := decodeLease(item)
	if err != nil {
		return JobStatus{}, err
	}
	return JobStatus{Job: job, Lease: rec}, nil
}

// Jobs returns every job of the table, by name. It scans the whole table
// (strongly consistent, filtered to lease items), so its cost grows with
// the number of run items kept: it is meant for an operator's tool, not
// for a loop. Items it cannot decode are left out and reported in an error
// wrapping ErrMalformedItem, returned with the others.
func (a *Admin) Jobs(ctx context.Context) ([]JobStatus, error) {
	items, err := a.scan(ctx, "lease#")
	if err != nil {
		return nil, err
	}
	var jobs []JobStatus
	var errs []error
	for _, item := range items {
		pk, _ := str(item, attrPK)
		rec, err := decodeLease(item)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		jobs = append(jobs, JobStatus{Job: strings.TrimPrefix(pk, "lease#"), Lease: rec})
	}
	slices.SortFunc(jobs, func(x, y JobStatus) int { return strings.Compare(x.Job, y.Job) })
	return jobs, errors.Join(errs...)
}

// Runs returns every run of job kept in the table whose slot is not before
// since (all of them when since is zero), in slot order: schedule slots,
// triggered runs and slots skipped by a pause alike. Unlike ListRuns it
// needs no schedule, and it scans the whole table (strongly consistent):
// its cost grows with the table. Items it cannot decode are left out and
// reported in an error wrapping ErrMalformedItem.
func (a *Admin) Runs(ctx context.Context, job string, since time.Time) ([]RunRecord, error) {
	if err := checkName("job name", job, MaxJobLength); err != nil {
		return nil, err
	}
	items, err := a.scan(ctx, runItemKey(job, ""))
	if err != nil {
		return nil, err
	}
	var runs []RunRecord
	var errs []error
	for _, item := range items {
		rec, err := decodeRun(item)
		switch {
		case err != nil:
			errs = append(errs, err)
		case rec.Job != job: // a job whose name extends this one's with '#'
		case since.IsZero() || !rec.Slot.Before(since):
			runs = append(runs, rec)
		}
	}
	slices.SortStableFunc(runs, func(x, y RunRecord) int {
		if c := x.Slot.Compare(y.Slot); c != 0 {
			return c
		}
		return strings.Compare(x.Trigger, y.Trigger)
	})
	return runs, errors.Join(errs...)
}

// scan returns the items whose key starts with prefix.
func (a *Admin) scan(ctx context.Context, prefix string) ([]map[string]types.AttributeValue, error) {
	var items []map[string]types.AttributeValue
	var start map[string]types.AttributeValue
	for {
		cctx, cancel := context.WithTimeout(ctx, a.o.CallTimeout)
		out, err := a.db.Scan(cctx, &dynamodb.ScanInput{
			TableName:                 aws.String(a.table),
			FilterExpression:          aws.String("begins_with(#pk, :prefix)"),
			ExpressionAttributeNames:  map[string]string{"#pk": attrPK},
			ExpressionAttributeValues: map[string]types.AttributeValue{":prefix": avS(prefix)},
			ConsistentRead:            aws.Bool(true),
			ExclusiveStartKey:         start,
		})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("ddblease: scan: %w", explainTableError(ctx, a.db, a.table, err))
		}
		items = append(items, out.Items...)
		if len(out.LastEvaluatedKey) == 0 {
			return items, nil
		}
		start = out.LastEvaluatedKey
	}
}
