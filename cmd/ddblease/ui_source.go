package main

import (
	"context"
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
}

// uiActions is what the page's actions call: one call each.
type uiActions interface {
	Pause(ctx context.Context, job string) (ddblease.Record, error)
	Resume(ctx context.Context, job string, catchUp bool) (ddblease.Record, error)
	Trigger(ctx context.Context, job string) (ddblease.Trigger, error)
	RequestResign(ctx context.Context, job string, fence int64) (ddblease.Record, error)
}

var _ uiActions = (*ddblease.Admin)(nil)

// adminSource reads through an Admin.
//
// Admin.Jobs and Admin.Runs scan the table today, so their cost grows
// with the table although their number does not; Admin has no listing
// of pools yet, so Pools returns none.
type adminSource struct{ a *ddblease.Admin }

func (s adminSource) Jobs(ctx context.Context) ([]ddblease.JobStatus, error) { return s.a.Jobs(ctx) }

func (s adminSource) Runs(ctx context.Context, job string, from, to time.Time, limit int) ([]ddblease.RunRecord, error) {
	runs, err := s.a.Runs(ctx, job, from)
	n := len(runs)
	for n > 0 && runs[n-1].Slot.After(to) {
		n--
	}
	return runs[max(0, n-limit):n], err
}

func (s adminSource) Pools(context.Context, []ddblease.JobStatus) ([]uiPool, error) { return nil, nil }
