package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
)

func commands() map[string]*command {
	var (
		since    time.Duration
		status   string
		print    bool
		yes      bool
		dead     bool
		catchUp  bool
		wait     bool
		interval time.Duration
		pool     string
		waitMax  time.Duration
	)
	var last int                // runs --last
	var runsFlags *flag.FlagSet // runs' flags, to tell which were given
	create := &command{
		name: "create-table",
		flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&print, "print", false, "print CloudFormation and Terraform definitions instead")
		},
		run: func(e *env, ctx context.Context, args []string) error { return e.createTable(ctx, args, print) },
	}
	create.needsAPI = func() bool { return !print }
	return map[string]*command{
		"status": {
			name: "status", args: "[JOB... | --pool P]",
			flags: func(fs *flag.FlagSet) {
				fs.StringVar(&pool, "pool", "", "show only the jobs of pool `P` (those its directory entry lists, and any bound to its sessions)")
			},
			run: func(e *env, ctx context.Context, args []string) error { return e.status(withPool(ctx, pool), args) },
		},
		"pools": {name: "pools", about: poolsAbout, run: (*env).pools},
		"runs": {
			name: "runs", args: "JOB [--since D] [--last N] [--status S]", about: runsAbout,
			flags: func(fs *flag.FlagSet) {
				fs.DurationVar(&since, "since", 24*time.Hour, "show runs whose slot is at most this old (0: all; with --last, all unless given)")
				fs.IntVar(&last, "last", 0, "show the `N` latest runs (of --status, within --since if given)")
				fs.StringVar(&status, "status", "", "show only runs with this status (running, succeeded, failed, abandoned, skipped-by-pause)")
				runsFlags = fs
			},
			run: func(e *env, ctx context.Context, args []string) error {
				set := givenFlags(runsFlags)
				return e.runs(ctx, args, runsQuery{since: since, sinceSet: set["since"], last: last, lastSet: set["last"], status: status})
			},
		},
		"create-table": create,
		"resign":       {name: "resign", args: "JOB", run: (*env).resign},
		"force-release": {
			name: "force-release", args: "JOB --yes [--dead]", about: forceReleaseAbout,
			flags: func(fs *flag.FlagSet) {
				fs.BoolVar(&yes, "yes", false, "do it (without it, say what would be done)")
				fs.BoolVar(&dead, "dead", false, "the holder is dead: let a standby lead at once, without waiting for the holder's expiry")
			},
			run: func(e *env, ctx context.Context, args []string) error { return e.forceRelease(ctx, args, yes, dead) },
		},
		"pause": {name: "pause", args: "JOB", run: (*env).pause},
		"resume": {
			name: "resume", args: "JOB [--catch-up]",
			flags: func(fs *flag.FlagSet) {
				fs.BoolVar(&catchUp, "catch-up", false, "run the latest slot skipped by the pause")
			},
			run: func(e *env, ctx context.Context, args []string) error { return e.resume(ctx, args, catchUp) },
		},
		"trigger": {
			name: "trigger", args: "JOB [--wait [--wait-timeout D]]", about: triggerAbout,
			flags: func(fs *flag.FlagSet) {
				fs.BoolVar(&wait, "wait", false, "wait for the run to finish and show how it ended (exit 1 if it failed)")
				fs.DurationVar(&waitMax, "wait-timeout", 5*time.Minute, "with --wait, give up after this long, with exit status 3 (0: wait for ever)")
			},
			run:  func(e *env, ctx context.Context, args []string) error { return e.trigger(ctx, args, wait, waitMax) },
			long: true,
		},
		"exec":    execCommand(),
		"ui":      uiCommand(),
		"local":   localCommand(),
		"version": {name: "version", needsAPI: func() bool { return false }, run: (*env).version},
		"watch": {
			name: "watch", args: "JOB",
			flags: func(fs *flag.FlagSet) {
				fs.DurationVar(&interval, "interval", time.Second, "how often to read the table")
			},
			run:  func(e *env, ctx context.Context, args []string) error { return e.watch(ctx, args, interval) },
			long: true,
		},
	}
}

func oneJob(cmd string, args []string) (string, error) {
	if len(args) != 1 {
		return "", usagef("%s: want exactly one JOB, got %d arguments", cmd, len(args))
	}
	return args[0], nil
}

// jobView is a job's state as status prints it.
type jobView struct {
	Job        string     `json:"job"`
	State      string     `json:"state"` // held, draining, released, free, expired
	Holder     string     `json:"holder"`
	Fence      int64      `json:"fence"`
	AcquiredAt *time.Time `json:"acquiredAt,omitempty"`
	// HeldForSeconds is how long the holder has led, by this command's
	// clock; ExpiresInSeconds the recorded expiry minus this command's
	// clock, good to MaxClockSkewSeconds (the replicas' MaxClockSkew,
	// --max-clock-skew). Durations in JSON are numbers of seconds, the
	// unit in the name, as Prometheus and kubectl write them.
	HeldForSeconds      *float64   `json:"heldForSeconds,omitempty"`
	ExpiresAt           *time.Time `json:"expiresAt,omitempty"`
	ExpiresInSeconds    *float64   `json:"expiresInSeconds,omitempty"`
	MaxClockSkewSeconds float64    `json:"maxClockSkewSeconds"`
	Draining            bool       `json:"draining"`
	Paused              bool       `json:"paused"`
	PausedBy            string     `json:"pausedBy,omitempty"`
	PausedAt            *time.Time `json:"pausedAt,omitempty"`
	ResumedBy           string     `json:"resumedBy,omitempty"`
	ResumedAt           *time.Time `json:"resumedAt,omitempty"`
	CatchUp             bool       `json:"catchUpPending,omitempty"`
	ResignAsked         bool       `json:"resignRequested,omitempty"`
	ResignBy            string     `json:"resignRequestedBy,omitempty"`
	ReleasedBy          string     `json:"releasedBy,omitempty"`
	ReleasedAt          *time.Time `json:"releasedAt,omitempty"`
	Triggers            int        `json:"pendingTriggers,omitempty"`
	LastRun             *runView   `json:"lastRun,omitempty"`     // the run of the latest slot, any status
	LastFailure         *runView   `json:"lastFailure,omitempty"` // the latest failed run (Record.LastFailedRun)

	heldFor, expiresIn string // as the table shows them
}

func tp(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// seconds is d as JSON gives a duration: a number of seconds, to the
// millisecond.
func seconds(d time.Duration) *float64 {
	s := d.Round(time.Millisecond).Seconds()
	return &s
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= time.Minute:
		return d.Round(time.Second).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

func (e *env) view(s ddblease.JobStatus) jobView {
	now := e.now()
	r, c := s.Lease, s.Lease.Control
	v := jobView{
		Job: s.Job, Holder: r.Owner, Fence: r.Fence, Draining: r.Draining, MaxClockSkewSeconds: *seconds(e.g.skew),
		Paused: c.Paused, PausedBy: c.PausedBy, PausedAt: tp(c.PausedAt), ResumedBy: c.ResumedBy, ResumedAt: tp(c.ResumedAt),
		CatchUp: c.CatchUpPending, Triggers: c.Triggers, ExpiresAt: tp(r.ExpiresAt),
	}
	if s.Released() { // until a new holder leads
		v.ReleasedBy, v.ReleasedAt = c.ReleasedBy, tp(c.ReleasedAt)
	}
	switch {
	case r.ExpiresAt.IsZero():
		v.State = "free"
	case r.ExpiresAt.Before(now.Add(-e.g.skew)):
		v.State = "expired"
	case s.Released():
		// The released holder's expiry has not passed: no standby takes
		// the lease before it has, plus the replicas' MaxClockSkew.
		v.State = "released"
		v.expiresIn, v.ExpiresInSeconds = dur(r.ExpiresAt.Sub(now)), seconds(r.ExpiresAt.Sub(now))
	default:
		v.State = "held"
		if r.Draining {
			v.State = "draining"
		}
		if !r.AcquiredAt.IsZero() {
			v.AcquiredAt, v.heldFor, v.HeldForSeconds = tp(r.AcquiredAt), dur(now.Sub(r.AcquiredAt)), seconds(now.Sub(r.AcquiredAt))
		}
		v.expiresIn, v.ExpiresInSeconds = dur(r.ExpiresAt.Sub(now)), seconds(r.ExpiresAt.Sub(now))
		if c.ResignFence == r.Fence {
			v.ResignAsked, v.ResignBy = true, c.ResignBy
		}
	}
	return v
}

func (e *env) status(ctx context.Context, args []string) error {
	jobs, errs, err := e.statusJobs(ctx, args)
	if err != nil {
		return err
	}
	views := make([]jobView, 0, len(jobs))
	for _, s := range jobs {
		v := e.view(s)
		last, failed, err := lastRuns(ctx, e.admin, s)
		switch {
		case errors.Is(err, ddblease.ErrMalformedItem):
			errs = append(errs, err)
		case err != nil:
			return err
		}
		if last != nil {
			lv := viewRun(*last)
			v.LastRun = &lv
		}
		if failed != nil {
			fv := viewRun(*failed)
			v.LastFailure = &fv
		}
		views = append(views, v)
	}
	if len(views) == 0 && len(errs) > 0 {
		return errors.Join(errs...) // nothing to show
	}
	if err := e.printStatus(views, len(args) == 0); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// jobs reads the named jobs, or every job of the table. The jobs it could
// not read, unknown or malformed, are left out and reported in errs; err is
// an error that stops status.
func (e *env) jobs(ctx context.Context, names []string) (jobs []ddblease.JobStatus, errs []error, err error) {
	if len(names) == 0 {
		jobs, err = e.admin.Jobs(ctx)
		if errors.Is(err, ddblease.ErrMalformedItem) {
			return jobs, []error{err}, nil
		}
		return jobs, nil, err
	}
	for _, j := range names {
		s, err := e.admin.Job(ctx, j)
		switch {
		case errors.Is(err, ddblease.ErrUnknownJob), errors.Is(err, ddblease.ErrMalformedItem):
			errs = append(errs, err)
		case err != nil:
			return nil, nil, err
		default:
			jobs = append(jobs, s)
		}
	}
	return jobs, errs, nil
}

// lastRuns returns the run of the job's latest slot and its latest failed
// run (nil when there is none), whatever the job's history: one Query of
// one item (Newest, Limit 1), and, unless that run is the failure, one
// GetItem of the run the lease item names as the last failure
// (Record.LastFailedRun), however many runs came after it. It is the one
// place where status reads runs. A failure recorded by replicas of a
// version that did not name it in the lease item is shown only while it is
// the latest run (ddblease runs JOB --status failed lists them all); one
// re-run since, or deleted by its time to live, is not shown. Runs it
// could not decode are left out and reported in an error wrapping
// ErrMalformedItem.
func lastRuns(ctx context.Context, admin *ddblease.Admin, s ddblease.JobStatus) (last, failed *ddblease.RunRecord, err error) {
	runs, err := admin.Runs(ctx, s.Job, ddblease.RunRange{Newest: true, Limit: 1})
	if len(runs) > 0 {
		last = &runs[0]
		if last.Status == ddblease.RunFailed {
			return last, last, err
		}
	}
	if err != nil && !errors.Is(err, ddblease.ErrMalformedItem) || s.Lease.LastFailedRun == "" {
		return last, nil, err
	}
	rec, ok, ferr := admin.Run(ctx, s.Job, s.Lease.LastFailedRun)
	if ok && rec.Status == ddblease.RunFailed {
		failed = &rec
	}
	return last, failed, errors.Join(err, ferr)
}

// printStatus prints the views; all says that they are every job of the
// table.
func (e *env) printStatus(views []jobView, all bool) error {
	if e.g.json {
		return writeJSON(e.out, views)
	}
	tw := tabwriter.NewWriter(e.out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "JOB\tSTATE\tHOLDER\tFENCE\tHELD FOR\tEXPIRES IN (±%v)\tDRAINING\tPAUSED\tLAST RUN\tLAST FAILURE\tNOTES\n", e.g.skew)
	for _, v := range views {
		paused := "no"
		if v.Paused {
			paused = "yes, by " + v.PausedBy + " at " + v.PausedAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Job, v.State, v.Holder, v.Fence,
			dash(v.heldFor), dash(v.expiresIn), yesNo(v.Draining), paused, lastRun(v.LastRun, false),
			lastRun(v.LastFailure, true), dash(notes(v)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if all && len(views) == 0 {
		e.log.Info(fmt.Sprintf("no jobs in table %q", e.g.table))
	}
	return nil
}

// lastRun is a run as a status column shows it: its status and slot, and,
// for a failure, the start of its error.
func lastRun(r *runView, withError bool) string {
	if r == nil {
		return "-"
	}
	s := r.Status + " " + r.Slot.Format(time.RFC3339)
	if withError && r.Error != "" {
		const max = 60
		msg := []rune(oneLine(r.Error))
		if len(msg) > max {
			msg = append(msg[:max-1], '…')
		}
		s += ": " + string(msg)
	}
	return s
}

func notes(v jobView) string {
	var n []string
	if v.ResignAsked {
		n = append(n, "resign requested by "+v.ResignBy)
	}
	if v.ReleasedBy != "" {
		n = append(n, "force-released by "+v.ReleasedBy+" at "+v.ReleasedAt.Format(time.RFC3339))
	}
	if v.CatchUp {
		n = append(n, "catch-up pending")
	}
	if v.Triggers > 0 {
		n = append(n, fmt.Sprintf("%d trigger(s) pending", v.Triggers))
	}
	return strings.Join(n, "; ")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// runView is a run as runs prints it.
type runView struct {
	Slot       time.Time  `json:"slot"`
	Trigger    string     `json:"trigger,omitempty"`
	Status     string     `json:"status"`
	Fence      int64      `json:"fence"`
	Owner      string     `json:"owner"`
	StartedAt  time.Time  `json:"startedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// DurationSeconds is how long the run took, from its claim to its
	// outcome, in seconds (set once it finished).
	DurationSeconds *float64 `json:"durationSeconds,omitempty"`
	Claims          int      `json:"claims"`
	// Missed counts the slots without a run before this one, found by the
	// catch-up that fired it (RunRecord.Missed); MissedUnknown says the
	// catch-up could not count them. MissedSlots names them when the runs
	// shown tell the schedule's period (runs).
	Missed        int         `json:"missed,omitempty"`
	MissedUnknown bool        `json:"missedUnknown,omitempty"`
	MissedSlots   []time.Time `json:"missedSlots,omitempty"`
	Error         string      `json:"error,omitempty"`

	took string // as the table shows it
}

func viewRun(r ddblease.RunRecord) runView {
	v := runView{Slot: r.Slot.UTC(), Trigger: r.Trigger, Status: string(r.Status), Fence: r.Fence, Owner: r.Owner,
		StartedAt: r.StartedAt.UTC(), FinishedAt: tp(r.FinishedAt), Claims: r.Claims, Missed: r.Missed,
		MissedUnknown: r.MissedUnknown, Error: r.Error}
	if !r.FinishedAt.IsZero() && r.Status != ddblease.RunSkippedByPause {
		v.took, v.DurationSeconds = dur(r.FinishedAt.Sub(r.StartedAt)), seconds(r.FinishedAt.Sub(r.StartedAt))
	}
	return v
}

// runsAbout is runs' help: what it shows, missed slots, --last.
const runsAbout = `Lists the job's runs, oldest first: schedule slots, triggered runs and
slots skipped by a pause, with --since (default 24h; 0: all) those whose
slot is at most that old, with --last N the N latest (within --since only
if it is given), with --status S only those of that status.

A "missed" line before a run stands for the slots that had no run before
it, as the catch-up that fired the run counted them (RunRecord.Missed;
only slots within the replicas' CatchUpWindow are counted): one line per
slot, at its time, when the runs shown give the schedule's period and the
count fills the gap from the run before; otherwise one line giving the
count. In JSON they are the run's missed, missedUnknown and missedSlots.`

// runsQuery is what runs was asked for.
type runsQuery struct {
	since    time.Duration
	sinceSet bool // --since was given
	last     int
	lastSet  bool // --last was given
	status   string
}

// givenFlags returns the names of the flags set on fs's command line.
func givenFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	if fs != nil {
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	}
	return set
}

var statuses = []ddblease.RunStatus{ddblease.RunRunning, ddblease.RunSucceeded, ddblease.RunFailed,
	ddblease.RunAbandoned, ddblease.RunSkippedByPause}

func (e *env) runs(ctx context.Context, args []string, q runsQuery) error {
	job, err := oneJob("runs", args)
	if err != nil {
		return err
	}
	if q.since < 0 {
		return usagef("runs: --since %v is negative", q.since)
	}
	if q.lastSet && q.last < 1 {
		return usagef("runs: --last %d: want at least 1 (the number of latest runs to show)", q.last)
	}
	if q.status != "" && !slices.Contains(statuses, ddblease.RunStatus(q.status)) {
		return usagef("runs: unknown --status %q (one of running, succeeded, failed, abandoned, skipped-by-pause)", q.status)
	}
	if _, err := e.admin.Job(ctx, job); err != nil {
		return err
	}
	var from time.Time
	if q.since > 0 && (q.sinceSet || !q.lastSet) { // --last alone: whatever their age
		from = e.now().Add(-q.since)
	}
	runs, listErr := e.readRuns(ctx, job, from, q)
	if listErr != nil && !errors.Is(listErr, ddblease.ErrMalformedItem) {
		return listErr
	}
	all := make([]runView, len(runs))
	for i, r := range runs {
		all[i] = viewRun(r)
	}
	missedSlots(all)
	views := []runView{}
	for _, v := range all {
		if q.status == "" || v.Status == q.status {
			views = append(views, v)
		}
	}
	if q.lastSet && len(views) > q.last {
		views = views[len(views)-q.last:]
	}
	if e.g.json {
		if err := writeJSON(e.out, views); err != nil {
			return err
		}
		return listErr
	}
	tw := tabwriter.NewWriter(e.out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tSTATUS\tFENCE\tOWNER\tSTARTED\tTOOK\tERROR")
	for _, v := range views {
		for _, line := range missedLines(v) {
			fmt.Fprintf(tw, "%s\tmissed\t-\t-\t-\t-\t%s\n", line[0], line[1])
		}
		slot := v.Slot.Format(time.RFC3339Nano)
		if v.Trigger != "" {
			slot += " (trigger " + v.Trigger + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", slot, v.Status, v.Fence, v.Owner,
			v.StartedAt.Format(time.RFC3339), dash(v.took), dash(oneLine(v.Error)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(views) == 0 {
		e.log.Info(fmt.Sprintf("no runs of %q match", job))
	}
	return listErr
}

// readRuns reads the runs of job from from on, oldest first: all of them,
// or with --last the q.last latest (of q.status): one Query of q.last
// items, and with --status again with twice the limit until enough match
// or the range is read.
func (e *env) readRuns(ctx context.Context, job string, from time.Time, q runsQuery) ([]ddblease.RunRecord, error) {
	if !q.lastSet {
		return e.admin.Runs(ctx, job, ddblease.RunRange{From: from})
	}
	for limit := q.last; ; limit *= 2 {
		runs, err := e.admin.Runs(ctx, job, ddblease.RunRange{From: from, Newest: true, Limit: limit})
		if err != nil && !errors.Is(err, ddblease.ErrMalformedItem) {
			return nil, err
		}
		n := 0
		for _, r := range runs {
			if q.status == "" || string(r.Status) == q.status {
				n++
			}
		}
		// The items it could not decode were returned by the Query too.
		read := len(runs) + malformed(err)
		if n >= q.last || read < limit || limit >= maxRunsPage {
			slices.Reverse(runs)
			return runs, err
		}
	}
}

// maxRunsPage bounds the Query of runs --last --status.
const maxRunsPage = 1 << 16

// malformed counts the items an error of Admin.Runs left out.
func malformed(err error) int {
	if err == nil {
		return 0
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return len(j.Unwrap())
	}
	return 1
}

// missedSlots names the slots each schedule run of views (oldest first)
// counts as missed before it (MissedSlots), where the runs show the
// schedule's period p (the shortest gap between two schedule runs shown)
// and the gap from the schedule run before it is exactly Missed+1 periods:
// the slots are then those of an even schedule. Otherwise only the count
// is known.
func missedSlots(views []runView) {
	var p time.Duration
	prev := -1
	for i, v := range views {
		if v.Trigger != "" {
			continue
		}
		if prev >= 0 {
			if g := v.Slot.Sub(views[prev].Slot); g > 0 && (p == 0 || g < p) {
				p = g
			}
		}
		prev = i
	}
	prev = -1
	for i := range views {
		v := &views[i]
		if v.Trigger != "" {
			continue
		}
		if prev >= 0 && p > 0 && v.Missed > 0 && v.Slot.Sub(views[prev].Slot) == time.Duration(v.Missed+1)*p {
			for k := 1; k <= v.Missed; k++ {
				v.MissedSlots = append(v.MissedSlots, views[prev].Slot.Add(time.Duration(k)*p))
			}
		}
		prev = i
	}
}

// missedLines are the "missed" lines runs prints before v: slot column
// and error column.
func missedLines(v runView) [][2]string {
	before := v.Slot.Format(time.RFC3339Nano)
	switch {
	case len(v.MissedSlots) > 0:
		lines := make([][2]string, len(v.MissedSlots))
		for i, s := range v.MissedSlots {
			lines[i] = [2]string{s.Format(time.RFC3339Nano), "no run (counted by the catch-up before " + before + ")"}
		}
		return lines
	case v.Missed == 1:
		return [][2]string{{"1 slot before " + before, "no run (counted by the catch-up before it)"}}
	case v.Missed > 1:
		return [][2]string{{fmt.Sprintf("%d slots before %s", v.Missed, before), "no run (counted by the catch-up before it)"}}
	case v.MissedUnknown:
		return [][2]string{{"slots before " + before, "not counted: the catch-up before it could not read them"}}
	}
	return nil
}

func (e *env) createTable(ctx context.Context, args []string, print bool) error {
	if len(args) != 0 {
		return usagef("create-table: takes no arguments (the table is --table)")
	}
	table := e.g.table
	if print {
		if table == "" {
			table = "leases"
		}
		defs, err := tableDefinitions(table, e.g.layout)
		if err != nil {
			return usagef("create-table: %v", err)
		}
		_, err = io.WriteString(e.out, defs)
		return err
	}
	if err := ddblease.CreateTable(ctx, e.db, table, func(y *ddblease.Layout) { *y = e.g.layout }); err != nil {
		return err
	}
	spec, err := e.g.layout.TableSpec()
	if err != nil {
		return usagef("create-table: %v", err)
	}
	if d, err := e.db.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(table)}); err == nil &&
		d.TimeToLiveDescription != nil && aws.ToString(d.TimeToLiveDescription.AttributeName) == spec.TTLAttribute &&
		(d.TimeToLiveDescription.TimeToLiveStatus == types.TimeToLiveStatusEnabled ||
			d.TimeToLiveDescription.TimeToLiveStatus == types.TimeToLiveStatusEnabling) {
		fmt.Fprintf(e.out, "table %q is ready\n", table)
		return nil
	}
	_, err = e.db.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(spec.TTLAttribute), Enabled: aws.Bool(true),
		},
	})
	if err != nil {
		e.log.Warn(fmt.Sprintf("time to live not enabled on %q: %s", spec.TTLAttribute, oneLine(err.Error())))
	}
	fmt.Fprintf(e.out, "table %q is ready\n", table)
	return nil
}

func (e *env) resign(ctx context.Context, args []string) error {
	job, err := oneJob("resign", args)
	if err != nil {
		return err
	}
	rec, err := e.admin.RequestResign(ctx, job, 0)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.out, "asked %q (fence %d) to resign %s: it drains and hands over at its next heartbeat\n",
		rec.Owner, rec.Fence, job)
	return nil
}

// forceReleaseAbout is force-release's help: what each way guarantees.
const forceReleaseAbout = `Raises the lease's fence by one, in one write conditional on the fence
shown. From that write on, the holder's heartbeats, its claims (on servers
with transactions) and its guarded writes that check the lease's fence
(Guard.TransactWrite, JobRun.Commit, Guard.Check/Do) are refused; the
holder's leader context ends at its next heartbeat (within its
HeartbeatInterval), with a cause saying an operator released it.

Without --dead, the holder's recorded expiry is kept: no other replica
leads until that expiry plus MaxClockSkew has passed on its clock, when the
holder's tenure has surely ended by its own clock. One leader at a time
holds throughout, as long as the replicas' clock offsets stay under
MaxClockSkew; a standby waits up to one LeaseDuration.

With --dead, the expiry is set to zero as well and a standby leads within
one poll. Use it only when the holder is dead (or cut off from the table for
good): if it is alive, it believes it leads until its next heartbeat or its
local deadline, alongside the new leader, and one leader at a time does not
hold. Its writes that check the lease's fence are still refused.

A job of a pool moves to another replica: its holder learns of the release
at its session's next renewal (within a HeartbeatInterval), frees the item
and declines the job, and another replica leads it within a heartbeat or
two. With --dead, the release also marks the job declined in the holder's
member item: the surviving replicas assign it elsewhere at their next
renewal and one leads it at once, without waiting for the holder's
membership to lapse.

Either way, Guard.Put and Guard.Update refuse the old fence on an item only
once a newer fence has written that item.`

func (e *env) forceRelease(ctx context.Context, args []string, yes, dead bool) error {
	job, err := oneJob("force-release", args)
	if err != nil {
		return err
	}
	st, err := e.admin.Job(ctx, job)
	if err != nil {
		return err
	}
	v := e.view(st)
	r := st.Lease
	after := r.ExpiresAt.Add(e.g.skew).UTC().Format(time.RFC3339)
	next := fmt.Sprintf("no other replica leads before its recorded expiry plus --max-clock-skew (%s)", after)
	switch {
	case r.Session != "" && dead:
		next = "a surviving replica of pool " + r.Pool + " leads it at its next renewal"
	case r.Session != "":
		next = "its holder declines it at its session's next renewal and another replica of pool " + r.Pool + " leads it within a heartbeat or two"
	case dead:
		next = "a standby leads at once"
	case r.ExpiresAt.IsZero() || v.State == "expired":
		next = "a standby leads at once (the lease is " + v.State + ")"
	}
	what := fmt.Sprintf("release %s by force: fence %d -> %d; holder %q (%s): its heartbeats, claims and fenced writes are refused from the write on, it stops leading at its next heartbeat, and %s",
		job, r.Fence, r.Fence+1, r.Owner, v.State, next)
	if dead {
		what += " (--dead: if the holder is alive, two replicas believe they lead until its next heartbeat)"
	}
	if !yes {
		return usagef("force-release: would %s; run again with --yes to do it", what)
	}
	rec, err := e.admin.ForceRelease(ctx, job, r.Fence, func(o *ddblease.ReleaseOptions) { o.HolderDead = dead })
	if err != nil {
		return err
	}
	fmt.Fprintf(e.out, "released %s by force: fence is now %d (was %d, held by %q); %s\n", job, rec.Fence, r.Fence, r.Owner, next)
	return nil
}

func (e *env) pause(ctx context.Context, args []string) error {
	job, err := oneJob("pause", args)
	if err != nil {
		return err
	}
	rec, err := e.admin.Pause(ctx, job)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.out, "%s paused by %s at %s: slots that fall due are recorded as skipped-by-pause\n",
		job, rec.Control.PausedBy, rec.Control.PausedAt.UTC().Format(time.RFC3339))
	return nil
}

func (e *env) resume(ctx context.Context, args []string, catchUp bool) error {
	job, err := oneJob("resume", args)
	if err != nil {
		return err
	}
	rec, err := e.admin.Resume(ctx, job, catchUp)
	if err != nil {
		return err
	}
	msg := "slots skipped by the pause are not run"
	if catchUp {
		msg = "the latest slot skipped by the pause will be run"
	}
	fmt.Fprintf(e.out, "%s resumed by %s: %s\n", job, rec.Control.ResumedBy, msg)
	return nil
}

// triggerAbout is trigger's help: what --wait waits for, and its exit
// statuses.
const triggerAbout = `Asks the job's leader to run it once now, as an extra run with an id of
its own: the leader's RunSchedule takes the request up at its next
heartbeat (replicas that use Run never do; with no replica running, it
stays pending until one does). Without --wait, prints the run's id and
returns at once.

With --wait, reads the run about every 500ms until it has finished and
prints how it ended: exit status 0 if it succeeded, 1 if it failed or was
abandoned. It waits at most --wait-timeout (default 5m; 0: for ever; the
global --timeout bounds only the request itself): then it prints the
trigger's id and whether the run had started, and exits with status 3.
The request stays pending, or the run goes on: follow it with
ddblease runs JOB or ddblease watch JOB.`

// waitExitCode is trigger --wait's exit status when it gives up.
const waitExitCode = 3

// errGaveUp is the cause of trigger --wait's end at --wait-timeout.
var errGaveUp = errors.New("--wait-timeout passed")

// gaveUpError is trigger --wait giving up: exit status waitExitCode.
type gaveUpError struct{ msg string }

func (e *gaveUpError) Error() string { return e.msg }
func (e *gaveUpError) ExitCode() int { return waitExitCode }

func (e *env) trigger(ctx context.Context, args []string, wait bool, waitMax time.Duration) error {
	job, err := oneJob("trigger", args)
	if err != nil {
		return err
	}
	if waitMax < 0 {
		return usagef("trigger: --wait-timeout %v is negative", waitMax)
	}
	tctx := ctx
	if e.g.timeout > 0 {
		var cancel context.CancelFunc
		tctx, cancel = context.WithTimeout(ctx, e.g.timeout)
		defer cancel()
	}
	tr, err := e.admin.Trigger(tctx, job)
	if err != nil {
		return err
	}
	if !wait {
		if e.g.json {
			return writeJSON(e.out, map[string]string{"job": job, "trigger": tr.ID, "run": tr.RunID()})
		}
		fmt.Fprintf(e.out, "triggered %s: run %s (the leader's RunSchedule runs it after its next heartbeat; see: ddblease runs %s)\n", job, tr.RunID(), job)
		return nil
	}
	wctx := ctx
	if waitMax > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeoutCause(ctx, waitMax, errGaveUp)
		defer cancel()
	}
	rec, err := e.admin.WaitRun(wctx, tr, 500*time.Millisecond)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(wctx), errGaveUp) {
		rec, err = e.gaveUp(ctx, job, tr, waitMax)
	}
	if err != nil {
		return err
	}
	if e.g.json {
		if err := writeJSON(e.out, viewRun(rec)); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.out, "run %s of %s: %s on %q (fence %d), took %s\n", tr.RunID(), job, rec.Status, rec.Owner, rec.Fence,
			dur(rec.FinishedAt.Sub(rec.StartedAt)))
	}
	if rec.Status != ddblease.RunSucceeded {
		return fmt.Errorf("run %s of %s %s: %s", tr.RunID(), job, rec.Status, dash(rec.Error))
	}
	return nil
}

// gaveUp reports trigger --wait's end at --wait-timeout: it reads the
// run once more (within --timeout), returns it if it has finished
// meanwhile, and otherwise prints what it knows (with --json) and returns
// an error of exit status waitExitCode saying where to look next.
func (e *env) gaveUp(ctx context.Context, job string, tr ddblease.Trigger, waited time.Duration) (ddblease.RunRecord, error) {
	rctx := ctx
	if e.g.timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, e.g.timeout)
		defer cancel()
	}
	rec, started, err := e.admin.TriggerRun(rctx, tr)
	if err == nil && started && rec.Status != ddblease.RunRunning {
		return rec, nil // finished meanwhile
	}
	state, what := "pending", "has not started: no leader running RunSchedule has taken the request up (it stays pending, and runs when one does)"
	switch {
	case err != nil:
		state, what = "unknown", "could not be read: "+oneLine(err.Error())
	case started:
		state, what = "running", fmt.Sprintf("has started on %q (fence %d) and not finished", rec.Owner, rec.Fence)
	}
	if e.g.json {
		v := map[string]any{"job": job, "trigger": tr.ID, "run": tr.RunID(), "state": state, "waitedSeconds": waited.Seconds()}
		if started {
			v["record"] = viewRun(rec)
		}
		if err := writeJSON(e.out, v); err != nil {
			return ddblease.RunRecord{}, err
		}
	}
	return ddblease.RunRecord{}, &gaveUpError{fmt.Sprintf("trigger %s: gave up waiting after %v (--wait-timeout): run %s (trigger %s) %s; see: ddblease runs %s",
		job, waited, tr.RunID(), tr.ID, what, job)}
}

// watch prints a line whenever the holder, fence, state or controls of the
// job change, and whenever one of its runs appears or changes status. Each
// look reads what may have changed, whatever the job's history: the lease
// item, the runs from the latest one seen on, and each run seen running.
func (e *env) watch(ctx context.Context, args []string, interval time.Duration) error {
	job, err := oneJob("watch", args)
	if err != nil {
		return err
	}
	if interval <= 0 {
		return usagef("watch: --interval %v must be positive", interval)
	}
	st, err := e.admin.Job(ctx, job)
	if err != nil {
		return err
	}
	w := runWatch{e: e, job: job, seen: map[string]ddblease.RunStatus{}}
	// The latest runs as they stand: only changes after the start are
	// shown.
	w.look(ctx, ddblease.RunRange{Newest: true, Limit: watchStart}, false)
	var last string
	for {
		v := e.view(st)
		line := fmt.Sprintf("lease %s: %s holder=%q fence=%d draining=%v paused=%v", job, v.State, v.Holder, v.Fence, v.Draining, v.Paused)
		if n := notes(v); n != "" {
			line += " (" + n + ")"
		}
		if line != last {
			e.emit(map[string]any{"kind": "lease", "lease": v}, line)
			last = line
		}
		w.next(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
		if s, err := e.admin.Job(ctx, job); err == nil {
			st = s
		} else if ctx.Err() != nil {
			return nil
		} else {
			e.log.Error("ddblease: watch: " + oneLine(err.Error()))
		}
	}
}

// watchStart is how many of the latest runs watch reads when it starts.
const watchStart = 20

// runWatch follows the runs of a job for watch.
type runWatch struct {
	e      *env
	job    string
	latest time.Time                     // the latest slot seen
	seen   map[string]ddblease.RunStatus // by run: the status last shown
}

// next reads the runs from the latest one seen on, and again each run
// last seen running, and shows what changed.
func (w *runWatch) next(ctx context.Context) {
	var running []time.Time
	for id, st := range w.seen {
		if st == ddblease.RunRunning {
			slot, _, _ := strings.Cut(id, "#")
			if t, err := time.Parse(time.RFC3339Nano, slot); err == nil && t.Before(w.latest) {
				running = append(running, t)
			}
		}
	}
	w.look(ctx, ddblease.RunRange{From: w.latest}, true)
	for _, slot := range running {
		w.look(ctx, ddblease.RunRange{From: slot, To: slot}, true)
	}
	// A finished run before the latest slot changes no more: forget it.
	for id, st := range w.seen {
		slot, _, _ := strings.Cut(id, "#")
		if t, err := time.Parse(time.RFC3339Nano, slot); err == nil && st != ddblease.RunRunning && t.Before(w.latest) {
			delete(w.seen, id)
		}
	}
}

// look reads the runs of r and shows those that appeared or changed
// status (when show is set).
func (w *runWatch) look(ctx context.Context, r ddblease.RunRange, show bool) {
	rs, err := w.e.admin.Runs(ctx, w.job, r)
	if err != nil && ctx.Err() == nil {
		fmt.Fprintf(w.e.errw, "ddblease: watch: %s\n", oneLine(err.Error()))
	}
	for _, r := range rs {
		if r.Slot.After(w.latest) {
			w.latest = r.Slot
		}
		id := r.Slot.Format(time.RFC3339Nano) + "#" + r.Trigger
		if old, ok := w.seen[id]; ok && old == r.Status {
			continue
		}
		w.seen[id] = r.Status
		if show {
			w.show(r)
		}
	}
}

// show prints one run's new status.
func (w *runWatch) show(r ddblease.RunRecord) {
	rv := viewRun(r)
	slot := rv.Slot.Format(time.RFC3339Nano)
	if rv.Trigger != "" {
		slot += " (trigger " + rv.Trigger + ")"
	}
	line := fmt.Sprintf("run %s: %s fence=%d owner=%q", slot, rv.Status, rv.Fence, rv.Owner)
	if rv.Error != "" {
		line += " error=" + oneLine(rv.Error)
	}
	w.e.emit(map[string]any{"kind": "run", "run": rv}, line)
}

func (e *env) emit(v any, line string) {
	if e.g.json {
		b, _ := json.Marshal(v)
		fmt.Fprintln(e.out, string(b))
		return
	}
	fmt.Fprintf(e.out, "%s %s\n", e.now().UTC().Format(time.RFC3339), line)
}
