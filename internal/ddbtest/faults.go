package ddbtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Action says what Faults does with one request.
type Action int

const (
	// Pass forwards the request and returns the response.
	Pass Action = iota
	// DropResponse forwards the request, lets the server apply it, and
	// returns a connection reset instead of the response.
	DropResponse
	// Reset returns a connection reset without forwarding the request.
	Reset
	// ServerError answers HTTP 500 without forwarding the request.
	ServerError
	// Throttle answers ProvisionedThroughputExceededException without
	// forwarding the request.
	Throttle
	// Hold answers a connection reset at once but keeps the request, and
	// sends it to the server when Release is called: a request abandoned
	// by the client that lands late.
	Hold
	// Conflict answers, without forwarding the request, as DynamoDB does
	// when another transaction is using an item the request writes: a
	// TransactWriteItems (or TransactGetItems) gets
	// TransactionCanceledException with one cancellation reason per action,
	// TransactionConflict for the first (where this library puts its check
	// on the lease item) and None for the others; a PutItem, UpdateItem or
	// DeleteItem gets TransactionConflictException. Other operations (reads
	// never conflict) are passed.
	Conflict
)

// Faults is an http.RoundTripper that counts requests by DynamoDB operation
// and applies a rule to each. The zero rule passes everything.
type Faults struct {
	Base http.RoundTripper

	mu     sync.Mutex
	rule   func(op string) Action
	counts map[string]int
	held   []*http.Request
}

// NewFaults returns a Faults in front of base.
func NewFaults(base http.RoundTripper) *Faults {
	return &Faults{Base: base, counts: map[string]int{}}
}

// Wrap is a Server.Client decorator that puts f in front of the transport.
func (f *Faults) Wrap(rt http.RoundTripper) http.RoundTripper {
	f.Base = rt
	if f.counts == nil {
		f.counts = map[string]int{}
	}
	return f
}

// Set replaces the rule; nil passes everything.
func (f *Faults) Set(rule func(op string) Action) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rule = rule
}

// Count returns how many requests of op were sent through f, faulted or not.
func (f *Faults) Count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[op]
}

// Counts returns a copy of all counts.
func (f *Faults) Counts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[string]int, len(f.counts))
	for k, v := range f.counts {
		m[k] = v
	}
	return m
}

// Op returns the DynamoDB operation named in a request's X-Amz-Target.
func Op(r *http.Request) string {
	t := r.Header.Get("X-Amz-Target")
	return t[strings.LastIndexByte(t, '.')+1:]
}

var errReset = errors.New("read tcp 127.0.0.1: connection reset by peer (injected)")

// RoundTrip implements http.RoundTripper.
func (f *Faults) RoundTrip(r *http.Request) (*http.Response, error) {
	op := Op(r)
	f.mu.Lock()
	f.counts[op]++
	act := Pass
	if f.rule != nil {
		act = f.rule(op)
	}
	f.mu.Unlock()
	switch act {
	case DropResponse:
		resp, err := f.Base.RoundTrip(r)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		return nil, errReset
	case Hold:
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		late := r.Clone(context.Background())
		late.Body = io.NopCloser(bytes.NewReader(body))
		f.mu.Lock()
		f.held = append(f.held, late)
		f.mu.Unlock()
		return nil, errReset
	case Reset:
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, errReset
	case ServerError:
		return answer(r, 500, `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}`), nil
	case Throttle:
		return answer(r, 400, `{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"injected"}`), nil
	case Conflict:
		if body, ok := conflictBody(r, op); ok {
			return answer(r, 400, body), nil
		}
	}
	return f.Base.RoundTrip(r)
}

// Release sends the held requests to the server, in order, and returns the
// status of each answer (0 where the request failed).
func (f *Faults) Release() []int {
	f.mu.Lock()
	held := f.held
	f.held = nil
	f.mu.Unlock()
	var codes []int
	for _, r := range held {
		resp, err := f.Base.RoundTrip(r)
		if err != nil {
			codes = append(codes, 0)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	return codes
}

func answer(r *http.Request, status int, body string) *http.Response {
	if r.Body != nil {
		_ = r.Body.Close()
	}
	return &http.Response{
		StatusCode: status,
		Status:     http.StatusText(status),
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       r,
	}
}

// conflictBody returns DynamoDB's answer to a request of op that conflicts
// with a transaction in progress, and false for an operation that does not
// conflict. It consumes r's body to count a transaction's actions.
func conflictBody(r *http.Request, op string) (string, bool) {
	switch op {
	case "PutItem", "UpdateItem", "DeleteItem":
		return `{"__type":"com.amazonaws.dynamodb.v20120810#TransactionConflictException",` +
			`"message":"Transaction is ongoing for the item"}`, true
	case "TransactWriteItems", "TransactGetItems":
	default:
		return "", false
	}
	var in struct{ TransactItems []json.RawMessage }
	if r.Body != nil {
		_ = json.NewDecoder(r.Body).Decode(&in)
	}
	type reason struct {
		Code    string
		Message string `json:",omitempty"`
	}
	reasons := []reason{{Code: "TransactionConflict", Message: "Transaction is ongoing for the item"}}
	codes := []string{"TransactionConflict"}
	for range max(len(in.TransactItems)-1, 0) {
		reasons = append(reasons, reason{Code: "None"})
		codes = append(codes, "None")
	}
	body, _ := json.Marshal(struct {
		Type                string `json:"__type"`
		CancellationReasons []reason
		Message             string
	}{
		Type:                "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
		CancellationReasons: reasons,
		Message:             "Transaction cancelled, please refer cancellation reasons for specific reasons [" + strings.Join(codes, ", ") + "]",
	})
	return string(body), true
}
