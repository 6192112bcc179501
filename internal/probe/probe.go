// Package probe lets the fault-injection suite watch tenures from inside
// the library. Nothing is observed unless a test installs a function.
package probe

import (
	"sync/atomic"
	"time"
)

// TenureFunc receives a tenure's local deadline each time it changes: on
// acquisition and on every successful renewal; ended is true when the
// tenure ends. deadline is on the lease's own clock (Options.Now).
type TenureFunc func(job, owner string, fence int64, deadline time.Time, ended bool)

var tenure atomic.Pointer[TenureFunc]

// SetTenure installs f (nil removes it).
func SetTenure(f TenureFunc) {
	if f == nil {
		tenure.Store(nil)
		return
	}
	tenure.Store(&f)
}

// Tenure reports a tenure change to the installed function, if any.
func Tenure(job, owner string, fence int64, deadline time.Time, ended bool) {
	if f := tenure.Load(); f != nil {
		(*f)(job, owner, fence, deadline, ended)
	}
}
