// Package reqcount counts DynamoDB requests at the HTTP layer, by operation
// and, for GetItem, by read consistency, so that benchmarks can turn request
// counts into capacity units. Counting below the SDK sees every attempt the
// SDK's retryer makes, which is what DynamoDB bills.
package reqcount

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Keys of the read-consistency variants of GetItem in Counts.
const (
	GetEventual   = "GetItem.eventual"
	GetConsistent = "GetItem.consistent"
)

// Counts maps an operation (GetItem split into GetEventual and
// GetConsistent) to a number of requests.
type Counts map[string]int64

// Transport is an http.RoundTripper that counts the requests it forwards to
// Base and, if Observe is set, reports each one's latency.
type Transport struct {
	Base http.RoundTripper
	// Observe, if not nil, is called after each request with its operation
	// key, latency and transport error.
	Observe func(op string, d time.Duration, err error)

	mu     sync.Mutex
	counts Counts
}

// New returns a Transport in front of base.
func New(base http.RoundTripper) *Transport {
	return &Transport{Base: base, counts: Counts{}}
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	op := Op(r)
	if op == "GetItem" {
		var consistent bool
		var err error
		if r, consistent, err = peekConsistent(r); err != nil {
			return nil, err
		}
		op = GetEventual
		if consistent {
			op = GetConsistent
		}
	}
	t.mu.Lock()
	if t.counts == nil {
		t.counts = Counts{}
	}
	t.counts[op]++
	t.mu.Unlock()
	start := time.Now()
	resp, err := t.Base.RoundTrip(r)
	if t.Observe != nil {
		t.Observe(op, time.Since(start), err)
	}
	return resp, err
}

// Snapshot returns a copy of the counts so far.
func (t *Transport) Snapshot() Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := make(Counts, len(t.counts))
	for k, v := range t.counts {
		c[k] = v
	}
	return c
}

// Op returns the DynamoDB operation named in a request's X-Amz-Target.
func Op(r *http.Request) string {
	tg := r.Header.Get("X-Amz-Target")
	return tg[strings.LastIndexByte(tg, '.')+1:]
}

// peekConsistent reads a GetItem request's body to find ConsistentRead, and
// returns a copy of the request whose body can still be sent.
func peekConsistent(r *http.Request) (*http.Request, bool, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return r, false, nil
	}
	b, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		return nil, false, fmt.Errorf("reqcount: read request body: %w", err)
	}
	var in struct{ ConsistentRead bool }
	_ = json.Unmarshal(b, &in) // an unreadable body counts as eventually consistent
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(b))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	r2.ContentLength = int64(len(b))
	return r2, in.ConsistentRead, nil
}

// Sub returns c − base, key by key.
func (c Counts) Sub(base Counts) Counts {
	d := make(Counts, len(c))
	for k, v := range c {
		if v -= base[k]; v != 0 {
			d[k] = v
		}
	}
	return d
}

// Total returns the number of requests of every operation.
func (c Counts) Total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

// Units returns the read and write capacity units the requests consume when
// every item is small (reads up to 4 KB, writes up to 1 KB), as lease items
// are: an eventually consistent read is half a read unit, a strongly
// consistent read one, a PutItem, UpdateItem or DeleteItem one write unit.
// Other operations are not counted.
func (c Counts) Units() (rcu, wcu float64) {
	rcu = 0.5*float64(c[GetEventual]) + float64(c[GetConsistent])
	wcu = float64(c["PutItem"] + c["UpdateItem"] + c["DeleteItem"])
	return rcu, wcu
}

// String formats the counts as space-separated key=value pairs in key order,
// the form Parse reads.
func (c Counts) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for i, k := range keys {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%s=%d", k, c[k])
	}
	return sb.String()
}

// Parse reads counts in the form String writes.
func Parse(s string) (Counts, error) {
	c := Counts{}
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("reqcount: %q is not key=value", f)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("reqcount: %q: %w", f, err)
		}
		c[k] = n
	}
	return c, nil
}
