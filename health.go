package ddblease

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/smithy-go"
)

// This file owns what a lease's and a pool's health is judged by (health,
// poolHealth) and HealthHandler; Lease.CheckHealth and Pool.CheckHealth
// read them (lease.go, pool.go).

// HealthOptions configures what CheckHealth (and so HealthHandler) judges
// of a Lease besides the lease itself (Options.Health).
type HealthOptions struct {
	// FailedRuns, when positive, makes CheckHealth fail once the last
	// FailedRuns runs whose outcome this handle recorded all failed
	// (RunFailed: fn returned an error or panicked, from RunSchedule, a
	// trigger, a catch-up or JobRun.Finish), until a run it records
	// succeeds. Runs skipped by a pause, and runs whose outcome was not
	// recorded (the tenure ended first), neither count nor end the
	// streak; a handle that stops leading keeps its streak. A job that
	// fails every slot is then reported where a probe or an alarm sees
	// it. Zero (the default): runs are not judged; negative: an error.
	FailedRuns int
}

// HealthChecker is what HealthHandler probes: a *Lease or a *Pool.
type HealthChecker interface {
	CheckHealth(tolerance time.Duration) error
}

// HealthHandler returns an http.Handler for a liveness probe on leases and
// pools: it answers 200 and "ok" when CheckHealth(tolerance) returns nil
// for every one, else 503 and the reasons on one line. Mount it on, say,
// /healthz.
func HealthHandler(tolerance time.Duration, checks ...HealthChecker) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var why []string
		for _, c := range checks {
			if err := c.CheckHealth(tolerance); err != nil {
				why = append(why, err.Error())
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if len(why) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, strings.Join(why, "; "))
			return
		}
		fmt.Fprintln(w, "ok")
	})
}

// health tracks, from a Lease's own events, what CheckHealth reports. A
// lease that never failed holds only whether it leads and since when: the
// rest is made at its first failure (a handle costs little in a process
// that holds thousands).
type health struct {
	mu sync.Mutex

	leading   bool
	confirmed time.Time // the last acquisition or renewal (Event.Time)

	f *healthFailures // nil until the first failure is recorded
}

// healthFailures is what a health records of failures.
type healthFailures struct {
	failedCall string // DynamoDB operation of the last failed call, until one succeeds

	failedRuns  int       // runs recorded failed in a row (EventRunFinished)
	lastRunFail time.Time // when the latest of them was recorded
	lastRunErr  error     // and its error

	failing   bool
	failKey   string    // step and cause of the failures in a row
	failCall  string    // the DynamoDB operation that failed, "" if none did
	failSince time.Time // the first of them
	failOp    string
	failErr   error
}

// failures returns h.f, made if it is nil. Called with h.mu held.
func (h *health) failures() *healthFailures {
	if h.f == nil {
		h.f = &healthFailures{}
	}
	return h.f
}

// observe updates h with one of its Lease's events; the Lease's notifier calls it
// for each, in order.
func (h *health) observe(e Event) {
	switch e.Kind {
	case EventAcquired, EventRenewed, EventLost, EventResigned, EventRetry, EventStopped, EventCall, EventLeaderSeen,
		EventRunFinished:
	default:
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	f := h.f // nil: nothing failed yet, and there is nothing to clear
	switch e.Kind {
	case EventRunFinished:
		switch e.Status {
		case RunSucceeded:
			if f != nil {
				f.failedRuns = 0
			}
		case RunFailed:
			f = h.failures()
			f.failedRuns++
			f.lastRunFail, f.lastRunErr = e.Time, e.Err
		}
	case EventAcquired, EventRenewed:
		h.leading, h.confirmed = true, e.Time
		if f != nil {
			f.failing = false
		}
	case EventLost, EventResigned:
		h.leading = false
		if f != nil && f.failing && f.failOp == "heartbeat" { // heartbeats end with the tenure
			f.failing = false
		}
	case EventLeaderSeen:
		if f != nil {
			f.failing = false
		}
	case EventCall:
		switch {
		case e.Outcome != CallOK && e.Outcome != CallConditionFailed:
			h.failures().failedCall = e.Op
		case f != nil:
			f.failedCall = ""
			if f.failing && e.Op == f.failCall {
				f.failing = false
			}
		}
	case EventRetry:
		h.failures().fail(e.Time, e.Op, e.Err)
	case EventStopped:
		h.leading = false
		if e.Err == nil || errors.Is(e.Err, context.Canceled) {
			if f != nil {
				f.failing = false
			}
			return
		}
		f = h.failures()
		f.failedCall = ""
		f.fail(e.Time, stepRun, e.Err)
	}
}

// stepRun names, among the steps of EventRetry, Run or RunSchedule having
// returned an error.
const stepRun = "run"

// fail records a failure of step op; a streak of failures with the same
// step and cause keeps the time of its first.
func (f *healthFailures) fail(at time.Time, op string, err error) {
	key := op + ": " + errorClass(err)
	if !f.failing || key != f.failKey {
		f.failing, f.failKey, f.failSince, f.failCall = true, key, at, f.failedCall
	}
	f.failOp, f.failErr = op, err
}

// check returns the verdict at now; renewed, when later than the last
// acquisition or renewal the events reported, is the last renewal of the
// pool session the lease is bound to.
func (h *health) check(now time.Time, job string, heartbeat, tolerance time.Duration, failedRuns int, renewed time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	confirmed := h.confirmed
	if renewed.After(confirmed) {
		confirmed = renewed
	}
	f := h.f
	if f != nil && failedRuns > 0 && f.failedRuns >= failedRuns {
		return fmt.Errorf("%w: job %q: its last %d runs failed (the latest %v ago): %s",
			ErrUnhealthy, job, f.failedRuns, now.Sub(f.lastRunFail).Round(time.Millisecond), oneLine(f.lastRunErr))
	}
	if h.leading {
		if late := now.Sub(confirmed) - heartbeat; late > tolerance {
			return fmt.Errorf("%w: job %q: leading, but the lease was last renewed %v ago (renewals overdue by %v, tolerance %v)",
				ErrUnhealthy, job, now.Sub(confirmed).Round(time.Millisecond), late.Round(100*time.Microsecond), tolerance)
		}
	}
	if f != nil && f.failing {
		d := now.Sub(f.failSince)
		if d > tolerance && f.failOp == stepRun {
			return fmt.Errorf("%w: job %q: the campaign stopped with an error %v ago and has not succeeded since (tolerance %v): %s",
				ErrUnhealthy, job, d.Round(time.Millisecond), tolerance, oneLine(f.failErr))
		}
		if d > tolerance {
			return fmt.Errorf("%w: job %q: %s has failed for %v with the same error (tolerance %v): %s",
				ErrUnhealthy, job, f.failOp, d.Round(time.Millisecond), tolerance, oneLine(f.failErr))
		}
	}
	return nil
}

// errorClass names the cause of err, without what differs between two
// failures of the same cause (request ids, times): the DynamoDB error
// code, else the message of the innermost error.
func errorClass(err error) string {
	if err == nil {
		return ""
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode()
	}
	for {
		var next error
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			next = u.Unwrap()
		case interface{ Unwrap() []error }:
			if errs := u.Unwrap(); len(errs) > 0 {
				next = errs[0]
			}
		}
		if next == nil {
			return fmt.Sprintf("%T: %s", err, oneLine(err))
		}
		err = next
	}
}

// oneLine returns err's message with line breaks replaced by spaces.
func oneLine(err error) string {
	if err == nil {
		return "<nil>"
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// stepMembership names, among the steps of EventRetry, a pool's
// membership renewal.
const stepMembership = "membership"

// poolHealth tracks what Pool.CheckHealth reports of the membership.
type poolHealth struct {
	mu      sync.Mutex
	failing bool
	since   time.Time // the first failed renewal since the last success
	err     error     // the latest
	stop    error     // the error Run last returned, until it runs again
	stopAt  time.Time
}

func (h *poolHealth) ok() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failing, h.err, h.stop = false, nil, nil
}

func (h *poolHealth) fail(at time.Time, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing {
		h.failing, h.since = true, at
	}
	h.err = err
}

// stopped records what Run returned.
func (h *poolHealth) stopped(at time.Time, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failing, h.stop, h.stopAt = false, err, at
}

func (h *poolHealth) check(now time.Time, pool string, tolerance time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.stop != nil:
		return fmt.Errorf("%w: pool %q: Run stopped with an error %v ago: %s",
			ErrUnhealthy, pool, now.Sub(h.stopAt).Round(time.Millisecond), oneLine(h.stop))
	case h.failing && now.Sub(h.since) > tolerance:
		return fmt.Errorf("%w: pool %q: the membership's renewals have failed for %v (tolerance %v): %s",
			ErrUnhealthy, pool, now.Sub(h.since).Round(time.Millisecond), tolerance, oneLine(h.err))
	}
	return nil
}
