package ddblease_test

import (
	"bytes"
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// libraryGoroutines counts the goroutines parked in the library's code,
// other than those running a leader function (whose stacks hold marker)
// and those of tests (paused parallel tests among them).
func libraryGoroutines(marker string) (n int, stacks string) {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("github.com/ddblease/ddblease.")) && !bytes.Contains(g, []byte(marker)) &&
			!bytes.Contains(g, []byte("testing.tRunner")) {
			n++
			stacks += string(g) + "\n\n"
		}
	}
	return n, stacks
}

// A held lease costs the goroutine running fn and nothing else: renewals
// run on timers, and no goroutine of the library waits beside fn while
// the leases are held (a renewal in flight has one for its request). It
// runs alone (not in parallel), so that no other test's leases renew
// meanwhile.
func TestHeldLeasesCostOnlyTheLeaderGoroutine(t *testing.T) {
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	const n = 20
	var leading atomic.Int32
	var wg sync.WaitGroup
	rctx, cancel := context.WithCancel(ctx)
	for i := range n {
		l := newLease(t, db, table, "job-"+string(rune('a'+i)), fast("a"), func(o *ddblease.Options) {
			o.LeaseDuration, o.HeartbeatInterval = 10*time.Second, 3*time.Second
		})
		wg.Go(func() {
			assert.NoError(t, l.Run(rctx, heldLeaderFn(&leading)))
		})
	}
	eventually(t, "every lease led", func() bool { return leading.Load() == n })
	// Between renewals no goroutine of the library but the leaders' waits;
	// sampled a few times, as one may catch a renewal in flight.
	least, stacks := -1, ""
	for range 10 {
		if g, s := libraryGoroutines("heldLeaderFn"); least < 0 || g < least {
			least, stacks = g, s
		}
		time.Sleep(100 * time.Millisecond)
	}
	assert.Zero(t, least, "goroutines of the library beside the %d leaders:\n%s", n, stacks)
	cancel()
	wg.Wait()
}

// heldLeaderFn is a leader function that counts the leaders and waits
// for its context to end.
func heldLeaderFn(leading *atomic.Int32) func(context.Context, int64) error {
	return func(ctx context.Context, _ int64) error {
		leading.Add(1)
		<-ctx.Done()
		return nil
	}
}

// A leader whose function returns at once on shutdown is handed over by one
// write, the resignation: the drain mark is written only when fn still runs
// a RetryInterval after the drain began (a standby polls that often).
func TestShutdownHandsOverWithOneWrite(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		drain  time.Duration // how long fn runs after its context ends
		writes int
		marked bool
	}{
		{"fn returns at once", 0, 1, false},
		{"fn drains for several polls", 6 * 50 * time.Millisecond, 2, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := withTimeout(t, 20*time.Second)
			table, db := tableAndClient(t)
			var writes leaseWrites
			a := newLease(t, db, table, "job", fast("a"), func(o *ddblease.Options) {
				o.LeaseDuration, o.HeartbeatInterval = 20*time.Second, 6*time.Second
				o.Observer = writes.observe
			})
			started := make(chan struct{})
			var sawDraining atomic.Bool
			stop := runAsync(ctx, a, func(lctx context.Context, _ int64) error {
				close(started)
				<-lctx.Done()
				for end := time.Now().Add(c.drain); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
					if rec, err := a.Holder(ctx); err == nil && rec.Draining {
						sawDraining.Store(true)
					}
				}
				return nil
			})
			receive(t, started, "leadership")
			writes.start()
			require.NoError(t, stop())
			assert.Equal(t, c.writes, writes.stop(), "writes to the lease item from shutdown to Run's return")
			assert.Equal(t, c.marked, sawDraining.Load(), "the lease marked draining while fn ran")
			rec, err := a.Holder(ctx)
			require.NoError(t, err)
			assert.True(t, rec.ExpiresAt.IsZero(), "resigned")
		})
	}
}

// A renewal that falls due while fn is being stopped, before a drain mark
// is asked for, is put off: fn is about to return, and the resignation
// that follows hands the lease over by one write. At shutdown thousands of
// leases would otherwise each renew while their resignations queue.
func TestShutdownPutsOffARenewalDueAsFnReturns(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	const hb = time.Second
	var writes leaseWrites
	renewed := make(chan time.Time, 16)
	a := newLease(t, db, table, "job", fast("a"), func(o *ddblease.Options) {
		o.LeaseDuration, o.HeartbeatInterval = 6*time.Second, hb
		o.RetryInterval, o.DrainTimeout = 800*time.Millisecond, 5*time.Second
		o.Observer = func(e ddblease.Event) {
			if e.Kind == ddblease.EventRenewed {
				select {
				case renewed <- time.Now():
				default:
				}
			}
			writes.observe(e)
		}
	})
	var sawDraining atomic.Bool
	stop := runAsync(ctx, a, func(lctx context.Context, _ int64) error {
		<-lctx.Done()
		// Returns after the next renewal falls due, well before the
		// drain mark (a RetryInterval after the drain began).
		for end := time.Now().Add(400 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if rec, err := a.Holder(ctx); err == nil && rec.Draining {
				sawDraining.Store(true)
			}
		}
		return nil
	})
	// Stop 150 ms before the renewal after the first one falls due.
	last := receive(t, renewed, "a renewal")
	time.Sleep(time.Until(last.Add(hb - 150*time.Millisecond)))
	writes.start()
	require.NoError(t, stop())
	assert.Equal(t, 1, writes.stop(), "writes to the lease item from shutdown to Run's return (the resignation alone)")
	assert.False(t, sawDraining.Load(), "the lease marked draining while fn ran")
	rec, err := a.Holder(ctx)
	require.NoError(t, err)
	assert.True(t, rec.ExpiresAt.IsZero(), "resigned")
}

// leaseWrites counts a lease's writes (UpdateItem calls) between start and
// stop; observe is its Options.Observer.
type leaseWrites struct {
	mu sync.Mutex
	on bool
	n  int
}

func (w *leaseWrites) observe(e ddblease.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.on && e.Kind == ddblease.EventCall && e.Op == "UpdateItem" {
		w.n++
	}
}

func (w *leaseWrites) start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.on = true
}

// stop ends the count and returns it.
func (w *leaseWrites) stop() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.on = false
	return w.n
}
