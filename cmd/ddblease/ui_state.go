package main

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/ddblease/ddblease"
)

// uiState is one reading of the table, as the page and /metrics show it.
type uiState struct {
	Table     string    `json:"table"`
	Now       time.Time `json:"now"`
	From      time.Time `json:"from"`
	To        time.Time `json:"to"`
	RefreshMs int64     `json:"refreshMs"`
	Actions   bool      `json:"actions"`
	Limit     int       `json:"limit"`
	Errors    []string  `json:"errors,omitempty"`
	// Stale is set when the table could not be read: the state is the
	// latest reading that could, of Now.
	Stale *uiStale     `json:"stale,omitempty"`
	Jobs  []uiJob      `json:"jobs"`
	Pools []uiPoolView `json:"pools"`
	// failed is why the jobs could not be listed, if they could not.
	failed error
}

// uiStale says why a state is not current: the error of the reading that
// failed, and when it was made.
type uiStale struct {
	Error string    `json:"error"`
	At    time.Time `json:"at"`
}

// uiJob is a job: its lease as status shows it, and its runs in the range.
type uiJob struct {
	jobView
	RenewedAt *time.Time `json:"renewedAt,omitempty"`
	Released  bool       `json:"released"`
	Runs      []runView  `json:"runs"`
	// Truncated reports that the range holds more runs than the limit:
	// the older ones were not read.
	Truncated bool         `json:"truncated"`
	Handovers []uiHandover `json:"handovers"`
	// LastSlot is the newest run of a schedule slot; PeriodMs the shortest
	// gap between the latest slots, and NextSlot the slot it makes next:
	// the table does not hold the schedule, so both are estimates.
	LastSlot    *runView   `json:"lastSlot,omitempty"`
	PeriodMs    int64      `json:"periodMs,omitempty"`
	NextSlot    *time.Time `json:"nextSlot,omitempty"`
	LastFailure *runView   `json:"lastFailure,omitempty"`
	// LastEnded is the run that finished last (succeeded, failed or
	// abandoned).
	LastEnded *runView       `json:"lastEnded,omitempty"`
	ByStatus  map[string]int `json:"runsByStatus"`
	Error     string         `json:"error,omitempty"` // reading the runs failed
	hasLeader bool
	renewed   time.Time
}

// uiHandover is a change of fence: a new tenure. Exact when the time is
// the lease's acquisition; otherwise the start of the first run the new
// fence claimed.
type uiHandover struct {
	At    time.Time `json:"at"`
	Fence int64     `json:"fence"`
	From  int64     `json:"fromFence"`
	Owner string    `json:"owner"`
	Exact bool      `json:"exact"`
}

// read reads the jobs, their runs in [from, to] and the pools: one
// request for the jobs, one per job for its runs, one for the pools.
func (s *uiServer) read(ctx context.Context, from, to time.Time) uiState {
	st := uiState{Table: s.e.g.table, Now: s.e.now().UTC(), From: from.UTC(), To: to.UTC(),
		RefreshMs: s.o.refresh.Milliseconds(), Actions: s.token != "", Limit: s.o.maxRuns, Jobs: []uiJob{}, Pools: []uiPoolView{}}
	jobs, err := s.src.Jobs(ctx)
	if err != nil {
		st.Errors = append(st.Errors, oneLine(explain(err).Error()))
		if !errors.Is(err, ddblease.ErrMalformedItem) {
			st.failed = err // no job could be listed
		}
	}
	st.Jobs = make([]uiJob, len(jobs))
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			runs, err := s.src.Runs(ctx, j.Job, from, to, s.o.maxRuns)
			st.Jobs[i] = s.job(j, runs, err)
		})
	}
	wg.Wait()
	if len(jobs) > 0 {
		pools, err := s.src.Pools(ctx, jobs)
		if err != nil {
			st.Errors = append(st.Errors, oneLine(explain(err).Error()))
		}
		for _, p := range pools {
			st.Pools = append(st.Pools, poolView(p, st.Now, s.e.g.skew))
		}
	}
	return st
}

// job makes the view of one job from its lease and its runs.
func (s *uiServer) job(js ddblease.JobStatus, runs []ddblease.RunRecord, err error) uiJob {
	v := s.e.view(js)
	j := uiJob{jobView: v, RenewedAt: tp(js.Lease.RenewedAt), Released: js.Released(), Runs: []runView{},
		ByStatus: map[string]int{}, hasLeader: v.State == "held" || v.State == "draining", renewed: js.Lease.RenewedAt}
	if err != nil {
		j.Error = oneLine(explain(err).Error())
	}
	j.Truncated = len(runs) >= s.o.maxRuns
	for _, st := range statuses {
		j.ByStatus[string(st)] = 0
	}
	var slots []time.Time
	for _, r := range runs {
		j.Runs = append(j.Runs, viewRun(r))
		if r.Trigger == "" {
			slots = append(slots, r.Slot)
		}
	}
	for i := range j.Runs {
		r := &j.Runs[i]
		j.ByStatus[r.Status]++
		if r.Trigger == "" {
			j.LastSlot = r
		}
		if r.Status == string(ddblease.RunFailed) && (j.LastFailure == nil || r.FinishedAt.After(*j.LastFailure.FinishedAt)) {
			j.LastFailure = r
		}
		if finished(r) && (j.LastEnded == nil || r.FinishedAt.After(*j.LastEnded.FinishedAt)) {
			j.LastEnded = r
		}
	}
	if p := period(slots); p > 0 {
		j.PeriodMs = p.Milliseconds()
		j.NextSlot = tp(slots[len(slots)-1].Add(p))
	}
	j.Handovers = handovers(js, runs)
	return j
}

// finished reports a run that finished: succeeded, failed or abandoned.
func finished(r *runView) bool {
	switch ddblease.RunStatus(r.Status) {
	case ddblease.RunSucceeded, ddblease.RunFailed, ddblease.RunAbandoned:
		return r.FinishedAt != nil
	}
	return false
}

// period estimates a schedule's period from its latest slots, in order:
// the shortest gap among the last ten (slots missed while no one led
// make some gaps longer, never shorter). Zero with fewer than two.
func period(slots []time.Time) time.Duration {
	var p time.Duration
	for i := max(1, len(slots)-10); i < len(slots); i++ {
		if g := slots[i].Sub(slots[i-1]); g > 0 && (p == 0 || g < p) {
			p = g
		}
	}
	return p
}

// handovers lists the starts of tenures that the runs and the lease show:
// each fence change among the runs, at the start of the first run of the
// new fence, and the current tenure's acquisition, at its exact time
// (From is zero when the fence before it is not known).
func handovers(js ddblease.JobStatus, runs []ddblease.RunRecord) []uiHandover {
	byStart := slices.SortedFunc(slices.Values(runs), func(a, b ddblease.RunRecord) int {
		return cmp.Or(a.StartedAt.Compare(b.StartedAt), cmp.Compare(a.Fence, b.Fence))
	})
	out := []uiHandover{}
	var seen int64
	for _, r := range byStart {
		if seen != 0 && r.Fence > seen {
			out = append(out, uiHandover{At: r.StartedAt.UTC(), Fence: r.Fence, From: seen, Owner: r.Owner})
		}
		seen = max(seen, r.Fence)
	}
	lease := js.Lease
	if lease.AcquiredAt.IsZero() || lease.Fence < seen || js.Released() {
		return out // a forced release raised the fence without an acquisition
	}
	cur := uiHandover{At: lease.AcquiredAt.UTC(), Fence: lease.Fence, Owner: lease.Owner, Exact: true}
	if i := slices.IndexFunc(out, func(h uiHandover) bool { return h.Fence == lease.Fence }); i >= 0 {
		cur.From = out[i].From
		out[i] = cur
		return out
	}
	if seen < lease.Fence {
		cur.From = seen
	}
	return append(out, cur)
}

// uiPoolView is a pool with its balance: a balanced pool gives each live
// member Low or High jobs (ddblease.Assign's shares).
type uiPoolView struct {
	Name    string         `json:"name"`
	Members []uiMemberView `json:"members"`
	Unheld  []string       `json:"unheld"`
	Jobs    int            `json:"jobs"`
	Low     int            `json:"low"`
	High    int            `json:"high"`
	// OffBy is how many jobs must move to another member, or be taken
	// (when no one holds them), for each live member to hold Low to High.
	OffBy int `json:"offBy"`
}

// uiMemberView is a pool member; Live when its expiry, allowing the
// replicas' MaxClockSkew, has not passed.
type uiMemberView struct {
	Owner     string     `json:"owner"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	Live      bool       `json:"live"`
	Jobs      []string   `json:"jobs"`
	Declined  []string   `json:"declined"`
}

func poolView(p uiPool, now time.Time, skew time.Duration) uiPoolView {
	v := uiPoolView{Name: p.Name, Unheld: append([]string{}, p.Unheld...), Jobs: len(p.Unheld), Members: []uiMemberView{}}
	live := 0
	for _, m := range p.Members {
		mv := uiMemberView{Owner: m.Owner, ExpiresAt: tp(m.ExpiresAt), Live: !m.ExpiresAt.Before(now.Add(-skew)),
			Jobs: append([]string{}, m.Jobs...), Declined: append([]string{}, m.Declined...)}
		v.Members = append(v.Members, mv)
		v.Jobs += len(m.Jobs)
		if mv.Live {
			live++
		}
	}
	if live == 0 {
		return v
	}
	v.Low = v.Jobs / live
	v.High = v.Low
	if v.Jobs%live != 0 {
		v.High++
	}
	over, under := 0, 0
	for _, m := range v.Members {
		h := len(m.Jobs)
		if !m.Live {
			over += h // a dead member's jobs must all move
			continue
		}
		over += max(0, h-v.High)
		under += max(0, v.Low-h)
	}
	v.OffBy = max(over, under)
	return v
}
