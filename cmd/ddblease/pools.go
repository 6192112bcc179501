package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
)

// pools reads, by key only (docs/deploy.md, "The items"):
//
//   - the jobs' lease items, as status does (Admin.Jobs: one Query of the
//     directory, one BatchGetItem per 100 jobs, and one per 100 pool
//     sessions the jobs are bound to), for who leads each job;
//   - the pools' directory entries (one Query of the directory: each
//     pool's name and job list);
//   - each pool's member items (one Query of the pool's partition): each
//     replica's session, expiry, last renewal, job list hash and declines.
//
// So 2 + P Queries and 1 + J/100 + S/100 BatchGetItems for P pools, J jobs
// and S sessions, whatever the runs kept; never a Scan.

// poolsAbout is pools' help.
const poolsAbout = `Shows each pool of the table (docs/pool.md) and, per member item (one per
replica running the pool): its state (live, leaving, ended by another
replica, or expired by its recorded expiry and this command's clock,
allowing --max-clock-skew), how long ago its session's last renewal was
sent, its expiry, how many of the pool's jobs it leads (their lease items
name it and are not free), the jobs it declines, and the hash of its job
list, which differs from the pool's while a deploy adds or removes jobs.
A row with member "-" counts the pool's jobs no member leads.

With --json, one object per pool; durations are numbers of seconds
(renewalAgeSeconds, expiresInSeconds).

It reads by key only: the lease items as status does (one Query of the
directory, one BatchGetItem per 100 jobs and per 100 sessions), one Query
of the directory for the pools, and one Query of each pool's partition
for its members.`

// poolListing is a pool as pools prints it.
type poolListing struct {
	Pool string `json:"pool"`
	// Jobs are the pool's jobs as the replica that started last listed
	// them (its directory entry).
	Jobs []string `json:"jobs"`
	// JobListHash is the hash of Jobs, as a member item names its
	// replica's list: a member whose hash differs runs another job list
	// (a deploy that adds or removes jobs).
	JobListHash string          `json:"jobListHash"`
	Members     []memberListing `json:"members"`
	// Unled are the pool's jobs that no member leads.
	Unled []string `json:"unled"`
}

// memberListing is a member item of a pool, as pools prints it.
type memberListing struct {
	Owner string `json:"owner"`
	// State is live, leaving, ended (another replica ended its lapsed
	// session) or expired (its expiry is older than --max-clock-skew by
	// this command's clock), or malformed.
	State     string     `json:"state"`
	RenewedAt *time.Time `json:"renewedAt,omitempty"`
	// RenewalAgeSeconds is how long ago, by this command's clock, its last
	// renewal was sent (by the replica's clock); nil if the item has no
	// renewal time.
	RenewalAgeSeconds *float64   `json:"renewalAgeSeconds,omitempty"`
	ExpiresAt         *time.Time `json:"expiresAt,omitempty"`
	// ExpiresInSeconds is the recorded expiry minus this command's clock
	// (negative once it passed), good to the replicas' clock skew.
	ExpiresInSeconds *float64 `json:"expiresInSeconds,omitempty"`
	// Leads are the pool's jobs whose lease item names this member as
	// its holder and is not free; LeadsCount is their number.
	Leads      []string `json:"leads"`
	LeadsCount int      `json:"leadsCount"`
	Declined   []string `json:"declined"`
	// JobListHash is the hash of the replica's job list; SameJobList
	// says whether it is the pool's (JobListHash of the pool).
	JobListHash string `json:"jobListHash"`
	SameJobList bool   `json:"sameJobList"`
}

func (e *env) pools(ctx context.Context, args []string) error {
	if len(args) != 0 {
		return usagef("pools: takes no arguments")
	}
	jobs, errs, err := e.jobs(ctx, nil)
	if err != nil {
		return err
	}
	entries, err := e.poolEntries(ctx)
	if err != nil {
		return err
	}
	now := e.now()
	views := make([]poolListing, 0, len(entries))
	for _, p := range entries {
		members, merrs, err := e.poolMembers(ctx, p.name)
		if err != nil {
			return err
		}
		errs = append(errs, merrs...)
		views = append(views, e.viewPool(p, members, jobs, now))
	}
	if e.g.json {
		if err := writeJSON(e.out, views); err != nil {
			return err
		}
		return errors.Join(errs...)
	}
	tw := tabwriter.NewWriter(e.out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "POOL\tJOBS\tMEMBER\tSTATE\tRENEWED\tEXPIRES IN (±%v)\tLEADS\tDECLINED\tJOB LIST\n", e.g.skew)
	for _, p := range views {
		for _, m := range p.Members {
			list := m.JobListHash
			if !m.SameJobList {
				list += " (not the pool's " + p.JobListHash + ")"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", p.Pool, len(p.Jobs), m.Owner, m.State,
				ago(m.RenewalAgeSeconds), secs(m.ExpiresInSeconds), m.LeadsCount, dash(strings.Join(m.Declined, ",")), dash(list))
		}
		if len(p.Unled) > 0 || len(p.Members) == 0 {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t-\t-\t%d\t-\t%s\n", p.Pool, len(p.Jobs), "-", "no leader", len(p.Unled), p.JobListHash)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(views) == 0 {
		e.log.Info(fmt.Sprintf("no pools in table %q", e.g.table))
	}
	return errors.Join(errs...)
}

// viewPool is pool p as pools prints it: its members, and the jobs each
// leads among jobs (every job of the table).
func (e *env) viewPool(p poolEntry, members []poolMemberItem, jobs []ddblease.JobStatus, now time.Time) poolListing {
	v := poolListing{Pool: p.name, Jobs: p.jobs, JobListHash: jobListHash(p.jobs), Members: []memberListing{}, Unled: []string{}}
	inPool := map[string]bool{}
	for _, j := range p.jobs {
		inPool[j] = true
	}
	holder := map[string]string{}
	for _, j := range jobs {
		if (inPool[j.Job] || j.Lease.Pool == p.name) && !j.Free(now, e.g.skew) {
			holder[j.Job] = j.Lease.Owner
		}
	}
	for _, m := range members {
		mv := memberListing{Owner: m.owner, State: m.state(now, e.g.skew), Declined: m.declined, Leads: []string{},
			JobListHash: m.list, SameJobList: m.list == v.JobListHash}
		if mv.Declined == nil {
			mv.Declined = []string{}
		}
		if !m.renewed.IsZero() {
			age := now.Sub(m.renewed).Seconds()
			mv.RenewedAt, mv.RenewalAgeSeconds = tp(m.renewed), &age
		}
		if !m.expires.IsZero() {
			in := m.expires.Sub(now).Seconds()
			mv.ExpiresAt, mv.ExpiresInSeconds = tp(m.expires), &in
		}
		for _, j := range sortedKeys(holder) {
			if holder[j] == m.owner {
				mv.Leads = append(mv.Leads, j)
			}
		}
		mv.LeadsCount = len(mv.Leads)
		v.Members = append(v.Members, mv)
	}
	led := map[string]bool{}
	for _, m := range v.Members {
		for _, j := range m.Leads {
			led[j] = true
		}
	}
	for _, j := range p.jobs {
		if !led[j] {
			v.Unled = append(v.Unled, j)
		}
	}
	return v
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ago is a renewal age as the RENEWED column shows it.
func ago(s *float64) string {
	if s == nil {
		return "-"
	}
	return dur(time.Duration(*s*float64(time.Second))) + " ago"
}

// secs is a number of seconds as a column shows it.
func secs(s *float64) string {
	if s == nil {
		return "-"
	}
	return dur(time.Duration(*s * float64(time.Second)))
}

// jobListHash is the hash a member item names its replica's job list by
// (the attribute list, docs/pool.md): FNV-1a of the sorted names, each
// ended by a zero byte, in base 36.
func jobListHash(jobs []string) string {
	sorted := slices.Sorted(slices.Values(jobs))
	h := fnv.New64a()
	for _, j := range sorted {
		_, _ = h.Write([]byte(j))
		_, _ = h.Write([]byte{0})
	}
	return strconv.FormatUint(h.Sum64(), 36)
}

// poolEntry is a pool's entry in the directory.
type poolEntry struct {
	name string
	jobs []string // sorted
}

// poolMemberItem is what pools shows of a member item.
type poolMemberItem struct {
	owner            string
	expires, renewed time.Time
	list             string
	declined         []string
	leaving          bool
	ended            string
	malformed        bool
}

func (m poolMemberItem) state(now time.Time, skew time.Duration) string {
	switch {
	case m.malformed:
		return "malformed"
	case m.ended != "" && m.ended != "-":
		return "ended by " + m.ended
	case m.leaving:
		return "leaving"
	case m.expires.Before(now.Add(-skew)):
		return "expired"
	}
	return "live"
}

// The keys and attributes of the items pools reads (docs/deploy.md, "The
// items"; docs/pool.md).
const (
	pkDirectory  = "directory"
	skPoolPrefix = "pool#"
	skMember     = "member#"
)

// keys returns the table's key attributes as the replicas' Layout names
// them.
func (e *env) keys() (pk, sk string, err error) {
	spec, err := e.g.layout.TableSpec()
	if err != nil {
		return "", "", usagef("%v", err)
	}
	return spec.PartitionKey, spec.SortKey, nil
}

// queryPrefix returns the items of partition pk whose sort key starts
// with prefix: one strongly consistent Query (and one per further page).
func (e *env) queryPrefix(ctx context.Context, pk, prefix string) ([]map[string]types.AttributeValue, error) {
	pkName, skName, err := e.keys()
	if err != nil {
		return nil, err
	}
	pages := dynamodb.NewQueryPaginator(e.db, &dynamodb.QueryInput{
		TableName:                 aws.String(e.g.table),
		ConsistentRead:            aws.Bool(true),
		KeyConditionExpression:    aws.String("#pk = :pk AND begins_with(#sk, :sk)"),
		ExpressionAttributeNames:  map[string]string{"#pk": pkName, "#sk": skName},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: pk}, ":sk": &types.AttributeValueMemberS{Value: prefix}},
	})
	var items []map[string]types.AttributeValue
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("read %s in table %q: %w", pk, e.g.table, err)
		}
		items = append(items, page.Items...)
	}
	return items, nil
}

// poolEntries reads the pools' entries in the directory, by name.
func (e *env) poolEntries(ctx context.Context) ([]poolEntry, error) {
	_, skName, err := e.keys()
	if err != nil {
		return nil, err
	}
	items, err := e.queryPrefix(ctx, e.g.layout.Prefix+pkDirectory, skPoolPrefix)
	if err != nil {
		return nil, err
	}
	out := make([]poolEntry, 0, len(items))
	for _, item := range items {
		sk, ok := item[skName].(*types.AttributeValueMemberS)
		if !ok {
			continue
		}
		p := poolEntry{name: strings.TrimPrefix(sk.Value, skPoolPrefix), jobs: []string{}}
		if jobs, ok := item["jobs"].(*types.AttributeValueMemberSS); ok {
			p.jobs = slices.Sorted(slices.Values(jobs.Value))
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b poolEntry) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// poolMembers reads the member items of pool, by owner. Items it cannot
// read are shown as malformed and reported in errs.
func (e *env) poolMembers(ctx context.Context, pool string) ([]poolMemberItem, []error, error) {
	_, skName, err := e.keys()
	if err != nil {
		return nil, nil, err
	}
	items, err := e.queryPrefix(ctx, e.g.layout.Prefix+skPoolPrefix+pool, skMember)
	if err != nil {
		return nil, nil, err
	}
	var out []poolMemberItem
	var errs []error
	for _, item := range items {
		sk, ok := item[skName].(*types.AttributeValueMemberS)
		if !ok {
			continue
		}
		m := poolMemberItem{owner: strings.TrimPrefix(sk.Value, skMember)}
		var bad []string
		if ms, ok := number(item, "exp"); ok {
			m.expires = time.UnixMilli(ms)
		} else {
			bad = append(bad, "exp")
		}
		if _, found := item["renewedAt"]; found {
			if ms, ok := number(item, "renewedAt"); ok {
				m.renewed = time.UnixMilli(ms)
			} else {
				bad = append(bad, "renewedAt")
			}
		}
		if s, ok := item["list"].(*types.AttributeValueMemberS); ok {
			m.list = s.Value
		}
		if s, ok := item["declined"].(*types.AttributeValueMemberS); ok {
			if err := json.Unmarshal([]byte(s.Value), &m.declined); err != nil {
				bad = append(bad, "declined")
			}
			slices.Sort(m.declined)
		}
		if b, ok := item["leaving"].(*types.AttributeValueMemberBOOL); ok {
			m.leaving = b.Value
		}
		if s, ok := item["ended"].(*types.AttributeValueMemberS); ok {
			m.ended = s.Value
		}
		if len(bad) > 0 {
			m.malformed = true
			errs = append(errs, fmt.Errorf("%w: member item %s/%s: attribute %s unreadable", ddblease.ErrMalformedItem,
				e.g.layout.Prefix+skPoolPrefix+pool, sk.Value, strings.Join(bad, ", ")))
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b poolMemberItem) int { return strings.Compare(a.owner, b.owner) })
	return out, errs, nil
}

// number reads a number attribute as an int64.
func number(item map[string]types.AttributeValue, name string) (int64, bool) {
	n, ok := item[name].(*types.AttributeValueMemberN)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	return v, err == nil
}

// poolKey is the context key of status's --pool.
type poolKey struct{}

// withPool returns ctx carrying status's --pool (none when "").
func withPool(ctx context.Context, pool string) context.Context {
	return context.WithValue(ctx, poolKey{}, pool)
}

// statusJobs reads the jobs status shows: those e.jobs reads for names,
// or, with --pool P (in ctx, withPool), every job of pool P: the jobs its
// directory entry lists and those bound to one of its sessions, read by
// one GetItem of the pool's entry and Admin.Jobs. An unknown pool is an
// error naming it.
func (e *env) statusJobs(ctx context.Context, names []string) (jobs []ddblease.JobStatus, errs []error, err error) {
	pool, _ := ctx.Value(poolKey{}).(string)
	if pool == "" {
		return e.jobs(ctx, names)
	}
	if len(names) > 0 {
		return nil, nil, usagef("status: give JOBs or --pool, not both")
	}
	pkName, skName, err := e.keys()
	if err != nil {
		return nil, nil, err
	}
	// The Admin checks the table's key schema first, with its clear error.
	all, errs, err := e.jobs(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	out, err := e.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(e.g.table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{
			pkName: &types.AttributeValueMemberS{Value: e.g.layout.Prefix + pkDirectory},
			skName: &types.AttributeValueMemberS{Value: skPoolPrefix + pool},
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read the entry of pool %q: %w", pool, err)
	}
	if len(out.Item) == 0 {
		return nil, nil, fmt.Errorf("unknown pool %q in table %q (ddblease pools lists the pools)", pool, e.g.table)
	}
	inPool := map[string]bool{}
	if ss, ok := out.Item["jobs"].(*types.AttributeValueMemberSS); ok {
		for _, j := range ss.Value {
			inPool[j] = true
		}
	}
	for _, j := range all {
		if inPool[j.Job] || j.Lease.Pool == pool {
			jobs = append(jobs, j)
		}
	}
	return jobs, errs, nil
}
