package leakcheck_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddblease/ddblease/internal/leakcheck"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

//go:noinline
func blockedOn(ch chan struct{}) { <-ch }

func TestFindsALeakAndItsEnd(t *testing.T) {
	require.NoError(t, leakcheck.Find(5*time.Second), "nothing runs before the test starts one")

	ch := make(chan struct{})
	go blockedOn(ch)
	err := leakcheck.Find(50 * time.Millisecond)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "leakcheck_test.blockedOn")
	assert.Contains(t, err.Error(), "1 goroutine(s) still running")

	// A goroutine that exits within the timeout is not a leak.
	go func() {
		time.Sleep(100 * time.Millisecond)
		close(ch)
	}()
	assert.NoError(t, leakcheck.Find(5*time.Second))
}

func TestIgnoresTestingsOwn(t *testing.T) {
	t.Run("parallel", func(t *testing.T) {
		t.Parallel()
		for _, s := range leakcheck.Running() {
			assert.False(t, strings.Contains(s, "testing.tRunner"), "reported testing's goroutine:\n%s", s)
		}
	})
}

//go:noinline
func workingFor(stop chan struct{}) { <-stop }

// A settle (closing a client's idle connections) ends what it can over
// the first half of the timeout; what starts again after that still shows.
func TestSettleEndsWhatWindsDownOnly(t *testing.T) {
	ch := make(chan struct{})
	go blockedOn(ch)
	var once sync.Once
	assert.NoError(t, leakcheck.Find(time.Second, func() { once.Do(func() { close(ch) }) }),
		"a goroutine the settle ends is not a leak")

	// A timer chain that starts a worker every 10 ms, which the settle
	// stops: over the second half no settle runs, and a worker is found.
	var mu sync.Mutex
	stop, quit := make(chan struct{}), make(chan struct{})
	var spawn func()
	spawn = func() {
		mu.Lock()
		defer mu.Unlock()
		select {
		case <-quit:
			return
		default:
		}
		go workingFor(stop)
		time.AfterFunc(10*time.Millisecond, spawn)
	}
	spawn()
	settle := func() {
		mu.Lock()
		defer mu.Unlock()
		close(stop)
		stop = make(chan struct{})
	}
	err := leakcheck.Find(400*time.Millisecond, settle)
	mu.Lock()
	close(quit)
	close(stop)
	mu.Unlock()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "leakcheck_test.workingFor")
	assert.NoError(t, leakcheck.Find(5*time.Second))
}
