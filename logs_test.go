package ddblease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// logRecord is one record a logCapture received, its attributes resolved
// and flattened (groups as "group.key").
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// line renders the record as a text handler would, for failure messages.
func (r logRecord) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q", r.level, r.msg)
	for k, v := range r.attrs {
		fmt.Fprintf(&b, " %s=%q", k, v)
	}
	return b.String()
}

// logCapture is a slog.Handler that keeps every record, at every level.
type logCapture struct {
	mu      *sync.Mutex
	records *[]logRecord
	attrs   []slog.Attr
	group   string
}

func newLogCapture() *logCapture {
	return &logCapture{mu: new(sync.Mutex), records: new([]logRecord)}
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	var add func(prefix string, a slog.Attr)
	add = func(prefix string, a slog.Attr) {
		v := a.Value.Resolve()
		if v.Kind() == slog.KindGroup {
			for _, g := range v.Group() {
				add(prefix+a.Key+".", g)
			}
			return
		}
		rec.attrs[prefix+a.Key] = v.String()
	}
	for _, a := range c.attrs {
		add("", a)
	}
	prefix := ""
	if c.group != "" {
		prefix = c.group + "."
	}
	r.Attrs(func(a slog.Attr) bool { add(prefix, a); return true })
	c.mu.Lock()
	*c.records = append(*c.records, rec)
	c.mu.Unlock()
	return nil
}

func (c *logCapture) WithAttrs(as []slog.Attr) slog.Handler {
	d := *c
	d.attrs = append(append([]slog.Attr(nil), c.attrs...), as...)
	return &d
}

func (c *logCapture) WithGroup(name string) slog.Handler {
	d := *c
	d.group = name
	if c.group != "" {
		d.group = c.group + "." + name
	}
	return &d
}

func (c *logCapture) all() []logRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]logRecord(nil), *c.records...)
}

// about returns the records at level or above about the run of slot.
func (c *logCapture) about(slot string, level slog.Level) []logRecord {
	var out []logRecord
	for _, r := range c.all() {
		if r.level >= level && (strings.HasPrefix(r.attrs["slot"], slot) || strings.HasPrefix(r.attrs["run"], slot)) {
			out = append(out, r)
		}
	}
	return out
}

// checkLines checks what every record must be: one line, each attribute
// value without a newline, and no retry wording of the SDK's that does not
// say what happened.
func checkLines(t *testing.T, c *logCapture) {
	t.Helper()
	for _, r := range c.all() {
		assert.NotContains(t, r.msg, "\n", r.line())
		for k, v := range r.attrs {
			assert.NotContains(t, v, "\n", "attribute %s: %s", k, r.line())
			assert.NotContains(t, v, "exceeded maximum number of attempts", "attribute %s: %s", k, r.line())
		}
	}
}

func lines(rs []logRecord) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.line())
	}
	return strings.Join(s, "\n")
}

// The library's log lines, as an operator reads them: a slot skipped by an
// operator's pause is one Info line and nothing at Warn; a failed run is
// one Warn line, whatever its error holds (newlines, a panic's stack); a
// heartbeat that fails says what happened, not the SDK's retry count;
// every record is one line.
func TestLogLines(t *testing.T) {
	t.Parallel()

	// logged runs RunSchedule on one slot, calls during once it leads and
	// returns the log and the slot's text. during gets the log so far.
	logged := func(t *testing.T, db ddblease.DynamoDBAPI, table string, fn func(context.Context, *ddblease.JobRun) error,
		during func(l *ddblease.Lease, logs *logCapture)) (*logCapture, string) {
		t.Helper()
		ctx := withTimeout(t, 30*time.Second)
		logs := newLogCapture()
		l := newLease(t, db, table, "billing", fast("a"), func(o *ddblease.Options) { o.Logger = slog.New(logs) })
		slot := time.Now().Add(1500 * time.Millisecond).Truncate(time.Second).Add(time.Second).UTC()
		done := make(chan struct{})
		finished := make(chan struct{}, 1)
		wrapped := func(ctx context.Context, run *ddblease.JobRun) error {
			defer func() { finished <- struct{}{} }()
			return fn(ctx, run)
		}
		var runErr error
		rctx, cancel := context.WithCancel(ctx)
		go func() {
			defer close(done)
			defer func() {
				if p := recover(); p != nil {
					runErr = fmt.Errorf("RunSchedule panicked: %v", p)
				}
			}()
			runErr = l.RunSchedule(rctx, oneSlot(slot), wrapped)
		}()
		eventually(t, "a leads", l.IsLeader)
		if during != nil {
			during(l, logs)
		}
		// Wait for the slot to be recorded, then stop.
		admin := newAdmin(t, srv.Client(nil), table)
		eventually(t, "the slot is recorded", func() bool {
			runs, err := admin.Runs(ctx, "billing", ddblease.RunRange{})
			return err == nil && len(runs) == 1 && runs[0].Status != ddblease.RunRunning
		})
		cancel()
		<-done
		_ = runErr // the panicked run's RunSchedule panics, after the run is recorded
		return logs, slot.Format(time.RFC3339)
	}

	t.Run("paused slot", func(t *testing.T) {
		t.Parallel()
		table, db := tableAndClient(t)
		logs, slot := logged(t, db, table, func(context.Context, *ddblease.JobRun) error {
			t.Error("a paused slot ran")
			return nil
		}, func(*ddblease.Lease, *logCapture) {
			_, err := newAdmin(t, db, table).Pause(context.Background(), "billing")
			require.NoError(t, err)
		})
		checkLines(t, logs)
		assert.Empty(t, lines(logs.about(slot, slog.LevelWarn)), "nothing at Warn for a slot the operator chose to skip")
		assert.Len(t, logs.about(slot, slog.LevelInfo), 1, "one Info line for the skipped slot:\n%s", lines(logs.about(slot, slog.LevelDebug)))
	})

	t.Run("failed run", func(t *testing.T) {
		t.Parallel()
		table, db := tableAndClient(t)
		logs, slot := logged(t, db, table, func(context.Context, *ddblease.JobRun) error {
			return errors.New("card declined\ncustomer 42\n\tretry tomorrow")
		}, nil)
		checkLines(t, logs)
		warn := logs.about(slot, slog.LevelWarn)
		require.Len(t, warn, 1, "one Warn line per failed run:\n%s", lines(warn))
		assert.Contains(t, warn[0].attrs["err"], "card declined | customer 42 | retry tomorrow")
	})

	t.Run("panicked run", func(t *testing.T) {
		t.Parallel()
		table, db := tableAndClient(t)
		logs, slot := logged(t, db, table, func(context.Context, *ddblease.JobRun) error {
			panic("boom")
		}, nil)
		checkLines(t, logs)
		warn := logs.about(slot, slog.LevelWarn)
		require.Len(t, warn, 1, "one Warn line per failed run:\n%s", lines(warn))
		assert.Contains(t, warn[0].attrs["err"], "panicked: boom")
	})

	t.Run("failing heartbeats", func(t *testing.T) {
		t.Parallel()
		table := srv.NewTable(t)
		faults := ddbtest.NewFaults(nil)
		db := srv.Client(faults.Wrap)
		logs, _ := logged(t, db, table, func(context.Context, *ddblease.JobRun) error { return nil }, func(_ *ddblease.Lease, logs *logCapture) {
			// Heartbeats are the lease's UpdateItems while it waits for
			// the slot: fail two of them. The first acquisition's own
			// UpdateItem (marking the job listed) is sent before the first
			// heartbeat, which is awaited first.
			eventually(t, "a first heartbeat", func() bool {
				for _, r := range logs.all() {
					if r.msg == "ddblease: renewed the lease" {
						return true
					}
				}
				return false
			})
			faults.Fail("UpdateItem", ddbtest.ServerError, 2)
			eventually(t, "two heartbeats fail", func() bool { return faults.Faulted("UpdateItem") == 2 })
		})
		checkLines(t, logs)
		var retries []logRecord
		for _, r := range logs.all() {
			if r.attrs["step"] == "heartbeat" {
				retries = append(retries, r)
			}
		}
		require.NotEmpty(t, retries, "the failed heartbeats are logged:\n%s", lines(logs.all()))
		assert.Equal(t, slog.LevelWarn, retries[0].level)
		assert.Contains(t, retries[0].attrs["err"], "StatusCode: 500", "says what happened")
	})
}
