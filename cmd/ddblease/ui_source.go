package main

import (
	"context"
	"slices"
	"time"

	"github.com/ddblease/ddblease"
)

// uiSource is what the page and /metrics read from the table: the jobs,
// one job's runs in a range, and the pools. Each call is a few requests,
// whatever the table's history.
type uiSource interface {
	// Jobs returns every job's lease item, by name. An error wrapping
	// ddblease.ErrMalformedItem comes with the jobs that could be read.
	Jobs(ctx context.Context) ([]ddblease.JobStatus, error)
	// Runs returns the runs of job whose slot is in [from, to], in slot
	// order: the newest limit of them when there are more.
	Runs(ctx context.Context, job string, from, to time.Time, limit int) ([]ddblease.RunRecord, error)
	// Pools returns the pools, each with its members and the jobs (among
	// jobs, as Jobs returned them) that each member holds.
	Pools(ctx context.Context, jobs []ddblease.JobStatus) ([]uiPool, error)
}

// uiPool is a pool as the page shows it.
type uiPool struct {
	Name    string
	Members []uiMember
	Unheld  []string // the pool's jobs that no member holds
}

// uiMember is a member of a pool and the jobs it holds.
type uiMember struct {
	Owner     string
	ExpiresAt time.Time
	Jobs      []string
	Declined  []string // after an operator's resign request
}

// uiActions is what the page's actions call: one call each.
type uiActions interface {
	Pause(ctx context.Context, job string) (ddblease.Record, error)
	Resume(ctx context.Context, job string, catchUp bool) (ddblease.Record, error)
	Trigger(ctx context.Context, job string) (ddblease.Trigger, error)
	RequestResign(ctx context.Context, job string, fence int64) (ddblease.Record, error)
}

var _ uiActions = (*ddblease.Admin)(nil)

// adminSource reads through an Admin: the jobs by the directory and a
// BatchGetItem of their lease items, a job's runs by one Query on its
// partition, the pools by one Query of the directory and one of each
// pool's members.
type adminSource struct{ a *ddblease.Admin }

func (s adminSource) Jobs(ctx context.Context) ([]ddblease.JobStatus, error) { return s.a.Jobs(ctx) }

func (s adminSource) Runs(ctx context.Context, job string, from, to time.Time, limit int) ([]ddblease.RunRecord, error) {
	runs, err := s.a.Runs(ctx, job, ddblease.RunRange{From: from, To: to, Limit: limit, Newest: true})
	slices.Reverse(runs)
	return runs, err
}

// Pools lists the pools with the jobs each member holds, from the jobs
// already read: a job is held by the member its lease item names, while
// its lease is not free.
func (s adminSource) Pools(ctx context.Context, jobs []ddblease.JobStatus) ([]uiPool, error) {
	pools, err := s.a.Pools(ctx)
	holder := map[string]string{}
	now := time.Now()
	for _, j := range jobs {
		if !j.Free(now, 0) {
			holder[j.Job] = j.Lease.Owner
		}
	}
	out := make([]uiPool, 0, len(pools))
	for _, p := range pools {
		up, held := uiPool{Name: p.Name}, map[string]bool{}
		for _, m := range p.Members {
			um := uiMember{Owner: m.Owner, ExpiresAt: m.ExpiresAt, Declined: m.Declined}
			for _, job := range p.Jobs {
				if holder[job] == m.Owner {
					um.Jobs = append(um.Jobs, job)
					held[job] = true
				}
			}
			up.Members = append(up.Members, um)
		}
		for _, job := range p.Jobs {
			if !held[job] {
				up.Unheld = append(up.Unheld, job)
			}
		}
		out = append(out, up)
	}
	return out, err
}
