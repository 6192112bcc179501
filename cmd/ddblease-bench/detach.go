package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"
)

// detached is an http.RoundTripper that never aborts a request that is on
// the wire. When the caller's context ends first, it returns the context's
// error to the caller at once, as the transport would; a request still
// waiting for a connection is then cancelled (nothing of it was sent), and
// one that has a connection runs to its end on a context of its own.
//
// dynalite 4.0.0 throws an uncaught error (index.js: req.on('error',
// function (err) { throw err })) and exits when a client closes a
// connection while a request is in flight, which Go's transport does
// whenever a call's context is cancelled. Real DynamoDB does not care. With
// this transport the library sees what it would see, and dynalite survives.
type detached struct {
	base     http.RoundTripper
	inflight sync.WaitGroup
}

func (d *detached) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx := r.Context()
	if ctx.Done() == nil {
		return d.base.RoundTrip(r)
	}
	var mu sync.Mutex
	gotConn := false
	own, cancel := context.WithCancel(context.WithoutCancel(ctx))
	own = httptrace.WithClientTrace(own, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) {
		mu.Lock()
		gotConn = true
		mu.Unlock()
	}})
	// The request sent on goes out with its own copy of the body and headers:
	// the SDK may close or rewind its body once the call has returned, and a
	// body that fails half-way through makes the transport abort the request.
	r2 := r.Clone(own)
	if r.Body != nil && r.Body != http.NoBody {
		b, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			cancel()
			return nil, err
		}
		r2.Body = io.NopCloser(bytes.NewReader(b))
		r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		r2.ContentLength = int64(len(b))
	}
	type result struct {
		resp *http.Response
		err  error
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
		if res.err != nil {
			cancel()
			return nil, res.err
		}
		res.resp.Body = &cancelOnClose{ReadCloser: res.resp.Body, cancel: cancel}
		return res.resp, nil
	case <-ctx.Done():
		mu.Lock()
		if !gotConn {
			cancel() // still queued for a connection: nothing was sent
		}
		mu.Unlock()
		go func() {
			defer d.inflight.Done()
			defer cancel()
			if res := <-ch; res.resp != nil {
				_, _ = io.Copy(io.Discard, res.resp.Body)
				_ = res.resp.Body.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
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
