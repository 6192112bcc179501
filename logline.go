package ddblease

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	awsretry "github.com/aws/aws-sdk-go-v2/aws/retry"
)

// This file owns the library's log lines: their attributes, the trace ids
// of a context, and the limit on repeated warnings (warnLimiter).

// lineHandler is the handler behind every log line of a Lease: it passes
// records to the user's handler with each attribute value made one line,
// and errors worded by what happened. A user's fn may return an error with
// newlines (a panic's stack, a multi-line message), and the SDK words a
// request sent once as "exceeded maximum number of attempts, 1": a line
// per record, and words that say what failed, are what an operator's log
// search needs.
//
// It also puts the name of what logs (the job, or the pool) and the owner
// first in each record, as Logger.With would, but as the record is handled:
// With would have the user's handler clone itself, a few hundred bytes for
// each of the thousands of leases a process may hold. The library calls
// neither With nor WithGroup on such a logger.
type lineHandler struct {
	h                slog.Handler
	key, name, owner string // the first attributes of each record (key = name, owner); none if key is ""
}

// lineLogger returns a logger that writes through lineHandler to log's
// handler, each record beginning with key=name and owner.
func lineLogger(log *slog.Logger, key, name, owner string) *slog.Logger {
	return slog.New(lineHandler{h: log.Handler(), key: key, name: name, owner: owner})
}

func (h lineHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.h.Enabled(ctx, level)
}

func (h lineHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, singleLine(r.Message), r.PC)
	if h.key != "" {
		out.AddAttrs(lineAttr(slog.String(h.key, h.name)), lineAttr(slog.String("owner", h.owner)))
	}
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(lineAttr(a))
		return true
	})
	return h.h.Handle(ctx, out)
}

func (h lineHandler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = lineAttr(a)
	}
	h.h = h.h.WithAttrs(clean)
	return h
}

func (h lineHandler) WithGroup(name string) slog.Handler {
	h.h = h.h.WithGroup(name)
	return h
}

// lineAttr returns a with its value resolved and made one line: an error
// becomes its text (logText), a string its one-line form; groups are
// cleaned member by member. Other kinds cannot hold a newline.
func lineAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if s := v.String(); strings.ContainsAny(s, "\r\n") {
			return slog.String(a.Key, singleLine(s))
		}
	case slog.KindGroup:
		g := v.Group()
		clean := make([]slog.Attr, len(g))
		for i, m := range g {
			clean[i] = lineAttr(m)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(clean...)}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, logText(x))
		case fmt.Stringer:
			if s := x.String(); strings.ContainsAny(s, "\r\n") {
				return slog.String(a.Key, singleLine(s))
			}
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// logText is err's text for a log line: on one line, with the SDK's
// "exceeded maximum number of attempts, N, <error>" replaced by what
// happened (the last attempt's error, and the number of attempts when the
// SDK made more than one).
func logText(err error) string {
	err = soundError(err)
	s := err.Error()
	walkErrors(err, func(e error) {
		mae, ok := e.(*awsretry.MaxAttemptsError)
		if !ok || mae == nil {
			return
		}
		inner := "no error"
		if mae.Err != nil {
			inner = soundError(mae.Err).Error()
		}
		if mae.Attempt > 1 {
			inner = fmt.Sprintf("%s (the last of %d attempts)", inner, mae.Attempt)
		}
		s = strings.Replace(s, mae.Error(), inner, 1)
	})
	return singleLine(s)
}

// walkErrors calls fn on err and every error in its tree.
func walkErrors(err error, fn func(error)) {
	for depth := 0; err != nil && depth < 100; depth++ {
		fn(err)
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walkErrors(soundError(e), fn)
			}
			return
		case interface{ Unwrap() error }:
			err = soundError(u.Unwrap())
		default:
			return
		}
	}
}

// singleLine joins the lines of s with " | ", each trimmed of surrounding
// space, empty lines left out.
func singleLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	var parts []string
	for _, line := range strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }) {
		if line = strings.TrimSpace(line); line != "" {
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, " | ")
}

// warnLimiter rate-limits repeated warnings: one line per key every
// warnEvery, saying how many were left out.
type warnLimiter struct {
	mu   sync.Mutex
	last map[string]warnState
}

type warnState struct {
	at         time.Time
	suppressed int
}

const warnEvery = 30 * time.Second

// allow reports whether a warning with key may be logged at now, and how
// many were suppressed since the last one.
func (w *warnLimiter) allow(key string, now time.Time) (bool, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = make(map[string]warnState)
	}
	s, ok := w.last[key]
	if ok && now.Sub(s.at) < warnEvery && now.Sub(s.at) >= 0 {
		s.suppressed++
		w.last[key] = s
		return false, 0
	}
	w.last[key] = warnState{at: now}
	return true, s.suppressed
}
