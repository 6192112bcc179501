package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// What ddblease writes on stderr goes through one slog.Logger, in the
// format --log-format names:
//   - json: one JSON object per line (slog's JSON handler: time, level,
//     msg and attributes), for every command, its errors included;
//   - text, for a command whose stderr is a log stream (exec): slog's text
//     handler, key=value lines with time and level;
//   - text, for the other commands: plain lines, the message alone
//     ("ddblease: unknown job: \"x\""), a warning after "warning: ".
//
// A command's error, in the text format, is one plain line whatever the
// command (exec's too: "ddblease: exec worker: COMMAND exited with status
// 7" after its key=value lines); in the json format, one more object.

// newLogger returns the logger for --log-format format, writing to w the
// records at level and above.
func newLogger(w io.Writer, format string, stream bool, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch {
	case format == "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case format != "text":
		return nil, usagef("--log-format %q: want text or json", format)
	case stream:
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return slog.New(&plainHandler{w: w, level: level}), nil
}

// plainLogger writes each record's message, and its attributes as
// key=value, on a line of its own.
func plainLogger(w io.Writer) *slog.Logger { return slog.New(&plainHandler{w: w}) }

type plainHandler struct {
	w     io.Writer
	level slog.Level
	attrs []slog.Attr
}

func (h *plainHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *plainHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	if r.Level == slog.LevelWarn {
		b.WriteString("warning: ")
	}
	b.WriteString(r.Message)
	add := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	b.WriteByte('\n')
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *plainHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &plainHandler{w: h.w, level: h.level, attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], attrs...)}
}

func (h *plainHandler) WithGroup(string) slog.Handler { return h }

// lockedWriter makes each Write whole: the loggers of exec (its own, the
// library's) and the copy of COMMAND's stderr never interleave their
// writes.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
