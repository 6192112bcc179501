package ddblease

import (
	"context"
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
	cause   error     // why it ended; nil while it lasts
	watches *endWatch // what its end cancels and calls, a list in the order watched
}

// endWatch is one watcher of an ending: a derived context, cancelled with
// the end's cause under the owner's lock, or a function, called on a
// goroutine of its own.
type endWatch struct {
	cancel context.CancelCauseFunc
	f      func()
	next   *endWatch
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

// overLocked reports whether it has ended. Called with e.mu held.
func (e *ending) overLocked() bool { return e.cause != nil }

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
	for w := e.watches; w != nil; w = w.next {
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

// watch registers w, or acts on it at once if it has ended.
func (e *ending) watch(w *endWatch) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cause != nil {
		w.act(e.cause)
		return
	}
	w.next = nil // a watch kept by its owner is watched again once unwatched
	at := &e.watches
	for *at != nil {
		at = &(*at).next
	}
	*at = w
}

// unwatch forgets w, and reports whether it did so before the end acted
// on it.
func (e *ending) unwatch(w *endWatch) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for at := &e.watches; *at != nil; at = &(*at).next {
		if *at == w {
			*at = w.next
			return true
		}
	}
	return false
}

// derive returns a context that ends when e ends, with its cause, or when
// cancel is called, and carries base's values, not its end.
func (e *ending) derive(base context.Context) (ctx context.Context, cancel context.CancelCauseFunc) {
	ctx, end := context.WithCancelCause(context.WithoutCancel(base))
	w := &endWatch{cancel: end}
	e.watch(w)
	return ctx, func(cause error) {
		e.unwatch(w)
		end(cause)
	}
}

// whenOver calls f on a goroutine of its own when e ends (at once if it
// has ended), as context.AfterFunc would on a derived context, without
// making one; the watch it returns is for unwatch.
func (e *ending) whenOver(f func()) *endWatch {
	w := &endWatch{f: f}
	e.watch(w)
	return w
}
