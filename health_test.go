package ddblease_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// probe GETs h and returns the status and the body.
func probe(t *testing.T, h http.Handler) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	body, err := io.ReadAll(rec.Result().Body)
	require.NoError(t, err)
	return rec.Code, string(body)
}

// untilUnhealthy probes h until it answers 503 and returns that body.
func untilUnhealthy(t *testing.T, h http.Handler) string {
	t.Helper()
	var last string
	require.Eventually(t, func() bool {
		var code int
		code, last = probe(t, h)
		return code == http.StatusServiceUnavailable
	}, 30*time.Second, 10*time.Millisecond)
	t.Log(last)
	return last
}

func TestHealthLeaderWithBlackHoledHeartbeats(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	l := newLease(t, srv.Client(faults.Wrap), table, "report", fast("a"), func(o *ddblease.Options) {
		o.LeaseDuration = 6 * time.Second // the leader is overdue 0.8s after a missed renewal, and loses 4.9s later
		o.HeartbeatInterval = time.Second
		o.CallTimeout = 300 * time.Millisecond
	})
	h := ddblease.HealthHandler(300*time.Millisecond, l)
	runLease(t, l)
	require.Eventually(t, l.IsLeader, 20*time.Second, 10*time.Millisecond)
	code, body := probe(t, h)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "ok\n", body)

	faults.Fail("UpdateItem", ddbtest.Blackhole, -1) // heartbeats go unanswered until CallTimeout
	last := untilUnhealthy(t, h)
	assert.True(t, l.IsLeader(), "the check failed only after the tenure ended: %s", last)
	assert.Contains(t, last, `job "report": leading, but the lease was last renewed`)
	assert.Contains(t, last, "renewals overdue by")
	assert.Equal(t, 1, strings.Count(last, "\n"), "not one line: %q", last)
	require.ErrorIs(t, l.CheckHealth(300*time.Millisecond), ddblease.ErrUnhealthy)

	// The network heals: the leader renews (or, past its deadline, takes the
	// lease back), and the check passes again.
	faults.Clear()
	require.Eventually(t, func() bool { return l.CheckHealth(300*time.Millisecond) == nil && l.IsLeader() },
		30*time.Second, 10*time.Millisecond)
}

func TestHealthStandbyStaysHealthy(t *testing.T) {
	t.Parallel()
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "report", fast("a"))
	faults := ddbtest.NewFaults(nil)
	b := newLease(t, srv.Client(faults.Wrap), table, "report", fast("b"))
	// A second of tolerance: a loaded machine may delay a heartbeat or a
	// poll by a few hundred milliseconds, and that is no reason to restart.
	h := ddblease.HealthHandler(time.Second, a, b)
	runLease(t, a)
	require.Eventually(t, a.IsLeader, 20*time.Second, 10*time.Millisecond)
	runLease(t, b)
	// Over several heartbeats and dozens of polls, neither the leader nor
	// the standby is ever reported.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(25 * time.Millisecond) {
		code, body := probe(t, h)
		require.Equal(t, http.StatusOK, code, body)
	}
	assert.True(t, a.IsLeader())
	assert.False(t, b.IsLeader())
	assert.NoError(t, b.CheckHealth(time.Second))

	// The standby's reads stop being answered: its campaign fails with the
	// same error, and it turns unhealthy; once they are answered again, it
	// is healthy again.
	faults.Fail("GetItem", ddbtest.Blackhole, -1)
	last := untilUnhealthy(t, h)
	assert.Contains(t, last, `job "report": acquire has failed for `)
	assert.NotContains(t, last, "leading")
	assert.NoError(t, a.CheckHealth(time.Second), "the leader")
	faults.Clear()
	require.Eventually(t, func() bool { return b.CheckHealth(time.Second) == nil }, 30*time.Second, 10*time.Millisecond)
	assert.True(t, a.IsLeader())
}

func TestHealthWrongKeySchema(t *testing.T) {
	t.Parallel()
	db := srv.Client(nil)
	table := srv.NewKeyTable(t, "id") // not "pk"
	l := newLease(t, db, table, "report", fast("a"))
	h := ddblease.HealthHandler(200*time.Millisecond, l)
	code, body := probe(t, h)
	require.Equal(t, http.StatusOK, code, "before any campaign: %s", body)

	stop := runLease(t, l)
	last := untilUnhealthy(t, h)
	assert.Contains(t, last, `ddblease: unhealthy: job "report": `)
	assert.Contains(t, last, "the campaign stopped with an error")
	assert.Contains(t, last, "wrong key schema")
	assert.Equal(t, 1, strings.Count(last, "\n"), "not one line: %q", last)
	// It stays unhealthy: nothing the campaign does cures it.
	time.Sleep(300 * time.Millisecond)
	code, _ = probe(t, h)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	_ = stop()
}

func TestHealthToleranceValidation(t *testing.T) {
	l := newLease(t, srv.Client(nil), "some-table", "report", fast("a"))
	assert.ErrorIs(t, l.CheckHealth(-time.Second), ddblease.ErrInvalid)
	assert.NoError(t, l.CheckHealth(0), "a handle that never campaigned")
	code, body := probe(t, ddblease.HealthHandler(-time.Second, l))
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "negative")
}

// A job that fails every slot is reported once Options.Health.FailedRuns
// runs in a row failed, and healthy again once one succeeds; without it,
// its failures are not judged.
func TestHealthFailedRuns(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	judged := newLease(t, db, table, "report", fast("a"), func(o *ddblease.Options) { o.Health.FailedRuns = 3 })
	unjudged := newLease(t, db, table, "sweep", fast("a"))
	var failing atomic.Bool
	failing.Store(true)
	var failed atomic.Int32
	fn := func(ctx context.Context, run *ddblease.JobRun) error {
		if failing.Load() {
			failed.Add(1)
			return errors.New("the billing API answered 503")
		}
		return nil
	}
	stopJudged := runScheduleAsync(ctx, judged, ddblease.Every(100*time.Millisecond), fn)
	defer func() { assert.NoError(t, stopJudged()) }()
	stopUnjudged := runScheduleAsync(ctx, unjudged, ddblease.Every(100*time.Millisecond), fn)
	defer func() { assert.NoError(t, stopUnjudged()) }()

	h := ddblease.HealthHandler(0, judged)
	last := untilUnhealthy(t, h)
	assert.True(t, judged.IsLeader(), "the check failed because the tenure ended: %s", last)
	assert.Regexp(t, `^ddblease: unhealthy: job "report": its last [0-9]+ runs failed \(the latest .* ago\): the billing API answered 503\n$`, last)
	assert.GreaterOrEqual(t, failed.Load(), int32(3))
	assert.NoError(t, unjudged.CheckHealth(0), "failed runs are judged only when asked for")

	failing.Store(false)
	require.Eventually(t, func() bool { code, _ := probe(t, h); return code == http.StatusOK }, 30*time.Second, 10*time.Millisecond)
	assert.NoError(t, judged.CheckHealth(0))

	_, err := ddblease.New(db, table, "report", func(o *ddblease.Options) { o.Health.FailedRuns = -1 })
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
}
