package leakcheck_test

import (
	"strings"
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
