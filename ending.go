package ddblease

import (
	"context"
	"slices"
	"sync"
)

// This file owns ending: the end of something that lives (a term; a pool
// job's run on this replica), what ends with it and what it calls. It
// replaces a context that would live as long as its owner: the contexts
// that end with it are made only while they are needed (derive), so that
// an owner at rest (a pool's held job between its steps) holds none.

// ending is why its owner ended, and its watchers. mu is the owner's lock;
// the owner's other state that says "over" changes under it too, so that
// no one sees the owner over and a context derived from it live.
type ending struct {
	mu      *sync.Mutex
	cause   error       // why it ended; nil while it lasts
	watches []*endWatch // what its end cancels and calls
}

// endWatch is one watcher of an ending: a derived context, cancelled with
// the end's cause under the owner's lock, or a function, called on a
// goroutine of its own.
type endWatch struct {
	cancel context.CancelCauseFunc
	f      func()
}

// act acts on the end, with its cause.
func (w *endWatch) act(cause error) {
	if w.cancel != nil {
		w.cancel(cause)
	}
	if w.f != nil {
		go w.f()
	}
}

// endLocked ends it with cause (context.Canceled if nil, as for a context
// cancelled without one), once. Called with e.mu held.
func (e *ending) endLocked(cause error) {
	if e.cause != nil {
		return
	}
	if cause == nil {
		cause = context.Canceled
	}
	e.cause = cause
	for _, w := range e.watches {
		w.act(cause)
	}
	e.watches = nil
}

// end is endLocked, taking the lock.
func (e *ending) end(cause error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.endLocked(cause)
}

// why returns why it ended; nil while it lasts.
func (e *ending) why() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cause
}

// watch registers w, or acts on it at once if it has ended; stop forgets
// it, and reports whether it did so before the end acted on it.
func (e *ending) watch(w *endWatch) (stop func() bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cause != nil {
		w.act(e.cause)
		return func() bool { return false }
	}
	e.watches = append(e.watches, w)
	return func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		i := slices.Index(e.watches, w)
		if i >= 0 {
			e.watches = slices.Delete(e.watches, i, i+1)
		}
		return i >= 0
	}
}

// derive returns a context that ends when e ends, with its cause, or when
// cancel is called, and carries base's values, not its end.
func (e *ending) derive(base context.Context) (ctx context.Context, cancel context.CancelCauseFunc) {
	ctx, end := context.WithCancelCause(context.WithoutCancel(base))
	stop := e.watch(&endWatch{cancel: end})
	return ctx, func(cause error) {
		stop()
		end(cause)
	}
}

// whenOver calls f on a goroutine of its own when e ends (at once if it
// has ended), as context.AfterFunc would on a derived context, without
// making one; stop is as for watch.
func (e *ending) whenOver(f func()) (stop func() bool) { return e.watch(&endWatch{f: f}) }
