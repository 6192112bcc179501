package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
)

// The reads figure: the items each operator read examines, on a table of
// readsJobs jobs holding the run items of readsRuns slots, through
// ddblease.Admin, as the command calls it. (The previous layout's figures,
// read by a Scan, are in BENCHMARKS.md; the bench no longer makes them:
// nothing in the repository's non-test code scans.)

const readsJobs = 10

// readsResult is one read.
type readsResult struct {
	Read string
	// Examined counts the items the server read (ScannedCount of a Query,
	// the items a GetItem or BatchGetItem returned), Returned the items
	// the read gives the operator, Requests the requests sent.
	NewExamined, NewRequests int
	Returned                 int
	// NewUnits are the read units the server reported (0 where it
	// reports none).
	NewUnits float64
}

// examined counts the requests of a client, the items the server
// examined for them and the read units it reports having consumed (each
// request is sent asking for ReturnConsumedCapacity TOTAL).
type examined struct {
	base     http.RoundTripper
	mu       sync.Mutex
	items    int
	requests int
	units    float64
}

func (e *examined) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		var body map[string]any
		if json.Unmarshal(b, &body) == nil {
			body["ReturnConsumedCapacity"] = "TOTAL"
			b, _ = json.Marshal(body)
		}
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(b))
		req.ContentLength = int64(len(b))
		req.Header.Del("Content-Length")
		req.Header.Del("X-Amz-Content-Sha256")
	}
	resp, err := e.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	var out struct {
		ScannedCount     *int
		Item             map[string]any
		Responses        map[string][]any
		ConsumedCapacity json.RawMessage
	}
	_ = json.Unmarshal(b, &out)
	type capacity struct{ CapacityUnits, ReadCapacityUnits float64 }
	var one capacity
	var many []capacity
	if json.Unmarshal(out.ConsumedCapacity, &one) != nil && json.Unmarshal(out.ConsumedCapacity, &many) == nil {
		for _, c := range many {
			one.CapacityUnits += c.CapacityUnits
		}
	}
	n := len(out.Responses) // no more than one table
	switch {
	case out.ScannedCount != nil:
		n = *out.ScannedCount
	case out.Item != nil:
		n = 1
	default:
		n = 0
		for _, items := range out.Responses {
			n += len(items)
		}
	}
	e.mu.Lock()
	e.items += n
	e.requests++
	e.units += one.CapacityUnits
	e.mu.Unlock()
	return resp, nil
}

// take returns the counts since the last take.
func (e *examined) take() (items, requests int, units float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	items, requests, units = e.items, e.requests, e.units
	e.items, e.requests, e.units = 0, 0, 0
	return items, requests, units
}

// reads measures the reads figure and records it in the results.
func (r *runner) reads() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	counter := &examined{base: newTransport(8)}
	db := newClient(r.cfg.endpoint, counter)
	newTable := r.cfg.table + "-reads-" + r.runID
	now := time.Now().UTC().Truncate(time.Minute)
	r.logf("reads: filling a table with %d jobs and %d runs", readsJobs, r.cfg.readsRuns)
	defer func() { _, _ = db.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(newTable)}) }()
	if err := fillReads(ctx, db, newTable, r.cfg.readsRuns, now); err != nil {
		r.fail("reads", err)
		return
	}
	admin, err := ddblease.NewAdmin(db, newTable)
	if err != nil {
		r.fail("reads", err)
		return
	}
	rd := readings{ctx: ctx, admin: admin, counter: counter, fail: func(err error) { r.fail("reads", err) }}
	res := rd.all("job03", now)
	r.mu.Lock()
	r.res.Reads, r.res.ReadsItems = res, r.cfg.readsRuns
	r.mu.Unlock()
}

// readings makes the reads of the figure and counts them.
type readings struct {
	ctx     context.Context
	admin   *ddblease.Admin
	counter *examined
	fail    func(error)
	res     []readsResult
}

// all makes each read, on job where it names one; now is the latest slot.
func (rd *readings) all(job string, now time.Time) []readsResult {
	ctx, admin := rd.ctx, rd.admin
	// The command's status also shows each job's last run and last
	// failure, from its 20 latest runs.
	latest := ddblease.RunRange{Newest: true, Limit: 20}
	rd.add("status (every job)",
		func() int {
			js, err := admin.Jobs(ctx)
			for _, j := range js {
				_, err := admin.Runs(ctx, j.Job, latest)
				rd.must(0, err)
			}
			return rd.must(len(js), err)
		})
	rd.add("status "+job,
		func() int {
			_, err := admin.Job(ctx, job)
			rd.must(0, err)
			_, err = admin.Runs(ctx, job, latest)
			return rd.must(1, err)
		})
	newRuns := func(from time.Time) func() int {
		return func() int {
			_, err := admin.Job(ctx, job)
			rd.must(0, err)
			rs, err := admin.Runs(ctx, job, ddblease.RunRange{From: from})
			return rd.must(len(rs), err)
		}
	}
	rd.add("runs "+job+" --since 1h", newRuns(now.Add(-time.Hour)))
	rd.add("watch "+job+": one interval", newRuns(now)) // from the latest run seen
	return rd.res
}

// add makes a read, counting it.
func (rd *readings) add(read string, newRead func() int) {
	ni, nr, nu, n := rd.measure(newRead)
	rd.res = append(rd.res, readsResult{Read: read, NewExamined: ni, NewRequests: nr, Returned: n, NewUnits: nu})
}

func (rd *readings) measure(f func() int) (items, reqs int, units float64, n int) {
	rd.counter.take()
	n = f()
	items, reqs, units = rd.counter.take()
	return items, reqs, units, n
}

func (rd *readings) must(n int, err error) int {
	if err != nil {
		rd.fail(err)
	}
	return n
}

// fillReads makes the table and writes readsJobs jobs with
// runs/readsJobs runs each, one a minute up to now. The lease items are
// made by the library (an acquisition and a resignation), the run items
// as the library writes them.
func fillReads(ctx context.Context, db *dynamodb.Client, newTable string, runs int, now time.Time) error {
	if err := ddblease.CreateTable(ctx, db, newTable); err != nil {
		return err
	}
	var newItems []map[string]types.AttributeValue
	for j := range readsJobs {
		job := fmt.Sprintf("job%02d", j)
		l, err := ddblease.New(db, newTable, job)
		if err != nil {
			return err
		}
		if _, err := l.TryAcquire(ctx); err != nil {
			return err
		}
		if err := l.Resign(ctx); err != nil {
			return err
		}
		for i := range runs / readsJobs {
			slot := now.Add(-time.Duration(i) * time.Minute)
			id := slot.Format(time.RFC3339Nano)
			run := map[string]types.AttributeValue{
				"job": avS(job), "slot": avS(id), "fence": avN(1), "owner": avS("bench"), "claim": avS("c"),
				"status": avS("succeeded"), "startedAt": avN(slot.UnixMilli()), "finishedAt": avN(slot.UnixMilli() + 1000),
			}
			n := map[string]types.AttributeValue{"pk": avS("job#" + job), "sk": avS("run#" + slot.Format("2006-01-02T15:04:05.000000000Z"))}
			for k, v := range run {
				n[k] = v
			}
			newItems = append(newItems, n)
		}
	}
	return batchWrite(ctx, db, newTable, newItems)
}

// batchWrite puts items into table, 25 at a time.
func batchWrite(ctx context.Context, db *dynamodb.Client, table string, items []map[string]types.AttributeValue) error {
	for len(items) > 0 {
		n := min(25, len(items))
		req := make([]types.WriteRequest, n)
		for i, it := range items[:n] {
			req[i] = types.WriteRequest{PutRequest: &types.PutRequest{Item: it}}
		}
		pending := map[string][]types.WriteRequest{table: req}
		for len(pending) > 0 {
			out, err := db.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
			if err != nil {
				return fmt.Errorf("fill %s: %w", table, err)
			}
			pending = out.UnprocessedItems
		}
		items = items[n:]
	}
	return nil
}

func avS(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func avN(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
