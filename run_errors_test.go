package ddblease_test

// Leadership as a user sees it (what Run returns and logs when the table
// keeps failing, or fn returns a typed nil error): each test is the
// regression test of a defect where the library's own idea of its tenure
// and what a user observed disagreed (see tenure_test.go).

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Defect 9: errors that retrying cannot mend stop Run at once and name the
// table; a campaign that ends while failing says so; an ended context is
// not a clean shutdown.
func TestRunReportsPersistentErrors(t *testing.T) {
	t.Parallel()
	never := func(context.Context, int64) error {
		t.Error("fn called")
		return nil
	}
	t.Run("wrong key schema", func(t *testing.T) {
		t.Parallel()
		ctx := withTimeout(t, 20*time.Second)
		name := "ddblease-badkey-" + ddbtest.RandomID()
		db := srv.Client(nil)
		require.NoError(t, ddbtest.CreateRawTable(ctx, db, name, "id", types.ScalarAttributeTypeS))
		var warns countingHandler
		l := newLease(t, db, name, "job", fast("a"), func(o *ddblease.Options) { o.Logger = slog.New(&warns) })
		err := l.Run(ctx, never)
		require.Error(t, err)
		assert.ErrorIs(t, err, ddblease.ErrTableSchema)
		assert.ErrorContains(t, err, name)
		assert.ErrorContains(t, err, `partition key "pk"`)
		assert.Zero(t, warns.warnings.Load(), "a permanent error is not retried")
	})
	t.Run("missing table", func(t *testing.T) {
		t.Parallel()
		ctx := withTimeout(t, 20*time.Second)
		var logged countingHandler
		l := newLease(t, srv.Client(nil), "ddblease-missing-"+ddbtest.RandomID(), "job", fast("a"),
			func(o *ddblease.Options) { o.Logger = slog.New(&logged) })
		err := l.Run(ctx, never)
		require.Error(t, err)
		assert.ErrorContains(t, err, "not found")
		assert.ErrorContains(t, err, "ddblease-missing-")
		// Returned, not also logged: the caller decides.
		assert.Zero(t, logged.errors.Load(), "the error Run returns is logged at ERROR too")
		assert.Zero(t, logged.warnings.Load())
	})
	t.Run("malformed lease item", func(t *testing.T) {
		t.Parallel()
		ctx := withTimeout(t, 20*time.Second)
		table, db := tableAndClient(t)
		_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: withKey("lease#job", map[string]types.AttributeValue{
			"owner": &types.AttributeValueMemberS{Value: "x"},
			"fence": &types.AttributeValueMemberS{Value: "not a number"},
		})})
		require.NoError(t, err)
		err = newLease(t, db, table, "job", fast("a")).Run(ctx, never)
		assert.ErrorIs(t, err, ddblease.ErrMalformedItem)
		assert.ErrorContains(t, err, table)
	})
	t.Run("cancelled context", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		l := newLease(t, srv.Client(nil), srv.NewTable(t), "job", fast("a"))
		assert.ErrorIs(t, l.Run(ctx, never), context.Canceled)
		err := l.RunSchedule(ctx, ddblease.Every(time.Second), func(context.Context, *ddblease.JobRun) error { return nil })
		assert.ErrorIs(t, err, context.Canceled)
	})
	t.Run("unreachable endpoint", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		var warns countingHandler
		l := newLease(t, ddbtest.Endpoint("http://127.0.0.1:1").Client(nil), "ddblease-nowhere", "job", fast("a"),
			func(o *ddblease.Options) { o.Logger = slog.New(&warns) })
		err := l.Run(ctx, never)
		require.Error(t, err)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "127.0.0.1:1")
		// About 30 attempts failed; their warnings are rate-limited.
		assert.LessOrEqual(t, warns.warnings.Load(), int32(2))
	})
}

// countingHandler counts the warnings and errors logged through it.
type countingHandler struct{ warnings, errors atomic.Int32 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	switch {
	case r.Level >= slog.LevelError:
		h.errors.Add(1)
	case r.Level >= slog.LevelWarn:
		h.warnings.Add(1)
	}
	return nil
}

func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *countingHandler) WithGroup(string) slog.Handler { return h }

// nilErr has a value receiver: calling Error on a nil *nilErr panics.
type nilErr struct{ msg string }

func (e nilErr) Error() string { return e.msg }

// Defect 10: a typed nil returned as an error never panics the library.
func TestTypedNilError(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	a := newLease(t, srv.Client(nil), table, "job", fast("a"))
	err := a.Run(ctx, func(context.Context, int64) error {
		var e *nilErr
		return e
	})
	require.Error(t, err)
	assert.ErrorContains(t, err, "nil *ddblease_test.nilErr")
	_, err = a.TryAcquire(ctx)
	require.NoError(t, err)
	run, err := a.Claim(ctx, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	var e *nilErr
	require.NoError(t, run.Finish(ctx, e))
	runs, err := a.ListRuns(ctx, ddblease.Every(time.Hour), run.Slot(), run.Slot())
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunFailed, runs[0].Status)
}
