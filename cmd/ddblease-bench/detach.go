package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"time"
)

// detached is an http.RoundTripper that never aborts a request on the wire.
// When the caller's context ends first, it returns the context's error to
// the caller at once, as the transport would, but lets the request run to
// its end on a context without cancellation.
//
// dynalite 4.0.0 throws an uncaught error (index.js: req.on('error',
// function (err) { throw err })) and exits when a client closes a
// connection while a request is in flight, which Go's transport does
// whenever a call's context is cancelled. Real DynamoDB does not care. With
// this transport the library sees exactly what it would see, and dynalite
// survives.
type detached struct {
	base     http.RoundTripper
	inflight sync.WaitGroup
}

func (d *detached) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx := r.Context()
	if ctx.Done() == nil {
		return d.base.RoundTrip(r)
	}
	type result struct {
		resp *http.Response
		err  error
	}
	// The request sent on goes out with its own copy of the body and headers:
	// the SDK may close or rewind its body once the call has returned, and a
	// body that fails half-way through makes the transport abort the request.
	r2 := r.Clone(context.WithoutCancel(ctx))
	if r.Body != nil && r.Body != http.NoBody {
		b, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			return nil, err
		}
		r2.Body = io.NopCloser(bytes.NewReader(b))
		r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		r2.ContentLength = int64(len(b))
	}
	ch := make(chan result, 1)
	d.inflight.Add(1)
	go func() {
		resp, err := d.base.RoundTrip(r2)
		ch <- result{resp, err}
	}()
	select {
	case res := <-ch:
		d.inflight.Done()
		return res.resp, res.err
	case <-ctx.Done():
		go func() {
			defer d.inflight.Done()
			if res := <-ch; res.resp != nil {
				_, _ = io.Copy(io.Discard, res.resp.Body)
				_ = res.resp.Body.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// wait waits up to timeout for abandoned requests to finish, so that the
// process does not exit with one on the wire.
func (d *detached) wait(timeout time.Duration) {
	done := make(chan struct{})
	go func() { d.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
	}
}
