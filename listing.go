package ddblease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the directory (a job listed by its first acquisition,
// fence.go; a pool by its start, poolmember.go) and the reads that list:
// Lease.ListRuns, Admin.Jobs, Admin.Runs, Admin.Run, Admin.Pools,
// Admin.Pool. Each is a GetItem, a BatchGetItem or a Query on a key, so
// that its cost grows with what it returns, never with the table's
// history.

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

// Run reads one run of job by its id with a strongly consistent read (one
// GetItem): a slot in RFC 3339, as RunRecord.Slot formats it, or a
// triggered run's Trigger.RunID ("<slot>#trigger-<id>"), such as
// Record.LastFailedRun. ok is false when the table holds no such run
// (never claimed, or deleted by its time to live). An id that is neither
// is an error wrapping ErrInvalid; an item it cannot decode, one wrapping
// ErrMalformedItem.
func (a *Admin) Run(ctx context.Context, job, id string) (rec RunRecord, ok bool, err error) {
	if err := checkName("job name", job, MaxJobLength); err != nil {
		return RunRecord{}, false, err
	}
	sk, err := runSKOf(id)
	if _, trigger, isTrigger := strings.Cut(id, "#trigger-"); err != nil || isTrigger && !validTriggerID(trigger) {
		return RunRecord{}, false, invalid("Run: %q is not a run id (a slot in RFC 3339, or <slot>#trigger-<16 hex digits>)", id)
	}
	if err := a.checkSchema(ctx); err != nil {
		return RunRecord{}, false, err
	}
	item, err := getItem(ctx, a.db, a.table, a.o.Layout.runKey(job, sk), a.o.CallTimeout)
	if err != nil {
		return RunRecord{}, false, fmt.Errorf("ddblease: read run %q %s: %w", job, id, explainTableError(ctx, a.db, a.table, a.o.Layout, err))
	}
	if len(item) == 0 {
		return RunRecord{}, false, nil
	}
	rec, err = decodeRun(a.o.Layout, item)
	return rec, err == nil, err
}

// PoolStatus is a pool as an operator sees it (Admin.Pools).
type PoolStatus struct {
	Name string
	// Jobs are the pool's jobs as the replica that started last listed
	// them.
	Jobs []string
	// JobListHash names Jobs as a member item names its replica's job
	// list (PoolMember.JobListHash).
	JobListHash string
	// Members are the replicas whose member items the pool's partition
	// holds, by owner: live ones, and ones gone that no replica has
	// removed yet (see PoolMember.ExpiresAt).
	Members []PoolMember
}

// PoolMember is a replica's member item in a pool.
type PoolMember struct {
	Owner string
	// Declined are the jobs the replica declines, after an operator's
	// resign request or a forced release (docs/pool.md), sorted; nil if
	// none.
	Declined []string
	// ExpiresAt is the expiry the replica wrote at its last renewal, by
	// its clock: it is live while ExpiresAt is not older than
	// MaxClockSkew. Zero for a member item that could not be decoded
	// (Pools reports it in its error).
	ExpiresAt time.Time
	// RenewedAt is when the replica sent its last renewal, by its clock;
	// zero if the item does not record it.
	RenewedAt time.Time
	// JobListHash names the replica's job list: one that differs from
	// the pool's (PoolStatus.JobListHash) runs another list, as during a
	// deploy that adds or removes jobs.
	JobListHash string
	// Leaving says the replica is stopping: draining and resigning its
	// jobs before it deletes its item.
	Leaving bool
	// EndedBy names the replica that ended this member's lapsed session;
	// empty while the session is not ended.
	EndedBy string
}

// Pools returns every pool of the table, by name, with its members: one
// Query of the directory, and one of each pool's partition. A member item
// it cannot decode is listed by its owner with a zero ExpiresAt and
// reported in an error wrapping ErrMalformedItem, returned with the pools.
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
	var bad []error
	for _, e := range entries {
		sk, _ := str(e, y.SortKey)
		p, merrs, err := a.pool(ctx, strings.TrimPrefix(sk, skPoolPrefix), e)
		if err != nil {
			return nil, err
		}
		bad = append(bad, merrs...)
		pools = append(pools, p)
	}
	return pools, errors.Join(bad...)
}

// Pool returns one pool by name, as Pools does: one GetItem of its
// directory entry and one Query of its partition. ok is false when the
// table has no such pool (no replica of it ever started).
func (a *Admin) Pool(ctx context.Context, name string) (p PoolStatus, ok bool, err error) {
	if err := checkName("pool name", name, MaxJobLength); err != nil {
		return PoolStatus{}, false, err
	}
	if err := a.checkSchema(ctx); err != nil {
		return PoolStatus{}, false, err
	}
	entry, err := getItem(ctx, a.db, a.table, a.o.Layout.directoryKey(skPoolPrefix, name), a.o.CallTimeout)
	if err != nil {
		return PoolStatus{}, false, fmt.Errorf("ddblease: read the entry of pool %q: %w", name, explainTableError(ctx, a.db, a.table, a.o.Layout, err))
	}
	if len(entry) == 0 {
		return PoolStatus{}, false, nil
	}
	p, bad, err := a.pool(ctx, name, entry)
	if err != nil {
		return PoolStatus{}, false, err
	}
	return p, true, errors.Join(bad...)
}

// pool makes the status of pool name from its directory entry, reading
// its members.
func (a *Admin) pool(ctx context.Context, name string, entry map[string]types.AttributeValue) (PoolStatus, []error, error) {
	p := PoolStatus{Name: name}
	if jobs, ok := entry[attrPoolJobs].(*types.AttributeValueMemberSS); ok {
		p.Jobs = slices.Sorted(slices.Values(jobs.Value))
	}
	p.JobListHash = listHash(p.Jobs)
	var bad []error
	var err error
	p.Members, bad, err = a.members(ctx, name)
	return p, bad, err
}

// members reads the member items of pool, by owner; those it cannot
// decode are listed by owner alone and reported in bad.
func (a *Admin) members(ctx context.Context, pool string) (out []PoolMember, bad []error, err error) {
	y := a.o.Layout
	lo, hi := prefixRange(skMember)
	items, err := query(ctx, a.db, a.table, y, y.poolPartition(pool), lo, hi, 0, false, a.o.CallTimeout,
		fmt.Sprintf("list the members of pool %q", pool))
	if err != nil {
		return nil, nil, err
	}
	for _, item := range items {
		m, err := decodeMember(y, item)
		if err != nil {
			out, bad = append(out, PoolMember{Owner: m.owner}), append(bad, err)
			continue
		}
		pm := PoolMember{Owner: m.owner, ExpiresAt: time.UnixMilli(m.exp), Declined: m.declined,
			JobListHash: m.jobs, Leaving: m.leaving, EndedBy: m.ended}
		if m.renewed != 0 {
			pm.RenewedAt = time.UnixMilli(m.renewed)
		}
		out = append(out, pm)
	}
	return out, bad, nil
}

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
		if item, ok := items[id]; ok {
			rec, err := decodeRun(l.opts.Layout, item)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			runs = append(runs, rec)
		}
	}
	return runs, errors.Join(errs...)
}
