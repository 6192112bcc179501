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

// This file owns the directory (a job listed by its first acquisition, a
// pool by its start) and the reads that list: Admin.Jobs, Admin.Runs,
// Admin.Pools.

// This file holds the directory of jobs and pools (Layout) and the reads
// that list what a table holds: each is a GetItem, a BatchGetItem or a
// Query on a key, so that its cost grows with what it returns, never with
// the table's history.

// Attributes of the directory's entries.
const (
	attrPool     = "pool" // S: a pool's entry: the pool's name
	attrPoolJobs = "jobs" // SS: a pool's entry: its jobs, as its last replica to start listed them
)

// list writes job's directory entry, then marks the lease item listed, so
// that later acquisitions skip it. It touches no attribute of the lease
// protocol. A failure is logged: the next acquisition tries again.
func (l *Lease) list(ctx context.Context, fence int64) {
	y := l.opts.Layout
	ctx = context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	entry := y.directoryKey(skJobPrefix, l.job)
	entry[attrJob] = avS(l.job)
	_, err := l.db.PutItem(cctx, &dynamodb.PutItemInput{TableName: aws.String(l.table), Item: entry})
	cancel()
	if err == nil {
		cctx, cancel = context.WithTimeout(ctx, l.opts.CallTimeout)
		_, err = l.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(l.table), Key: y.leaseKey(l.job),
			UpdateExpression:          aws.String("SET #listed = :true"),
			ConditionExpression:       aws.String("#fence = :fence"),
			ExpressionAttributeNames:  map[string]string{"#listed": attrListed, "#fence": attrFence},
			ExpressionAttributeValues: map[string]types.AttributeValue{":true": avBool(true), ":fence": avN(fence)},
		})
		cancel()
		if len(failedConditions(err)) > 0 {
			err = nil // a newer tenure lists it
		}
	}
	if err != nil {
		l.log.Warn("ddblease: could not list the job in the table's directory; the next acquisition tries again", "err", err)
	}
}

// batchGet reads the items of keys with strongly consistent BatchGetItem
// requests of up to 100 keys, sending unprocessed keys again, and returns
// the items found. what names the read for errors.
func batchGet(ctx context.Context, db DynamoDBAPI, table string, y Layout, what string, keys []map[string]types.AttributeValue,
	pause, timeout time.Duration) ([]map[string]types.AttributeValue, error) {
	var found []map[string]types.AttributeValue
	for start := 0; start < len(keys); start += 100 {
		req := map[string]types.KeysAndAttributes{table: {Keys: keys[start:min(start+100, len(keys))], ConsistentRead: aws.Bool(true)}}
		again := func(err error) bool { return err == errUnprocessed }
		n, stop, err := retrier{backoff: fixed(pause), again: again, attempts: 11, timeout: timeout}.do(ctx,
			func(ctx context.Context) error {
				out, err := db.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
				if err != nil {
					return fmt.Errorf("ddblease: %s: %w", what, explainTableError(ctx, db, table, y, err))
				}
				found = append(found, out.Responses[table]...)
				if req = out.UnprocessedKeys; len(req) > 0 {
					return errUnprocessed
				}
				return nil
			})
		switch {
		case stop == retryAttempts:
			return nil, fmt.Errorf("ddblease: %s: keys still unprocessed after %d rounds", what, n)
		case stop == retryEnded:
			return nil, fmt.Errorf("ddblease: %s: %w", what, context.Cause(ctx))
		case err != nil:
			return nil, err
		}
	}
	return found, nil
}

// query returns the items of partition pk whose sort key is from lo to
// hi, both included, in sort key order (backwards when newest is set),
// at most limit of them when limit is positive, with strongly consistent
// Query requests. what names the read for errors.
func query(ctx context.Context, db DynamoDBAPI, table string, y Layout, pk, lo, hi string, limit int, newest bool,
	timeout time.Duration, what string) ([]map[string]types.AttributeValue, error) {
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(table),
		KeyConditionExpression:    aws.String("#pk = :pk AND #sk BETWEEN :lo AND :hi"),
		ExpressionAttributeNames:  map[string]string{"#pk": y.PartitionKey, "#sk": y.SortKey},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": avS(pk), ":lo": avS(lo), ":hi": avS(hi)},
		ConsistentRead:            aws.Bool(true),
		ScanIndexForward:          aws.Bool(!newest),
	}
	var items []map[string]types.AttributeValue
	for {
		if limit > 0 {
			in.Limit = aws.Int32(int32(min(limit-len(items), 1000)))
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		out, err := db.Query(cctx, in)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("ddblease: %s: %w", what, explainTableError(ctx, db, table, y, err))
		}
		items = append(items, out.Items...)
		if len(out.LastEvaluatedKey) == 0 || limit > 0 && len(items) >= limit {
			return items, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// prefixRange returns the bounds of the sort keys that start with prefix.
func prefixRange(prefix string) (lo, hi string) { return prefix, prefix + "\U0010FFFF" }

// Jobs returns every job of the table, by name: the jobs its directory
// lists (each job is listed by its first acquisition), read with one
// Query of the directory and one BatchGetItem per 100 jobs, all strongly
// consistent, so that the cost grows with the jobs, not with the runs
// kept. Items it cannot decode are left out and reported in an error
// wrapping ErrMalformedItem, returned with the others.
func (a *Admin) Jobs(ctx context.Context) ([]JobStatus, error) {
	if err := a.checkSchema(ctx); err != nil {
		return nil, err
	}
	y := a.o.Layout
	lo, hi := prefixRange(skJobPrefix)
	entries, err := query(ctx, a.db, a.table, y, y.Prefix+pkDirectory, lo, hi, 0, false, a.o.CallTimeout, "list jobs")
	if err != nil {
		return nil, err
	}
	keys := make([]map[string]types.AttributeValue, 0, len(entries))
	for _, e := range entries {
		if sk, err := str(e, y.SortKey); err == nil {
			keys = append(keys, y.leaseKey(strings.TrimPrefix(sk, skJobPrefix)))
		}
	}
	items, err := batchGet(ctx, a.db, a.table, y, "read leases", keys, time.Second, a.o.CallTimeout)
	if err != nil {
		return nil, err
	}
	jobs := make([]JobStatus, 0, len(items))
	var errs []error
	for _, item := range items {
		pk, _ := str(item, y.PartitionKey)
		rec, err := decodeLease(y, item)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		jobs = append(jobs, JobStatus{Job: strings.TrimPrefix(pk, y.Prefix+skJobPrefix), Lease: rec})
	}
	recs := make([]*Record, len(jobs))
	for i := range jobs {
		recs[i] = &jobs[i].Lease
	}
	if err := a.sessionExpiries(ctx, recs); err != nil {
		return nil, err
	}
	slices.SortFunc(jobs, func(x, y JobStatus) int { return strings.Compare(x.Job, y.Job) })
	return jobs, errors.Join(errs...)
}

// RunRange selects the runs of a job by slot (Admin.Runs). The zero
// RunRange selects every run kept.
type RunRange struct {
	// From and To bound the slots, both included; a zero From or To
	// leaves that end open.
	From, To time.Time

	// Limit, when positive, returns at most Limit runs: the earliest of
	// the range, or with Newest the latest.
	Limit int

	// Newest returns the runs latest first.
	Newest bool
}

// Runs returns the runs of job kept in the table whose slots are in r, in
// slot order (latest first with r.Newest): schedule slots, triggered runs
// (after the slot run of the same instant) and slots skipped by a pause
// alike. It reads them with strongly consistent Query requests on the
// job's partition, from the first run in the range to the last: its cost
// grows with the runs it returns, not with the table. Unlike
// Lease.ListRuns it needs no schedule. Items it cannot decode are left
// out and reported in an error wrapping ErrMalformedItem.
func (a *Admin) Runs(ctx context.Context, job string, r RunRange) ([]RunRecord, error) {
	if err := checkName("job name", job, MaxJobLength); err != nil {
		return nil, err
	}
	if !r.From.IsZero() && !r.To.IsZero() && r.To.Before(r.From) {
		return nil, invalid("Runs: To (%v) is before From (%v)", r.To, r.From)
	}
	if err := a.checkSchema(ctx); err != nil {
		return nil, err
	}
	y := a.o.Layout
	lo, hi := prefixRange(skRunPrefix)
	if !r.From.IsZero() {
		lo = runSK(r.From, "")
	}
	if !r.To.IsZero() {
		hi = runSK(r.To, "") + "#\U0010FFFF" // the triggered runs of To too
	}
	items, err := query(ctx, a.db, a.table, y, y.jobPartition(job), lo, hi, r.Limit, r.Newest, a.o.CallTimeout,
		fmt.Sprintf("list runs %q", job))
	if err != nil {
		return nil, err
	}
	runs := make([]RunRecord, 0, len(items))
	var errs []error
	for _, item := range items {
		rec, err := decodeRun(y, item)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		runs = append(runs, rec)
	}
	return runs, errors.Join(errs...)
}

// PoolStatus is a pool as an operator sees it (Admin.Pools).
type PoolStatus struct {
	Name string
	// Jobs are the pool's jobs as the replica that started last listed
	// them.
	Jobs []string
	// Members are the replicas whose member items the pool's partition
	// holds, by owner: live ones, and ones gone that no replica has
	// removed yet (see PoolMember.ExpiresAt).
	Members []PoolMember
}

// PoolMember is a replica's member item in a pool.
type PoolMember struct {
	Owner string
	// Declined are the jobs the replica declines, after an operator's
	// resign request (docs/pool.md), sorted; nil if none.
	Declined []string
	// ExpiresAt is the expiry the replica wrote at its last renewal, by
	// its clock: it is live while ExpiresAt is not older than
	// MaxClockSkew.
	ExpiresAt time.Time
}

// Pools returns every pool of the table, by name, with its members: one
// Query of the directory, and one of each pool's partition.
func (a *Admin) Pools(ctx context.Context) ([]PoolStatus, error) {
	if err := a.checkSchema(ctx); err != nil {
		return nil, err
	}
	y := a.o.Layout
	lo, hi := prefixRange(skPoolPrefix)
	entries, err := query(ctx, a.db, a.table, y, y.Prefix+pkDirectory, lo, hi, 0, false, a.o.CallTimeout, "list pools")
	if err != nil {
		return nil, err
	}
	pools := make([]PoolStatus, 0, len(entries))
	for _, e := range entries {
		sk, _ := str(e, y.SortKey)
		p := PoolStatus{Name: strings.TrimPrefix(sk, skPoolPrefix)}
		if jobs, ok := e[attrPoolJobs].(*types.AttributeValueMemberSS); ok {
			p.Jobs = slices.Sorted(slices.Values(jobs.Value))
		}
		if p.Members, err = a.members(ctx, p.Name); err != nil {
			return nil, err
		}
		pools = append(pools, p)
	}
	return pools, nil
}

// members reads the member items of pool.
func (a *Admin) members(ctx context.Context, pool string) ([]PoolMember, error) {
	y := a.o.Layout
	lo, hi := prefixRange(skMember)
	items, err := query(ctx, a.db, a.table, y, y.poolPartition(pool), lo, hi, 0, false, a.o.CallTimeout,
		fmt.Sprintf("list the members of pool %q", pool))
	if err != nil {
		return nil, err
	}
	var out []PoolMember
	for _, item := range items {
		if m, err := decodeMember(y, item); err == nil {
			out = append(out, PoolMember{Owner: m.owner, ExpiresAt: time.UnixMilli(m.exp), Declined: m.declined})
		}
	}
	return out, nil
}
