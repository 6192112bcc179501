package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

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
	pools, err := e.admin.Pools(ctx)
	if errors.Is(err, ddblease.ErrMalformedItem) {
		errs = append(errs, err) // shown as malformed, reported
	} else if err != nil {
		return err
	}
	now := e.now()
	views := make([]poolListing, 0, len(pools))
	for _, p := range pools {
		views = append(views, e.viewPool(p, jobs, now))
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
func (e *env) viewPool(p ddblease.PoolStatus, jobs []ddblease.JobStatus, now time.Time) poolListing {
	v := poolListing{Pool: p.Name, Jobs: orEmpty(p.Jobs), JobListHash: p.JobListHash, Members: []memberListing{}, Unled: []string{}}
	inPool := map[string]bool{}
	for _, j := range p.Jobs {
		inPool[j] = true
	}
	holder := map[string]string{}
	for _, j := range jobs {
		if (inPool[j.Job] || j.Lease.Pool == p.Name) && !j.Free(now, e.g.skew) {
			holder[j.Job] = j.Lease.Owner
		}
	}
	led := map[string]bool{}
	for _, m := range p.Members {
		mv := memberListing{Owner: m.Owner, State: memberState(m, now, e.g.skew), Declined: orEmpty(m.Declined), Leads: []string{},
			JobListHash: m.JobListHash, SameJobList: m.JobListHash == p.JobListHash}
		if !m.RenewedAt.IsZero() {
			age := now.Sub(m.RenewedAt).Seconds()
			mv.RenewedAt, mv.RenewalAgeSeconds = tp(m.RenewedAt), &age
		}
		if !m.ExpiresAt.IsZero() {
			in := m.ExpiresAt.Sub(now).Seconds()
			mv.ExpiresAt, mv.ExpiresInSeconds = tp(m.ExpiresAt), &in
		}
		for _, j := range slices.Sorted(maps.Keys(holder)) {
			if holder[j] == m.Owner {
				mv.Leads, led[j] = append(mv.Leads, j), true
			}
		}
		mv.LeadsCount = len(mv.Leads)
		v.Members = append(v.Members, mv)
	}
	for _, j := range p.Jobs {
		if !led[j] {
			v.Unled = append(v.Unled, j)
		}
	}
	return v
}

// orEmpty is s, or an empty list for none (JSON [] rather than null).
func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// memberState is a member's state as pools shows it.
func memberState(m ddblease.PoolMember, now time.Time, skew time.Duration) string {
	switch {
	case m.ExpiresAt.IsZero():
		return "malformed"
	case m.EndedBy != "":
		return "ended by " + m.EndedBy
	case m.Leaving:
		return "leaving"
	case m.ExpiresAt.Before(now.Add(-skew)):
		return "expired"
	}
	return "live"
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

// poolKey is the context key of status's --pool.
type poolKey struct{}

// withPool returns ctx carrying status's --pool (none when "").
func withPool(ctx context.Context, pool string) context.Context {
	return context.WithValue(ctx, poolKey{}, pool)
}

// statusJobs reads the jobs status shows: those e.jobs reads for names,
// or, with --pool P (in ctx, withPool), every job of pool P: the jobs its
// directory entry lists and those bound to one of its sessions, read by
// Admin.Pool and Admin.Jobs. An unknown pool is an error naming it.
func (e *env) statusJobs(ctx context.Context, names []string) (jobs []ddblease.JobStatus, errs []error, err error) {
	pool, _ := ctx.Value(poolKey{}).(string)
	if pool == "" {
		return e.jobs(ctx, names)
	}
	if len(names) > 0 {
		return nil, nil, usagef("status: give JOBs or --pool, not both")
	}
	p, ok, err := e.admin.Pool(ctx, pool)
	if err != nil && !errors.Is(err, ddblease.ErrMalformedItem) { // its members are not shown here
		return nil, nil, err
	}
	if !ok {
		return nil, nil, fmt.Errorf("unknown pool %q in table %q (ddblease pools lists the pools)", pool, e.g.table)
	}
	all, errs, err := e.jobs(ctx, nil)
	if err != nil {
		return nil, nil, err
	}
	inPool := map[string]bool{}
	for _, j := range p.Jobs {
		inPool[j] = true
	}
	for _, j := range all {
		if inPool[j.Job] || j.Lease.Pool == pool {
			jobs = append(jobs, j)
		}
	}
	return jobs, errs, nil
}
