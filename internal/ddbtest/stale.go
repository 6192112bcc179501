package ddbtest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"sync"
)

// StaleReads is an http.RoundTripper that serves eventually consistent
// GetItem reads from the past, like a lagging replica. Until Freeze it
// records the answer to every GetItem; after Freeze, an eventually
// consistent GetItem of an item recorded before is answered with that
// recording, without reaching the server. Strongly consistent reads, reads
// of items never recorded and every other request pass through, as
// DynamoDB never serves them stale.
type StaleReads struct {
	Base http.RoundTripper

	mu       sync.Mutex
	frozen   bool
	recorded map[string]recording
	served   int
}

type recording struct {
	status int
	header http.Header
	body   []byte
}

// Wrap is a Server.Client decorator that puts s in front of the transport.
func (s *StaleReads) Wrap(rt http.RoundTripper) http.RoundTripper {
	s.Base = rt
	return s
}

// Freeze stops recording: from now on, eventually consistent reads of
// recorded items return what they returned before.
func (s *StaleReads) Freeze() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.frozen = true
}

// Served returns how many stale answers s has served.
func (s *StaleReads) Served() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served
}

// RoundTrip implements http.RoundTripper.
func (s *StaleReads) RoundTrip(r *http.Request) (*http.Response, error) {
	if Op(r) != "GetItem" || r.Body == nil {
		return s.Base.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		return nil, err
	}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }

	var in struct {
		TableName      string
		Key            map[string]any
		ConsistentRead bool
	}
	if json.Unmarshal(body, &in) != nil {
		return s.Base.RoundTrip(r2)
	}
	k, _ := json.Marshal(in.Key) // map keys come out sorted
	id := in.TableName + "\x00" + string(k)

	s.mu.Lock()
	rec, ok := s.recorded[id]
	frozen := s.frozen
	if frozen && ok && !in.ConsistentRead {
		s.served++
		s.mu.Unlock()
		return &http.Response{
			StatusCode: rec.status, Status: http.StatusText(rec.status),
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:        rec.header.Clone(),
			Body:          io.NopCloser(bytes.NewReader(rec.body)),
			ContentLength: int64(len(rec.body)),
			Request:       r,
		}, nil
	}
	s.mu.Unlock()

	resp, err := s.Base.RoundTrip(r2)
	if err != nil || frozen || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	rb, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(rb))
	s.mu.Lock()
	if s.recorded == nil {
		s.recorded = map[string]recording{}
	}
	s.recorded[id] = recording{status: resp.StatusCode, header: resp.Header.Clone(), body: rb}
	s.mu.Unlock()
	return resp, nil
}
