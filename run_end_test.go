package ddblease_test

// How a tenure ends as a user sees it when fn hands the end back (returns
// the leader context's cause) or leaves without returning (runtime.Goexit):
// the campaign goes on after a loss or an operator's request, a clean
// shutdown is nil, and no tenure outlives fn.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// causeReturner leads until its context ends and returns context.Cause,
// as the docs teach; it records each tenure it was given.
type causeReturner struct {
	mu     sync.Mutex
	causes []error
	starts chan int64
}

func newCauseReturner() *causeReturner { return &causeReturner{starts: make(chan int64, 16)} }

func (c *causeReturner) fn(ctx context.Context, fence int64) error {
	c.starts <- fence
	<-ctx.Done()
	c.mu.Lock()
	c.causes = append(c.causes, context.Cause(ctx))
	c.mu.Unlock()
	return context.Cause(ctx)
}

func (c *causeReturner) last() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.causes) == 0 {
		return nil
	}
	return c.causes[len(c.causes)-1]
}

// nextTenure returns the fence of the next tenure either replica begins.
func nextTenure(t *testing.T, a, b *causeReturner) int64 {
	t.Helper()
	select {
	case f := <-a.starts:
		return f
	case f := <-b.starts:
		return f
	case <-time.After(15 * time.Second):
		t.Fatal("no replica leads")
		return 0
	}
}

// runWithCause runs l.Run(fn) until stop(cause), which cancels Run's
// context with cause and returns what Run returned.
func runWithCause(ctx context.Context, l *ddblease.Lease, fn func(context.Context, int64) error) (stop func(error) error) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, fn) }()
	var once sync.Once
	var err error
	return func(cause error) error {
		once.Do(func() { cancel(cause); err = <-done })
		return err
	}
}

// Two replicas whose fn returns context.Cause(ctx) go on campaigning
// after an operator's resign request, after a Resign on the handle (a
// loss) and after a forced release: the lease keeps finding a candidate.
// A shutdown with a caller's cause after a clean drain returns nil.
func TestFnReturningItsCauseCampaignsOn(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	a := newLease(t, db, table, "job", fast("a"))
	b := newLease(t, db, table, "job", fast("b"))
	ac, bc := newCauseReturner(), newCauseReturner()
	stopA := runWithCause(ctx, a, ac.fn)
	t.Cleanup(func() { _ = stopA(nil) })
	require.Equal(t, int64(1), receive(t, ac.starts, "a leads"))
	stopB := runWithCause(ctx, b, bc.fn)
	t.Cleanup(func() { _ = stopB(nil) })

	// Two routine resign requests: the lease goes to b, then back to a.
	_, err := admin.RequestResign(ctx, "job", 1)
	require.NoError(t, err)
	require.Equal(t, int64(2), receive(t, bc.starts, "b leads after a's resign request"))
	assert.ErrorIs(t, ac.last(), ddblease.ErrResignRequested)
	_, err = admin.RequestResign(ctx, "job", 2)
	require.NoError(t, err)
	require.Equal(t, int64(3), receive(t, ac.starts, "a leads again after b's resign request"))
	assert.ErrorIs(t, bc.last(), ddblease.ErrResignRequested)

	// A loss: Resign on a's handle while Run leads. b may still be leaving
	// the lease to others after its resign request, so either replica may
	// take the next tenure.
	require.NoError(t, a.Resign(ctx))
	assert.Equal(t, int64(4), nextTenure(t, ac, bc), "a replica leads after a's loss")
	assert.ErrorIs(t, ac.last(), ddblease.ErrLost)

	// A forced release of tenure 4: the fence is raised to 5, and the next
	// tenure is 6, whichever replica takes it.
	holder, err := a.Holder(ctx)
	require.NoError(t, err)
	released := ac
	if holder.Owner == "b" {
		released = bc
	}
	_, err = admin.ForceRelease(ctx, "job", 4)
	require.NoError(t, err)
	assert.Equal(t, int64(6), nextTenure(t, ac, bc), "a replica leads after the forced release")
	eventually(t, "the released fn sees its loss", func() bool { return errors.Is(released.last(), ddblease.ErrLost) })

	// Shutdown with a cause: fn hands back the leader context's cause,
	// the drain is clean and the lease resigned: nil, from both.
	deploy := errors.New("rolling deploy")
	assert.NoError(t, stopA(deploy))
	assert.NoError(t, stopB(deploy))
	rec, err := a.Holder(ctx)
	require.NoError(t, err)
	assert.True(t, rec.ExpiresAt.IsZero(), "the last holder resigned")
}

// The rule is the same for an fn that returns the caller's cause, or an
// error wrapping the leader context's cause, on shutdown; an error of fn's
// own is still returned.
func TestShutdownWithCauseReturnsFnsOwnErrorOnly(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	deploy := errors.New("rolling deploy")
	own := errors.New("export incomplete")
	for _, c := range []struct {
		name string
		ret  func(ctx context.Context) error
		want error
	}{
		{"the leader context's cause", func(ctx context.Context) error { return context.Cause(ctx) }, nil},
		{"wrapping the cause", func(ctx context.Context) error { return errors.Join(errors.New("stopped"), context.Cause(ctx)) }, nil},
		{"the caller's cause", func(context.Context) error { return deploy }, nil},
		{"ctx.Err()", func(ctx context.Context) error { return ctx.Err() }, nil},
		{"an error of its own", func(context.Context) error { return own }, own},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLease(t, db, table, "job-"+c.name, fast("a"))
			started := make(chan int64, 1)
			stop := runWithCause(ctx, l, func(ctx context.Context, fence int64) error {
				started <- fence
				<-ctx.Done()
				return c.ret(ctx)
			})
			receive(t, started, "leads")
			err := stop(deploy)
			if c.want == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, c.want)
			}
			rec, err := l.Holder(ctx)
			require.NoError(t, err)
			assert.True(t, rec.ExpiresAt.IsZero(), "resigned")
		})
	}
}

// RunSchedule goes through the same rule: a shutdown with a cause is nil,
// and the campaign goes on after a resign request.
func TestRunScheduleShutdownWithCause(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	a := newLease(t, db, table, "job", fast("a"))
	cctx, cancel := context.WithCancelCause(ctx)
	done := make(chan error, 1)
	go func() {
		done <- a.RunSchedule(cctx, farSchedule, func(ctx context.Context, _ *ddblease.JobRun) error { return context.Cause(ctx) })
	}()
	eventually(t, "a leads", a.IsLeader)
	_, err := admin.RequestResign(ctx, "job", 1)
	require.NoError(t, err)
	// A lone replica takes the lease back after a lease duration.
	eventually(t, "a leads again", func() bool { return a.State().Fence == 2 && a.IsLeader() })
	cancel(errors.New("rolling deploy"))
	assert.NoError(t, receive(t, done, "RunSchedule returns"))
}

// runtime.Goexit in fn (t.FailNow, require in a test) ends the tenure and
// resigns, as a panic does: IsLeader is false once Run has unwound, the
// leader context is over, and a standby takes the lease at once.
func TestGoexitInFnEndsTenure(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"))
	b := newLease(t, db, table, "job", fast("b"))
	var fnCtx context.Context
	done := make(chan struct{})
	returned := false
	go func() {
		defer close(done)
		_ = a.Run(ctx, func(ctx context.Context, _ int64) error {
			fnCtx = ctx
			runtime.Goexit()
			return nil
		})
		returned = true
	}()
	<-done
	assert.False(t, returned, "Run does not return: the goroutine unwinds")
	assert.False(t, a.IsLeader(), "IsLeader after fn exited")
	require.NotNil(t, fnCtx)
	assert.ErrorIs(t, context.Cause(fnCtx), ddblease.ErrLost)
	fence, err := b.TryAcquire(ctx)
	require.NoError(t, err, "the lease was resigned")
	assert.Equal(t, int64(2), fence)
	require.NoError(t, b.Resign(ctx))

	// RunSchedule: the run is recorded as failed, and the handle can
	// campaign again.
	sched := ddblease.Every(100 * time.Millisecond)
	var slot time.Time
	done = make(chan struct{})
	go func() {
		defer close(done)
		_ = a.RunSchedule(ctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
			slot = run.Slot()
			runtime.Goexit()
			return nil
		})
	}()
	<-done
	assert.False(t, a.IsLeader())
	runs, err := a.ListRuns(ctx, sched, slot, slot)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunFailed, runs[0].Status)
	assert.Contains(t, runs[0].Error, "runtime.Goexit")
	fence, err = b.TryAcquire(ctx)
	require.NoError(t, err, "the lease was resigned")
	assert.Equal(t, int64(4), fence)
}

// An fn that stops on Run's own context (captured from the caller, as a
// job written against a process-wide context does) and returns ctx.Err()
// is as clean a shutdown as one that stops on its leader context: Run
// returns nil, however the wake-ups of fn and of Run's shutdown are
// ordered. Many shutdowns, for the race between the two.
func TestShutdownSeenFirstByFnIsClean(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	for i := range 30 {
		l := newLease(t, db, table, fmt.Sprintf("job-%d", i), fast("a"))
		rctx, cancel := context.WithCancel(ctx)
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- l.Run(rctx, func(context.Context, int64) error {
				close(started)
				<-rctx.Done()
				return rctx.Err()
			})
		}()
		select {
		case <-started:
		case err := <-done:
			cancel()
			t.Fatalf("Run returned before leading: %v", err)
		}
		cancel()
		require.NoError(t, <-done, "shutdown %d", i)
	}
}
