package chaos

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Faults are the probabilities (0 to 1) of each fault for one request, and
// the latency added to every request. The zero value passes everything.
type Faults struct {
	Latency  time.Duration
	Drop     float64 // forward, let the server apply it, drop the response
	Reset    float64 // close the connection without forwarding
	Error5xx float64 // answer 500 or 503 without forwarding
	Throttle float64 // answer a throttling error without forwarding
}

// Fault kinds, as counted by Proxy.Counts.
const (
	FaultDrop     = "drop-response"
	FaultReset    = "reset"
	FaultError5xx = "http-5xx"
	FaultThrottle = "throttle"
	FaultLatency  = "latency"
)

// Proxy forwards DynamoDB requests to an upstream server, injecting faults
// drawn from a seeded generator. It listens on loopback.
type Proxy struct {
	upstream string
	ln       net.Listener
	srv      *http.Server
	client   *http.Client

	mu     sync.Mutex
	faults Faults
	rng    *rand.Rand
	counts map[string]int
	// Forwarded requests the server took longer than slowAfter to answer
	// (zero: none are watched), from the send to the answer.
	slowAfter time.Duration
	slow      []Interval
}

// NewProxy starts a proxy in front of upstream (http://host:port).
func NewProxy(upstream string, seed uint64) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		upstream: strings.TrimRight(upstream, "/"),
		ln:       ln,
		client:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}},
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		counts:   map[string]int{},
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// URL is the address replicas use.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// Set changes the faults for the requests that follow.
func (p *Proxy) Set(f Faults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = f
}

// WatchSlow makes the proxy note every forwarded request that the server
// takes longer than d to answer (Slow).
func (p *Proxy) WatchSlow(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slowAfter = d
}

// Slow returns the forwarded requests the server answered late (WatchSlow),
// each from its send to its answer.
func (p *Proxy) Slow() []Interval {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Interval(nil), p.slow...)
}

// Counts returns how many faults of each kind were injected.
func (p *Proxy) Counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]int, len(p.counts))
	for k, v := range p.counts {
		m[k] = v
	}
	return m
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	_ = p.srv.Close()
	p.client.CloseIdleConnections()
}

func (p *Proxy) draw() (latency time.Duration, kind string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.faults
	if f.Latency > 0 {
		p.counts[FaultLatency]++
	}
	x := p.rng.Float64()
	for _, c := range []struct {
		kind string
		p    float64
	}{{FaultDrop, f.Drop}, {FaultReset, f.Reset}, {FaultError5xx, f.Error5xx}, {FaultThrottle, f.Throttle}} {
		if x < c.p {
			p.counts[c.kind]++
			return f.Latency, c.kind
		}
		x -= c.p
	}
	return f.Latency, ""
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	latency, kind := p.draw()
	if latency > 0 {
		time.Sleep(latency)
	}
	switch kind {
	case FaultReset:
		hangUp(w)
		return
	case FaultError5xx:
		status, typ := 500, "InternalServerError"
		if len(body)%2 == 0 {
			status, typ = 503, "ServiceUnavailable"
		}
		writeErr(w, status, typ)
		return
	case FaultThrottle:
		typ := "ProvisionedThroughputExceededException"
		if len(body)%2 == 0 {
			typ = "ThrottlingException"
		}
		writeErr(w, 400, typ)
		return
	}
	// A request that reached the network completes at the server even if
	// its client is gone, as with DynamoDB itself.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, p.upstream+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		hangUp(w)
		return
	}
	req.Header = r.Header.Clone()
	req.Host = r.Host
	sent := time.Now()
	resp, err := p.client.Do(req)
	if err != nil {
		hangUp(w)
		return
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if took := time.Since(sent); took > 0 {
		p.mu.Lock()
		if p.slowAfter > 0 && took > p.slowAfter {
			p.slow = append(p.slow, Interval{From: sent, To: sent.Add(took)})
		}
		p.mu.Unlock()
	}
	if err != nil || kind == FaultDrop {
		hangUp(w) // the server applied the request; the answer is lost
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
}

func writeErr(w http.ResponseWriter, status int, typ string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, `{"__type":"com.amazonaws.dynamodb.v20120810#`+typ+`","message":"injected"}`)
}

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset, not an orderly close
			}
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
