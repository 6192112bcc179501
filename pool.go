package ddblease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Pool runs a set of singleton jobs spread across the replicas that run the
// same pool: each replica leads its share of the jobs (the jobs divided by
// the live replicas, rounded up or down), hands its surplus over (drained,
// then resigned) when another replica joins, and takes its share of the
// jobs of one that leaves or dies. Each job is a lease of its own, with
// every guarantee of a single lease: one leader at a time, a fence that
// grows, a drain on hand-over.
//
// The replicas know each other through their member items in the pool's
// partition of the same table (Layout), each renewing its own every
// HeartbeatInterval (one UpdateItem, then one Query that reads the
// others'): its expiry, and the view it acts on (which replicas it sees
// live). A
// replica that stops renewing counts as gone once its expiry, a
// LeaseDuration after its last renewal, is MaxClockSkew old, or once the
// others have read its entry unchanged for a LeaseDuration by their
// runtime clocks (its wall clock may have been ahead); one that stops
// running the pool removes itself first, so that the others take its jobs
// within a HeartbeatInterval of its shutdown. From the live replicas each
// computes the same assignment: the jobs, in the order of a hash, each go
// to the live replica ranked highest for it (rendezvous hashing) that has
// fewer than its share, so that a change of replicas moves few jobs besides
// the ones it must. A replica campaigns only for the jobs assigned to it,
// and hands a job it leads over only to a replica whose entry says it acts
// on the same view, and so campaigns for that job (a replica whose view
// changes writes its entry again at once). A job waits for a replica that
// joined, left or died to be seen (up to a HeartbeatInterval, or the dead
// replica's expiry; a join, up to two), then for its lease as any standby
// does.
type Pool struct {
	db      DynamoDBAPI
	table   string
	name    string
	jobs    []string // sorted, unique
	leases  map[string]*Lease
	opts    Options // resolved: the same for every job's lease
	log     *slog.Logger
	running atomic.Bool

	mu   sync.Mutex
	live []string // the live replicas last seen, sorted; nil before the first look
	// views holds, for each live replica, the view it last wrote it acts
	// on (viewOf its live replicas): a job is handed over only to a replica
	// that acts on the same view, so that it campaigns for the job.
	views map[string]string

	// watched holds each member's expiry as last read, and when it was
	// first read so by the runtime clock (renew's alone: no lock).
	watched map[string]watchedEntry
}

// watchedEntry is a member's expiry as last read, and since when.
type watchedEntry struct {
	exp   int64
	since time.Time
}

// NewPool returns a pool of jobs in table, run by this replica as
// Options.Owner. Each job is a lease of its own (New), with the options
// given; the pool's name and the jobs' names follow the rules of job names.
// It makes no call.
func NewPool(db DynamoDBAPI, table, pool string, jobs []string, optFns ...func(*Options)) (*Pool, error) {
	contends := []string{"pool\x00" + pool}
	for _, job := range jobs {
		contends = append(contends, "job\x00"+job)
	}
	o, err := checkNew(db, table, "pool name", pool, contends, optFns)
	if err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return nil, invalid("pool %q has no jobs", pool)
	}
	p := &Pool{db: db, table: table, name: pool, opts: o, leases: make(map[string]*Lease, len(jobs)),
		log: lineLogger(o.Logger, "pool", pool, o.Owner)}
	for _, job := range jobs {
		if _, dup := p.leases[job]; dup {
			return nil, invalid("pool %q: job %q is listed twice", pool, job)
		}
		l, err := New(db, table, job, func(lo *Options) { *lo = o })
		if err != nil {
			return nil, fmt.Errorf("pool %q: %w", pool, err)
		}
		p.leases[job] = l
		p.jobs = append(p.jobs, job)
	}
	slices.Sort(p.jobs)
	return p, nil
}

// Lease returns the lease of job, nil if job is not in the pool: for
// IsLeader, State, a Guard's fence and the other per-job calls.
func (p *Pool) Lease(job string) *Lease { return p.leases[job] }

// Members returns the replicas the pool last saw live, sorted (nil before
// Run's first look at the pool's item).
func (p *Pool) Members() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.live)
}

// Assigned returns the jobs assigned to this replica by the replicas last
// seen live, sorted: those it leads or campaigns for.
func (p *Pool) Assigned() []string {
	p.mu.Lock()
	live := p.live
	p.mu.Unlock()
	return Assign(p.jobs, live)[p.opts.Owner]
}

// Assign returns the assignment of jobs to replicas that every replica of a
// pool computes from the same live replicas: owner -> its jobs, sorted.
// Each replica gets len(jobs)/len(replicas) jobs, or one more.
func Assign(jobs, replicas []string) map[string][]string {
	out := make(map[string][]string, len(replicas))
	if len(replicas) == 0 {
		return out
	}
	reps := slices.Clone(replicas)
	slices.Sort(reps)
	reps = slices.Compact(reps)
	js := slices.Clone(jobs)
	slices.Sort(js)
	js = slices.Compact(js)
	hashes := make(map[string]uint64, len(js))
	for _, j := range js {
		hashes[j] = hash64(j)
	}
	slices.SortFunc(js, func(a, b string) int { return cmp.Or(cmp.Compare(hashes[a], hashes[b]), cmp.Compare(a, b)) })
	limit := (len(js) + len(reps) - 1) / len(reps)
	spare := len(js) - (limit-1)*len(reps) // replicas that may get the extra job
	type rank struct {
		rep string
		h   uint64
	}
	ranks := make([]rank, len(reps))
	for _, j := range js {
		for i, r := range reps {
			ranks[i] = rank{r, hash64(j + "\x00" + r)}
		}
		slices.SortFunc(ranks, func(a, b rank) int { return cmp.Or(cmp.Compare(b.h, a.h), cmp.Compare(a.rep, b.rep)) })
		for _, r := range ranks {
			n := len(out[r.rep])
			if n < limit-1 || n == limit-1 && spare > 0 {
				if n == limit-1 {
					spare--
				}
				out[r.rep] = append(out[r.rep], j)
				break
			}
		}
	}
	for _, v := range out {
		slices.Sort(v)
	}
	return out
}

func hash64(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	x := h.Sum64()
	// A finalizer spreads the bits of near keys (job-001, job-002).
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

// Run runs this replica's share of the pool until ctx ends: it renews its
// membership every HeartbeatInterval, and runs Lease.Run, with fn, for each
// job assigned to it, cancelling the Run of a job assigned elsewhere (it
// drains and resigns, and the job's new replica takes it). fn is called as
// Lease.Run calls it, with the job's name.
//
// When ctx ends, Run removes this replica from the pool's item, then drains
// and resigns every job it leads, and returns nil. An error fn returns
// while it leads (not after its tenure ended), or a panic in fn (as a
// *PanicError), stops the pool on this replica the same way, and is
// returned, naming its job. A second Run on
// the same pool while one is active is an error.
func (p *Pool) Run(ctx context.Context, fn func(ctx context.Context, job string, fence int64) error) error {
	if fn == nil {
		return invalid("pool %q: Run: fn is nil", p.name)
	}
	if !p.running.CompareAndSwap(false, true) {
		return invalid("pool %q: another Run is active on this pool", p.name)
	}
	defer p.running.Store(false)
	if ctx.Err() != nil {
		return fmt.Errorf("ddblease: pool %q: %w", p.name, ended(ctx))
	}
	p.list(ctx)
	type jobRun struct {
		cancel    context.CancelFunc
		cancelled bool // handed over, or stopped with the pool
		done      chan struct{}
		err       error
	}
	runs := map[string]*jobRun{}
	finished := make(chan string, len(p.jobs))
	runCtx, stopAll := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAll()
	// stop leaves the pool, then drains and resigns every job, and returns
	// their errors (a drain timeout, a resignation that failed) with the
	// one that stopped the pool, if any.
	stop := func(failed error) error {
		p.leave()
		for _, r := range runs {
			r.cancel()
		}
		errs := []error{failed}
		for _, job := range slices.Sorted(maps.Keys(runs)) {
			r := runs[job]
			<-r.done
			if r.err != nil {
				errs = append(errs, fmt.Errorf("ddblease: pool %q: job %q: %w", p.name, job, r.err))
			}
		}
		return errors.Join(errs...)
	}
	var seenAt time.Time // when this replica's membership was last renewed
	for {
		live, views, err := p.renew(ctx)
		now := p.opts.Now()
		switch {
		case err == nil:
			seenAt = now
		case ctx.Err() != nil:
		default:
			p.log.Warn("ddblease: could not renew the pool membership", "err", err)
			if !seenAt.IsZero() && now.Sub(seenAt) > p.opts.LeaseDuration-p.opts.margin() {
				// The others count this replica gone: lead nothing they
				// may have taken on.
				live = []string{}
			}
		}
		if live != nil {
			p.mu.Lock()
			p.live, p.views = live, views
			p.mu.Unlock()
		}
		live, views = p.seen()
		mine, owners := viewOf(live), map[string]string{}
		for rep, jobs := range Assign(p.jobs, live) {
			for _, job := range jobs {
				owners[job] = rep
			}
		}
		for job, r := range runs {
			to := owners[job]
			if to == p.opts.Owner || r.cancelled {
				continue
			}
			if to != "" && views[to] != mine && p.leases[job].IsLeader() {
				// Its replica does not act on this view yet, and may not
				// campaign for the job: keep leading it until it does.
				continue
			}
			r.cancelled = true
			r.cancel() // a hand-over: the job's Run drains and resigns
		}
		want := map[string]bool{}
		for job, to := range owners {
			if to == p.opts.Owner {
				want[job] = true
			}
		}
		for job := range want {
			if _, ok := runs[job]; ok || ctx.Err() != nil {
				continue
			}
			jctx, cancel := context.WithCancel(runCtx)
			r := &jobRun{cancel: cancel, done: make(chan struct{})}
			runs[job] = r
			l := p.leases[job]
			go func() {
				defer close(r.done)
				defer func() { finished <- job }()
				defer func() {
					// A panic in fn (Run resigned, then panicked again) ends
					// the pool like fn's error: nothing above this
					// goroutine could recover it.
					if v := recover(); v != nil {
						pe, ok := v.(*PanicError)
						if !ok {
							pe = &PanicError{Value: v, Stack: debug.Stack()}
						}
						r.err = pe
					}
				}()
				r.err = runJob(jctx, l, job, fn)
			}()
		}
		wait := time.NewTimer(jitter(p.opts.HeartbeatInterval))
	waiting:
		for {
			select {
			case <-ctx.Done():
				wait.Stop()
				return stop(nil)
			case job := <-finished:
				r := runs[job]
				delete(runs, job)
				switch {
				case r.err == nil:
				case r.cancelled:
					p.log.Warn("ddblease: a job handed over did not end cleanly", "job", job, "err", r.err)
				default:
					// fn failed while it led: the pool stops, as Run does.
					wait.Stop()
					return stop(fmt.Errorf("ddblease: pool %q: job %q: %w", p.name, job, r.err))
				}
			case <-wait.C:
				break waiting
			}
		}
	}
}

// runJob runs the lease of job until jctx ends. A job started as the pool
// stopped or handed it over, whose Run found jctx already ended, attempted
// nothing: that is no error.
func runJob(jctx context.Context, l *Lease, job string, fn func(context.Context, string, int64) error) error {
	err := l.Run(jctx, func(ctx context.Context, fence int64) error { return fn(ctx, job, fence) })
	if errors.As(err, new(endedBeforeRun)) {
		return nil
	}
	return err
}

// seen returns the live replicas last seen and the view each acts on.
func (p *Pool) seen() ([]string, map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.live, p.views
}

// viewOf names a set of live replicas (sorted): the same set, the same
// name; "" for none.
func viewOf(live []string) string {
	if len(live) == 0 {
		return ""
	}
	h := fnv.New64a()
	for _, r := range live {
		_, _ = h.Write([]byte(r))
		_, _ = h.Write([]byte{0})
	}
	return strconv.FormatUint(h.Sum64(), 36)
}

// maxWrites bounds the writes of one renewal whose answers keep showing
// another view than the one written.
const maxWrites = 3

// renew writes this replica's entry in the pool's item (its expiry, and the
// view it acts on) and returns the live replicas the answer lists, sorted,
// with the view each acts on. An answer that shows another view than the
// one written is written again at once, so that the others learn within a
// round trip which view this replica acts on.
func (p *Pool) renew(ctx context.Context) ([]string, map[string]string, error) {
	live, _ := p.seen()
	view := viewOf(live)
	var views map[string]string
	for range maxWrites {
		members, err := p.write(ctx, view)
		if err != nil {
			return nil, nil, err
		}
		now := p.opts.Now()
		p.watch(members)
		p.forgetDead(ctx, members, now)
		live = p.liveIn(members, now)
		views = make(map[string]string, len(live))
		for _, r := range live {
			views[r] = members[r].view
		}
		if viewOf(live) == view {
			break
		}
		view = viewOf(live)
	}
	return live, views, nil
}

// write renews this replica's member item (its expiry, and the view it
// acts on), then reads the pool's member items, and returns the members
// they list.
func (p *Pool) write(ctx context.Context, view string) (map[string]member, error) {
	y := p.opts.Layout
	cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
	_, err := p.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(p.table),
		Key:                       y.memberKey(p.name, p.opts.Owner),
		UpdateExpression:          aws.String("SET #x = :x, #v = :v"),
		ExpressionAttributeNames:  map[string]string{"#x": memberExpiry, "#v": memberView},
		ExpressionAttributeValues: map[string]types.AttributeValue{":x": avN(p.opts.Now().Add(p.opts.LeaseDuration).UnixMilli()), ":v": avS(view)},
	})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("ddblease: pool %q: renew membership: %w", p.name, explainTableError(ctx, p.db, p.table, y, err))
	}
	lo, hi := prefixRange(skMember)
	items, err := query(ctx, p.db, p.table, y, y.poolPartition(p.name), lo, hi, 0, false, p.opts.CallTimeout,
		fmt.Sprintf("pool %q: read the members", p.name))
	if err != nil {
		return nil, err
	}
	out := make(map[string]member, len(items))
	for _, item := range items {
		m, err := decodeMember(y, item)
		if err != nil {
			p.log.Warn("ddblease: the pool has a malformed member item; ignoring it", "err", err)
		}
		if m.owner != "" {
			out[m.owner] = m
		}
	}
	return out, nil
}

// Attributes of a pool's member item.
const (
	memberExpiry = "exp"  // N: the member's expiry, Unix ms, by its clock
	memberView   = "view" // S: the view it acts on (viewOf)
)

// member is a pool's member item.
type member struct {
	owner string
	exp   int64 // Unix ms; -1 if the item is malformed
	view  string
}

// decodeMember reads a member item. A malformed one is returned with
// expiry -1 (it is ignored, then removed) and an error, with its owner
// when its key names one.
func decodeMember(y Layout, item map[string]types.AttributeValue) (member, error) {
	m := member{exp: -1}
	sk, err := str(item, y.SortKey)
	if err == nil {
		m.owner = strings.TrimPrefix(sk, skMember)
	}
	exp, eerr := num(item, memberExpiry)
	view, verr := str(item, memberView)
	if err = errors.Join(err, eerr, verr); err != nil || exp < 0 {
		return m, fmt.Errorf("%w: member item %q: %v", ErrMalformedItem, y.describe(item), errors.Join(err, fmt.Errorf("expiry %d", exp)))
	}
	m.exp, m.view = exp, view
	return m, nil
}

// watch records, for each member, since when its entry's expiry has been
// read unchanged, by the runtime clock.
func (p *Pool) watch(members map[string]member) {
	if p.watched == nil {
		p.watched = map[string]watchedEntry{}
	}
	real := time.Now()
	for owner, m := range members {
		if w, ok := p.watched[owner]; !ok || w.exp != m.exp {
			p.watched[owner] = watchedEntry{exp: m.exp, since: real}
		}
	}
	for owner := range p.watched {
		if _, ok := members[owner]; !ok {
			delete(p.watched, owner)
		}
	}
}

// unchanged returns how long owner's entry has been read unchanged.
func (p *Pool) unchanged(owner string) time.Duration {
	w, ok := p.watched[owner]
	if !ok {
		return 0
	}
	return time.Since(w.since)
}

// liveIn returns the members still live at now, sorted. A member is gone,
// as a lease may be taken (takeover.go), once its expiry is MaxClockSkew
// old, or once its entry has been read unchanged for a LeaseDuration by
// the runtime clock: a replica whose wall clock was ahead when it last
// renewed wrote an expiry too far out, and no clocks are compared then.
func (p *Pool) liveIn(members map[string]member, now time.Time) []string {
	live := []string{}
	for owner, m := range members {
		if m.exp >= 0 && time.UnixMilli(m.exp).Add(p.opts.MaxClockSkew).After(now) &&
			(owner == p.opts.Owner || p.unchanged(owner) < p.opts.LeaseDuration) {
			live = append(live, owner)
		}
	}
	slices.Sort(live)
	return live
}

// maxForget bounds the members one renewal removes from the pool's item.
const maxForget = 10

// forgetDead deletes the member items whose expiry is older than a
// LeaseDuration, or which have been read unchanged for two (replicas that
// died, or whose leave failed), and malformed ones, so that the pool's
// partition does not grow with every deploy. Each deletion is conditional
// on the item being unchanged; a failure is left for a later renewal.
func (p *Pool) forgetDead(ctx context.Context, members map[string]member, now time.Time) {
	n := 0
	for owner, m := range members {
		ms := m.exp
		if owner == p.opts.Owner || n == maxForget ||
			ms >= 0 && !time.UnixMilli(ms).Add(p.opts.LeaseDuration).Before(now) &&
				p.unchanged(owner) < 2*p.opts.LeaseDuration {
			continue
		}
		n++
		in := &dynamodb.DeleteItemInput{TableName: aws.String(p.table), Key: p.opts.Layout.memberKey(p.name, owner)}
		if ms >= 0 {
			in.ConditionExpression = aws.String("#x = :v")
			in.ExpressionAttributeNames = map[string]string{"#x": memberExpiry}
			in.ExpressionAttributeValues = map[string]types.AttributeValue{":v": avN(ms)}
		}
		cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
		_, err := p.db.DeleteItem(cctx, in)
		cancel()
		if err == nil {
			p.log.Info("ddblease: removed a replica gone from the pool", "member", owner)
		}
	}
}

// leave deletes this replica's member item, so that the others take its
// jobs at their next renewal rather than at its expiry. A failure is
// logged: the expiry still ends the membership.
func (p *Pool) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.CallTimeout)
	defer cancel()
	_, err := p.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(p.table), Key: p.opts.Layout.memberKey(p.name, p.opts.Owner),
	})
	if err != nil {
		p.log.Warn("ddblease: could not leave the pool; the others take its jobs at its expiry", "err", err)
	}
	p.mu.Lock()
	p.live = nil
	p.mu.Unlock()
}

// list writes the pool's directory entry, with its jobs, so that Admin
// lists it. A failure is logged: the pool runs all the same.
func (p *Pool) list(ctx context.Context) {
	entry := p.opts.Layout.directoryKey(skPoolPrefix, p.name)
	entry[attrPool] = avS(p.name)
	entry[attrPoolJobs] = &types.AttributeValueMemberSS{Value: p.jobs}
	cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
	defer cancel()
	if _, err := p.db.PutItem(cctx, &dynamodb.PutItemInput{TableName: aws.String(p.table), Item: entry}); err != nil {
		p.log.Warn("ddblease: could not list the pool in the table's directory", "err", err)
	}
}
