package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leadCounts returns how many of jobs each pool leads.
func leadCounts(pools []*ddblease.Pool, jobs []string) []int {
	n := make([]int, len(pools))
	for i, p := range pools {
		for _, j := range jobs {
			if l := p.Lease(j); l != nil && l.IsLeader() {
				n[i]++
			}
		}
	}
	return n
}

// pools shows the members of a running pool of two replicas, how many
// jobs each leads, how long ago each renewed and its job list's hash; a
// member running another job list is marked; --json gives durations as
// numbers of seconds; the reads are Queries on keys and BatchGetItems,
// never a Scan.
func TestPools(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	env := baseEnv()
	jobs := []string{"tenant-1", "tenant-2", "tenant-3", "tenant-4"}
	pools := []*ddblease.Pool{
		startPool(t, table, "tenants", jobs, "replica-a"),
		startPool(t, table, "tenants", jobs, "replica-b"),
	}
	waitFor(t, "each replica leads two jobs", func() bool {
		n := leadCounts(pools, jobs)
		return n[0] == 2 && n[1] == 2
	})
	// A second pool during a deploy: the replica that started last lists
	// a job more than the other.
	old := startPool(t, table, "reports", []string{"r-1"}, "replica-old")
	waitFor(t, "the old replica leads r-1", old.Lease("r-1").IsLeader)
	startPool(t, table, "reports", []string{"r-1", "r-2"}, "replica-new")
	waitFor(t, "the reports pool has two members", func() bool { return len(old.Members()) == 2 })

	out := ok(t, cli(t, env, "--table", table, "pools"))
	t.Logf("pools:\n%s", out)
	header := lineWith(t, out, "POOL")
	for _, col := range []string{"MEMBER", "STATE", "RENEWED", "EXPIRES IN", "LEADS", "DECLINED", "JOB LIST"} {
		assert.Contains(t, header, col)
	}
	for _, owner := range []string{"replica-a", "replica-b"} {
		f := strings.Fields(lineWith(t, out, owner))
		require.GreaterOrEqual(t, len(f), 9, "row of %s: %q", owner, f)
		assert.Equal(t, []string{"tenants", "4", owner, "live"}, f[:4], "pool, its jobs, the member, its state")
		assert.Equal(t, "ago", f[5], "renewal age")
		assert.Equal(t, "2", f[7], "jobs it leads")
		assert.Equal(t, "-", f[8], "declines none")
		assert.Len(t, f, 10, "a hash, and no note that the list differs: %q", f)
	}
	assert.Equal(t, strings.Fields(lineWith(t, out, "replica-a"))[9], strings.Fields(lineWith(t, out, "replica-b"))[9], "the same job list")
	assert.Contains(t, lineWith(t, out, "replica-old"), "(not the pool's ", "the old list differs from the one the pool lists")
	assert.NotContains(t, lineWith(t, out, "replica-new"), "not the pool's")

	var v []struct {
		Pool        string   `json:"pool"`
		Jobs        []string `json:"jobs"`
		JobListHash string   `json:"jobListHash"`
		Unled       []string `json:"unled"`
		Members     []struct {
			Owner             string   `json:"owner"`
			State             string   `json:"state"`
			RenewalAgeSeconds *float64 `json:"renewalAgeSeconds"`
			ExpiresInSeconds  *float64 `json:"expiresInSeconds"`
			Leads             []string `json:"leads"`
			LeadsCount        int      `json:"leadsCount"`
			Declined          []string `json:"declined"`
			JobListHash       string   `json:"jobListHash"`
			SameJobList       bool     `json:"sameJobList"`
		} `json:"members"`
	}
	jout := ok(t, cli(t, env, "--table", table, "pools", "--json"))
	require.NoError(t, json.Unmarshal([]byte(jout), &v), jout)
	require.Len(t, v, 2)
	assert.Equal(t, "reports", v[0].Pool, "by name")
	assert.Equal(t, []string{"r-1", "r-2"}, v[0].Jobs, "the list of the replica that started last")
	p := v[1]
	assert.Equal(t, "tenants", p.Pool)
	assert.Equal(t, jobs, p.Jobs)
	assert.Empty(t, p.Unled)
	require.Len(t, p.Members, 2)
	var led []string
	for i, m := range p.Members {
		assert.Equal(t, []string{"replica-a", "replica-b"}[i], m.Owner)
		assert.Equal(t, "live", m.State)
		require.NotNil(t, m.RenewalAgeSeconds, "renewalAgeSeconds")
		assert.GreaterOrEqual(t, *m.RenewalAgeSeconds, -0.5)
		assert.Less(t, *m.RenewalAgeSeconds, 3.0, "renewed every 500ms")
		require.NotNil(t, m.ExpiresInSeconds)
		assert.Greater(t, *m.ExpiresInSeconds, 0.0)
		assert.Equal(t, 2, m.LeadsCount)
		assert.Len(t, m.Leads, 2)
		assert.Empty(t, m.Declined)
		assert.Equal(t, p.JobListHash, m.JobListHash)
		assert.True(t, m.SameJobList)
		led = append(led, m.Leads...)
	}
	assert.ElementsMatch(t, jobs, led, "each job led by one member")
	for _, j := range jobs {
		owner := "replica-a"
		if pools[1].Lease(j).IsLeader() {
			owner = "replica-b"
		}
		m := p.Members[0]
		if owner == "replica-b" {
			m = p.Members[1]
		}
		assert.Contains(t, m.Leads, j, "%s is led by %s", j, owner)
	}
	r := v[0]
	require.Len(t, r.Members, 2)
	assert.Equal(t, "replica-new", r.Members[0].Owner)
	assert.True(t, r.Members[0].SameJobList)
	assert.Equal(t, "replica-old", r.Members[1].Owner)
	assert.False(t, r.Members[1].SameJobList)
	assert.NotEqual(t, r.Members[0].JobListHash, r.Members[1].JobListHash)
	// The raw JSON has the durations as numbers.
	assert.Regexp(t, `"renewalAgeSeconds": -?[0-9.e-]+,`, jout)

	// The reads: by key, and one Query per pool besides the listings.
	relay := newItemRelay(t)
	ok(t, cliAt(t, env, relay.url, "--table", table, "pools"))
	reqs, items := relay.take()
	t.Logf("pools, 2 pools of 4 members and 6 jobs: requests %v, items %d", reqs, items)
	assert.Zero(t, reqs["Scan"])
	assert.Equal(t, 2+2, reqs["Query"], "the directory's jobs, its pools, and each pool's members")
	assert.LessOrEqual(t, reqs["BatchGetItem"], 2, "the lease items, and the sessions they are bound to")
	assert.Zero(t, reqs["GetItem"])
}

// status --pool P shows the jobs of pool P only; an unknown pool is an
// error naming it; JOBs and --pool together are bad usage.
func TestStatusPool(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	env := baseEnv()
	tenants := startPool(t, table, "tenants", []string{"tenant-1", "tenant-2"}, "replica-a")
	reports := startPool(t, table, "reports", []string{"report-1"}, "replica-a")
	single := startReplica(t, table, "billing", "replica-a", func(context.Context, *ddblease.JobRun) error { return nil })
	waitFor(t, "every job led", func() bool {
		return tenants.Lease("tenant-1").IsLeader() && tenants.Lease("tenant-2").IsLeader() &&
			reports.Lease("report-1").IsLeader() && single.l.IsLeader()
	})
	require.Len(t, statusJSON(t, env, table), 4, "status: every job")

	out := ok(t, cli(t, env, "--table", table, "status", "--json", "--pool", "tenants"))
	var v []jobView
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	var names []string
	for _, j := range v {
		names = append(names, j.Job)
		assert.Equal(t, "held", j.State)
		assert.Equal(t, "replica-a", j.Holder)
	}
	assert.Equal(t, []string{"tenant-1", "tenant-2"}, names)

	out = ok(t, cli(t, env, "--table", table, "status", "--pool", "reports"))
	assert.Contains(t, out, "report-1")
	assert.NotContains(t, out, "tenant-")
	assert.NotContains(t, out, "billing")

	fails(t, cli(t, env, "--table", table, "status", "--pool", "nosuchpool"), 1, `unknown pool "nosuchpool"`)
	fails(t, cli(t, env, "--table", table, "status", "--pool", "tenants", "tenant-1"), 2, "give JOBs or --pool, not both")
}
