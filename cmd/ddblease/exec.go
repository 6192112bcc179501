package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/robfig/cron/v3"
)

// execFlags are the flags of ddblease exec.
type execFlags struct {
	every    time.Duration
	schedule string
	restart  bool
	health   string
	owner    string
	lease    time.Duration
	drain    time.Duration
	retry    time.Duration
}

const execArgs = "JOB [--every D | --schedule CRON] [--restart] [--health ADDR] -- COMMAND [ARGS...]"

// commandAfterDashes ends the error of an exec command line without "--".
const commandAfterDashes = "COMMAND goes after --: ddblease exec JOB [flags] -- COMMAND [ARGS...]"

func execCommand() *command {
	var f execFlags
	return &command{
		name: "exec", args: execArgs,
		flags: func(fs *flag.FlagSet) {
			fs.DurationVar(&f.every, "every", 0, "run COMMAND once per slot of this period on the leader (a schedule)")
			fs.StringVar(&f.schedule, "schedule", "", "run COMMAND once per slot of this cron `spec` on the leader (5 fields or @hourly..., UTC unless CRON_TZ=)")
			fs.BoolVar(&f.restart, "restart", false, "without a schedule: restart COMMAND when it exits while leading, instead of resigning and exiting")
			fs.StringVar(&f.health, "health", "", "serve the health check on this `address` (host:port), at any path")
			fs.StringVar(&f.owner, "owner", "", "owner id written in the lease (default: the ECS task, pod or host and pid, and a random suffix)")
			fs.DurationVar(&f.lease, "lease-duration", ddblease.DefaultLeaseDuration, "how long a written lease stays valid; heartbeats every third of it")
			fs.DurationVar(&f.drain, "drain-timeout", ddblease.DefaultDrainTimeout, "how long COMMAND gets to exit after SIGTERM before SIGKILL (never past the tenure's deadline)")
			fs.DurationVar(&f.retry, "retry-interval", ddblease.DefaultRetryInterval, "how often a standby polls the lease")
		},
		run:      func(e *env, ctx context.Context, args []string) error { return e.exec(ctx, args, f) },
		long:     true,
		dashDash: true,
		stream:   true,
	}
}

// execSpec is a checked exec command line.
type execSpec struct {
	job   string
	argv  []string
	sched ddblease.Schedule // nil: a long-running COMMAND
	f     execFlags
}

// parseExec checks the arguments of exec: JOB, "--", then the command,
// which must exist.
func parseExec(args []string, f execFlags) (execSpec, error) {
	i := -1
	for n, a := range args {
		if a == "--" {
			i = n
			break
		}
	}
	if i < 0 {
		return execSpec{}, usagef("exec: %s", commandAfterDashes)
	}
	if i != 1 {
		return execSpec{}, usagef("exec: want exactly one JOB before --, got %d arguments", i)
	}
	s := execSpec{job: args[0], argv: args[i+1:], f: f}
	if len(s.argv) == 0 || s.argv[0] == "" {
		return execSpec{}, usagef("exec: no command after --")
	}
	switch {
	case f.every < 0:
		return execSpec{}, usagef("exec: --every %v is negative", f.every)
	case f.every > 0 && f.schedule != "":
		return execSpec{}, usagef("exec: --every and --schedule both given; use one")
	case f.every > 0:
		s.sched = ddblease.Every(f.every)
	case f.schedule != "":
		c, err := cron.ParseStandard(f.schedule)
		if err != nil {
			return execSpec{}, usagef("exec: --schedule %q: %v", f.schedule, err)
		}
		s.sched = utcCron{c}
	}
	if s.sched != nil && f.restart {
		return execSpec{}, usagef("exec: --restart applies only without a schedule (a scheduled COMMAND runs once per slot)")
	}
	if f.health != "" {
		if _, _, err := net.SplitHostPort(f.health); err != nil {
			return execSpec{}, usagef("exec: --health %q: %v", f.health, err)
		}
	}
	if _, err := exec.LookPath(s.argv[0]); err != nil {
		return execSpec{}, usagef("exec: command %q: %v", s.argv[0], errors.Unwrap(err))
	}
	return s, nil
}

// utcCron reads a cron schedule in UTC, unless it names its own zone with
// CRON_TZ=.
type utcCron struct{ s cron.Schedule }

func (c utcCron) Next(t time.Time) time.Time { return c.s.Next(t.UTC()) }

// exitStatus is COMMAND's status, which ddblease exec exits with.
type exitStatus struct {
	job  string
	code int
	sig  syscall.Signal // the signal that ended COMMAND; 0 if none
	why  string         // "exited with status 3", "was killed by SIGTERM"
}

func (x *exitStatus) Error() string { return fmt.Sprintf("exec %s: COMMAND %s", x.job, x.why) }

// ExitCode is the exit status of ddblease exec.
func (x *exitStatus) ExitCode() int { return x.code }

// status describes how COMMAND ended; nil when it exited with status 0.
func status(job string, end procEnd) *exitStatus {
	switch {
	case end.err != nil:
		return &exitStatus{job: job, code: end.code, why: "failed to run: " + end.err.Error()}
	case end.sig != 0:
		return &exitStatus{job: job, code: end.code, sig: end.sig, why: "was killed by " + sigName(end.sig)}
	case end.code != 0:
		return &exitStatus{job: job, code: end.code, why: fmt.Sprintf("exited with status %d", end.code)}
	}
	return nil
}

// execer runs COMMAND for the tenures of one lease.
type execer struct {
	e    *env
	s    execSpec
	l    *ddblease.Lease
	log  *slog.Logger
	quit context.Context // ended by SIGTERM or SIGINT to ddblease exec

	mu       sync.Mutex
	sig      syscall.Signal // the first signal received; 0 if none
	child    *proc          // the running COMMAND, if any
	fence    int64          // the tenure the observer follows
	deadline time.Time      // its local deadline, as of its latest renewal
	changed  chan struct{}  // poked when the tenure is renewed or ends
}

func (e *env) exec(ctx context.Context, args []string, f execFlags) error {
	s, err := parseExec(args, f)
	if err != nil {
		return err
	}
	x := &execer{e: e, s: s, log: e.log.With("job", s.job), changed: make(chan struct{}, 1)}
	// The library's log: its warnings, in the same format.
	libLog, err := newLogger(e.errw, e.g.logs, true, slog.LevelWarn)
	if err != nil {
		return err
	}
	x.l, err = ddblease.New(e.db, e.g.table, s.job, func(o *ddblease.Options) {
		o.Owner = f.owner
		o.Layout = e.g.layout
		o.LeaseDuration = f.lease
		o.DrainTimeout = f.drain
		o.RetryInterval = f.retry
		o.MaxClockSkew = e.g.skew
		o.Logger = libLog
		o.Observer = x.observe
	})
	if err != nil {
		return usagef("exec: %v", err)
	}

	if f.health != "" {
		ln, err := net.Listen("tcp", f.health)
		if err != nil {
			return fmt.Errorf("exec: --health: %w", err)
		}
		hs := &http.Server{Handler: ddblease.HealthHandler(0, x.l), ReadHeaderTimeout: 5 * time.Second}
		served := make(chan struct{})
		go func() { defer close(served); _ = hs.Serve(ln) }()
		defer func() { _ = hs.Close(); <-served }()
	}

	// The signals are taken here, not from ctx, so that the child gets the
	// one that came: the first starts the shutdown, later ones go to the
	// child as they come.
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT)
	quit, stop := context.WithCancelCause(context.WithoutCancel(ctx))
	x.quit = quit
	done := make(chan struct{})
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		for {
			select {
			case <-done:
				return
			case sg := <-sigc:
				x.received(sg.(syscall.Signal), stop)
			}
		}
	}()
	defer func() { signal.Stop(sigc); close(done); <-forwarded; stop(nil) }()

	x.logf(slog.LevelInfo, "campaigning as %s", x.l.Owner())
	if s.sched != nil {
		err = x.l.RunSchedule(quit, s.sched, x.runSlot)
	} else {
		err = x.l.Run(quit, x.runLong)
	}
	return x.exitWith(err)
}

// exitWith applies the exit status rule (docs/exec.md, "Exit status") to
// what Run or RunSchedule returned: a stop asked for by SIGTERM or SIGINT
// that went as asked is status 0; a lease not handed over is not; without
// a schedule, COMMAND's own status counts unless the signal ended it.
func (x *execer) exitWith(err error) error {
	var st *exitStatus
	switch {
	case err == nil, x.quit.Err() == nil, errors.Is(err, ddblease.ErrNotResigned):
		return err
	case errors.As(err, &st):
		if st.sig == syscall.SIGTERM || st.sig == syscall.SIGINT {
			return nil // ended by the signal passed on to it, as asked
		}
		return err
	case errors.Is(err, context.Canceled):
		// Standing by, and every attempt since the last tenure had failed.
		x.logf(slog.LevelWarn, "stopped while standing by; the last attempt had failed: %v", err)
		return nil
	case x.s.sched != nil && errors.Is(err, ddblease.ErrDrainTimeout):
		// The run in flight was killed, and recorded as failed.
		x.logf(slog.LevelWarn, "stopped; the run in flight outlasted the drain timeout: %v", err)
		return nil
	}
	return err
}

// received handles a signal to ddblease exec.
func (x *execer) received(sig syscall.Signal, stop context.CancelCauseFunc) {
	x.mu.Lock()
	first := x.sig == 0
	if first {
		x.sig = sig
	}
	c := x.child
	x.mu.Unlock()
	if first {
		x.logf(slog.LevelInfo, "received %s: stopping", sigName(sig))
		stop(fmt.Errorf("received %v", sig))
		return
	}
	if c != nil {
		c.signal(sig)
	}
}

// observe is the lease's Observer: one log line per change of leadership,
// and the tenure's deadline for stopping the child in time.
func (x *execer) observe(ev ddblease.Event) {
	switch ev.Kind {
	case ddblease.EventAcquired, ddblease.EventRenewed:
		st := x.l.State()
		x.mu.Lock()
		if st.Leader && st.Fence == ev.Fence {
			x.fence, x.deadline = st.Fence, st.Deadline
		}
		x.mu.Unlock()
		x.poke()
	case ddblease.EventLost, ddblease.EventResigned:
		x.poke()
	}
	switch ev.Kind {
	case ddblease.EventAcquired:
		x.logf(slog.LevelInfo, "leading with fence %d", ev.Fence)
	case ddblease.EventLost:
		x.logf(slog.LevelWarn, "lost the lease (fence %d, %s): %v", ev.Fence, ev.Reason, ev.Err)
	case ddblease.EventDraining:
		x.logf(slog.LevelInfo, "draining fence %d", ev.Fence)
	case ddblease.EventResigned:
		x.logf(slog.LevelInfo, "resigned fence %d", ev.Fence)
	case ddblease.EventLeaderSeen:
		x.logf(slog.LevelInfo, "standing by: %s leads with fence %d", ev.Holder, ev.Fence)
	}
}

func (x *execer) poke() {
	select {
	case x.changed <- struct{}{}:
	default:
	}
}

func (x *execer) logf(level slog.Level, format string, args ...any) {
	x.log.Log(context.Background(), level, fmt.Sprintf(format, args...))
}

// environ is the child's environment: ddblease exec's own, and its tenure.
func (x *execer) environ(fence int64, run *ddblease.JobRun) []string {
	env := append(os.Environ(),
		"DDBLEASE_JOB="+x.s.job,
		"DDBLEASE_FENCE="+strconv.FormatInt(fence, 10),
		"DDBLEASE_TABLE="+x.e.g.table,
		"DDBLEASE_SLOT=", "DDBLEASE_IDEMPOTENCY_KEY=", "DDBLEASE_TRIGGER=")
	if run != nil {
		env = append(env,
			"DDBLEASE_SLOT="+run.Slot().UTC().Format(time.RFC3339Nano),
			"DDBLEASE_IDEMPOTENCY_KEY="+run.IdempotencyKey(),
			"DDBLEASE_TRIGGER="+run.Trigger())
	}
	return env
}

// start starts COMMAND for the tenure with this fence.
func (x *execer) start(fence int64, run *ddblease.JobRun, tail int) (*proc, error) {
	c, err := startProc(x.s.argv, x.environ(fence, run), x.e.out, x.e.errw, tail)
	if err != nil {
		return nil, fmt.Errorf("exec %s: starting %q: %w", x.s.job, x.s.argv[0], err)
	}
	x.mu.Lock()
	x.child = c
	x.mu.Unlock()
	return c, nil
}

// wait waits for the child to exit, stopping it if the tenure ends first
// (ctx is the leader context). It reports how the child ended.
func (x *execer) wait(ctx context.Context, fence int64, c *proc) procEnd {
	defer func() {
		x.mu.Lock()
		x.child = nil
		x.mu.Unlock()
	}()
	select {
	case <-c.done:
		return c.end
	case <-ctx.Done():
	}
	// The tenure is ending: a shutdown, an operator's resign request (the
	// lease is kept while the child drains), or a loss. SIGTERM (or the
	// signal that came) now; SIGKILL when the drain timeout has passed or
	// at the tenure's deadline, whichever comes first.
	x.mu.Lock()
	sig := x.sig
	x.mu.Unlock()
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	c.signal(sig)
	drainEnd := time.Now().Add(x.s.f.drain)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		killAt := drainEnd
		x.mu.Lock()
		if x.fence == fence && x.deadline.Before(killAt) {
			killAt = x.deadline
		}
		x.mu.Unlock()
		timer.Reset(time.Until(killAt))
		select {
		case <-c.done:
			return c.end
		case <-x.changed:
			continue
		case <-timer.C:
		}
		if time.Now().Before(killAt) {
			continue
		}
		c.kill()
		<-c.done
		x.logf(slog.LevelWarn, "COMMAND (pid %d) did not exit in time: killed", c.pid)
		return c.end
	}
}

func sigName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return sig.String()
}

// track starts following the tenure with this fence, from the lease's own
// view of it.
func (x *execer) track(fence int64) {
	st := x.l.State()
	x.mu.Lock()
	defer x.mu.Unlock()
	if st.Fence != fence {
		return
	}
	x.fence, x.deadline = fence, st.Deadline
	if !st.Leader {
		x.deadline = time.Now() // over already
	}
}

// runLong is Run's function: COMMAND runs while this replica leads.
func (x *execer) runLong(ctx context.Context, fence int64) error {
	x.track(fence)
	for {
		c, err := x.start(fence, nil, 0)
		if err != nil {
			return err
		}
		x.logf(slog.LevelInfo, "started COMMAND (pid %d) with fence %d", c.pid, fence)
		st := status(x.s.job, x.wait(ctx, fence, c))
		how := "exited with status 0"
		if st != nil {
			how = st.why
		}
		x.logf(slog.LevelInfo, "COMMAND (pid %d) %s", c.pid, how)
		switch {
		case x.quit.Err() != nil:
			// A shutdown: ddblease exec exits with COMMAND's status.
			if st == nil {
				return nil
			}
			return st
		case ctx.Err() != nil:
			return nil // the tenure ended: campaign again
		case x.s.f.restart:
			t := time.NewTimer(x.s.f.retry)
			select {
			case <-t.C:
				continue
			case <-ctx.Done(): // a shutdown or a lost tenure, with no child
				t.Stop()
				return nil
			}
		}
		// Exited on its own: Run resigns, and ddblease exec exits with
		// its status.
		if st == nil {
			return nil
		}
		return st
	}
}

// tailBytes is how much of a scheduled COMMAND's stderr a failed run's
// error text keeps.
const tailBytes = 1024

// runSlot is RunSchedule's function: COMMAND runs once for the slot.
func (x *execer) runSlot(ctx context.Context, run *ddblease.JobRun) error {
	x.track(run.Fence())
	c, err := x.start(run.Fence(), run, tailBytes)
	if err != nil {
		return err
	}
	st := status(x.s.job, x.wait(ctx, run.Fence(), c))
	if st == nil {
		return nil
	}
	msg := strings.TrimPrefix(st.why, "was ")
	if t := strings.TrimSpace(c.tail()); t != "" {
		msg += "; stderr: " + t
	}
	return errors.New(msg) // logged by RunSchedule, and recorded in the run
}
