package ddbleaseotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleaseotel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// collector reads what a Metrics recorded through the OpenTelemetry SDK.
type collector struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
	rm     metricdata.ResourceMetrics
}

func newMetrics(t *testing.T) (*ddbleaseotel.Metrics, *collector) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := ddbleaseotel.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, &collector{t: t, reader: reader}
}

func (c *collector) collect() {
	c.t.Helper()
	c.rm = metricdata.ResourceMetrics{}
	if err := c.reader.Collect(context.Background(), &c.rm); err != nil {
		c.t.Fatal(err)
	}
}

func (c *collector) find(name string) (metricdata.Metrics, bool) {
	for _, sm := range c.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

func matches(set attribute.Set, kv []attribute.KeyValue) bool {
	if set.Len() != len(kv) {
		return false
	}
	for _, a := range kv {
		if v, ok := set.Value(a.Key); !ok || v != a.Value {
			return false
		}
	}
	return true
}

// value returns the sum or gauge value of name's data point with exactly
// the attributes kv, and whether there is one.
func (c *collector) value(name string, kv ...attribute.KeyValue) (int64, bool) {
	c.t.Helper()
	m, ok := c.find(name)
	if !ok {
		return 0, false
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, kv) {
				return p.Value, true
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, kv) {
				return p.Value, true
			}
		}
	default:
		c.t.Fatalf("%s: unexpected data %T", name, m.Data)
	}
	return 0, false
}

func (c *collector) want(name string, want int64, kv ...attribute.KeyValue) {
	c.t.Helper()
	got, ok := c.value(name, kv...)
	if !ok || got != want {
		c.t.Errorf("%s%v = %d (present %v), want %d", name, kv, got, ok, want)
	}
}

// histogram returns the count and sum of name's data point with the
// attributes kv.
func (c *collector) histogram(name string, kv ...attribute.KeyValue) (uint64, float64) {
	c.t.Helper()
	m, ok := c.find(name)
	if !ok {
		return 0, 0
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		c.t.Fatalf("%s: unexpected data %T", name, m.Data)
	}
	for _, p := range h.DataPoints {
		if matches(p.Attributes, kv) {
			return p.Count, p.Sum
		}
	}
	return 0, 0
}

var (
	job   = ddbleaseotel.AttrJob.String("billing")
	ownA  = ddbleaseotel.AttrOwner.String("a")
	ownB  = ddbleaseotel.AttrOwner.String("b")
	epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

func TestEventsToInstruments(t *testing.T) {
	m, c := newMetrics(t)
	var chained []ddblease.EventKind
	a := m.Chain(func(e ddblease.Event) { chained = append(chained, e.Kind) })
	b := m.Observe
	ev := func(obs func(ddblease.Event), e ddblease.Event) {
		e.Job, e.Time = "billing", epoch
		if e.Owner == "" && e.Kind != ddblease.EventStaleFence {
			e.Owner = "a"
			if obs == nil {
				obs, e.Owner = b, "b"
			}
		}
		if obs == nil {
			obs = b
		}
		obs(e)
	}

	// a leads; b watches.
	ev(a, ddblease.Event{Kind: ddblease.EventCampaign})
	ev(a, ddblease.Event{Kind: ddblease.EventCall, Op: "UpdateItem", Outcome: ddblease.CallOK, Latency: 4 * time.Millisecond})
	ev(a, ddblease.Event{Kind: ddblease.EventAcquired, Fence: 7, Latency: 4 * time.Millisecond})
	ev(nil, ddblease.Event{Kind: ddblease.EventLeaderSeen, Holder: "a", Fence: 7})
	ev(a, ddblease.Event{Kind: ddblease.EventRenewed, Fence: 7, Latency: 10 * time.Millisecond, Margin: 2 * time.Second})
	ev(a, ddblease.Event{Kind: ddblease.EventRenewed, Fence: 7, Latency: 30 * time.Millisecond, Margin: 1500 * time.Millisecond})
	ev(a, ddblease.Event{Kind: ddblease.EventRetry, Op: "heartbeat", Err: errors.New("reset")})
	ev(a, ddblease.Event{Kind: ddblease.EventCall, Op: "UpdateItem", Outcome: ddblease.CallInDoubt})
	c.collect()
	c.want("ddblease.leader", 1, job, ownA)
	c.want("ddblease.leader", 0, job, ownB)
	c.want("ddblease.fence", 7, job, ownA)
	c.want("ddblease.acquisitions", 1, job)
	c.want("ddblease.handovers", 0, job) // b's first sighting is no hand-over
	c.want("ddblease.retries", 1, job, ddbleaseotel.AttrStep.String("heartbeat"))
	c.want("ddblease.dynamodb.calls", 1, job, ddbleaseotel.AttrOperation.String("UpdateItem"), ddbleaseotel.AttrOutcome.String("ok"))
	c.want("ddblease.dynamodb.calls", 1, job, ddbleaseotel.AttrOperation.String("UpdateItem"), ddbleaseotel.AttrOutcome.String("in_doubt"))
	if n, sum := c.histogram("ddblease.heartbeat.duration", job); n != 2 || sum < 0.039 || sum > 0.041 {
		t.Errorf("heartbeat.duration: count %d sum %v, want 2 and 0.04", n, sum)
	}
	if n, sum := c.histogram("ddblease.heartbeat.margin", job); n != 2 || sum != 3.5 {
		t.Errorf("heartbeat.margin: count %d sum %v, want 2 and 3.5", n, sum)
	}

	// a resigns, b takes over: one hand-over seen by b.
	ev(a, ddblease.Event{Kind: ddblease.EventDraining, Fence: 7})
	ev(a, ddblease.Event{Kind: ddblease.EventResigned, Fence: 7})
	ev(a, ddblease.Event{Kind: ddblease.EventRetry, Op: "resign", Fence: 7, Err: fmt.Errorf("resign: %w", &types.ProvisionedThroughputExceededException{})})
	c.collect()
	c.want("ddblease.leader", 0, job, ownA)
	c.want("ddblease.fence", 7, job, ownA)
	ev(a, ddblease.Event{Kind: ddblease.EventStopped})
	ev(nil, ddblease.Event{Kind: ddblease.EventAcquired, Fence: 8})
	// b is deposed, then loses at its deadline, then sees c.
	ev(nil, ddblease.Event{Kind: ddblease.EventLost, Fence: 8, Reason: ddblease.LossDeposed})
	ev(nil, ddblease.Event{Kind: ddblease.EventLeaderSeen, Holder: "c", Fence: 9})
	ev(nil, ddblease.Event{Kind: ddblease.EventLeaderSeen, Holder: "", Fence: 9}) // ignored
	// job runs, slots, a guard.
	ev(nil, ddblease.Event{Kind: ddblease.EventRunFinished, Status: ddblease.RunSucceeded, Duration: 3 * time.Second})
	ev(nil, ddblease.Event{Kind: ddblease.EventRunFinished, Status: ddblease.RunFailed, Duration: time.Second})
	ev(nil, ddblease.Event{Kind: ddblease.EventSlotsMissed, Missed: 4})
	ev(nil, ddblease.Event{Kind: ddblease.EventSlotsMissed, Missed: -1})
	ev(nil, ddblease.Event{Kind: ddblease.EventStaleFence, Op: "Put", Fence: 7, Current: 9})
	c.collect()
	if _, ok := c.value("ddblease.leader", job, ownA); ok {
		t.Error("the gauge of an untracked handle outlived its campaign")
	}
	c.want("ddblease.leader", 0, job, ownB)
	c.want("ddblease.fence", 8, job, ownB)
	c.want("ddblease.acquisitions", 2, job)
	c.want("ddblease.handovers", 2, job) // a to b (taken by b), b to c
	c.want("ddblease.resignations", 1, job)
	c.want("ddblease.retries", 1, job, ddbleaseotel.AttrStep.String("resign"))
	c.want("ddblease.losses", 1, job, ddbleaseotel.AttrReason.String("deposed"))
	c.want("ddblease.runs", 1, job, ddbleaseotel.AttrStatus.String("succeeded"))
	c.want("ddblease.runs", 1, job, ddbleaseotel.AttrStatus.String("failed"))
	c.want("ddblease.slots.missed", 5, job)
	c.want("ddblease.guard.refusals", 1, job, ddbleaseotel.AttrGuardOp.String("Put"))
	if n, sum := c.histogram("ddblease.run.duration", job, ddbleaseotel.AttrStatus.String("succeeded")); n != 1 || sum != 3 {
		t.Errorf("run.duration: count %d sum %v, want 1 and 3", n, sum)
	}
	// The guard's event made no gauge series.
	if _, ok := c.value("ddblease.leader", job, ddbleaseotel.AttrOwner.String("")); ok {
		t.Error("a guard event made a leader gauge series")
	}
	if len(chained) != 11 {
		t.Errorf("the chained observer saw %d events, want 11: %v", len(chained), chained)
	}
}

func TestInstrumentChainsTheUserObserver(t *testing.T) {
	m, c := newMetrics(t)
	var seen []ddblease.EventKind
	var o ddblease.Options
	o.Observer = func(e ddblease.Event) { seen = append(seen, e.Kind) }
	m.Instrument(&o)
	o.Observer(ddblease.Event{Kind: ddblease.EventAcquired, Job: "billing", Owner: "a", Fence: 1})
	var g ddblease.GuardOptions
	m.InstrumentGuard(&g)
	g.Observer(ddblease.Event{Kind: ddblease.EventStaleFence, Job: "billing", Op: "Check"})
	c.collect()
	c.want("ddblease.acquisitions", 1, job)
	c.want("ddblease.guard.refusals", 1, job, ddbleaseotel.AttrGuardOp.String("Check"))
	if len(seen) != 1 || seen[0] != ddblease.EventAcquired {
		t.Errorf("user observer saw %v", seen)
	}
}

// A pool's membership retries (no job) are counted under the pool's name,
// not under an empty job.
func TestPoolMembershipRetriesNameThePool(t *testing.T) {
	m, c := newMetrics(t)
	m.Observe(ddblease.Event{Kind: ddblease.EventRetry, Pool: "reports", Owner: "a", Op: "membership", Err: errors.New("reset")})
	c.collect()
	c.want("ddblease.retries", 1, ddbleaseotel.AttrPool.String("reports"), ddbleaseotel.AttrStep.String("membership"))
	if _, ok := c.value("ddblease.retries", ddbleaseotel.AttrJob.String(""), ddbleaseotel.AttrStep.String("membership")); ok {
		t.Error("a membership retry was counted under an empty job")
	}
}

// TestConcurrentUse records from many goroutines while collecting; run
// with -race.
func TestConcurrentUse(t *testing.T) {
	m, c := newMetrics(t)
	const workers, each = 8, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("o%d", w)
			for i := range each {
				m.Observe(ddblease.Event{Kind: ddblease.EventAcquired, Job: "billing", Owner: owner, Fence: int64(i)})
				m.Observe(ddblease.Event{Kind: ddblease.EventCall, Job: "billing", Owner: owner, Op: "GetItem", Outcome: ddblease.CallOK})
				m.Observe(ddblease.Event{Kind: ddblease.EventLost, Job: "billing", Owner: owner, Reason: ddblease.LossDeadline})
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var rm metricdata.ResourceMetrics
		for range 20 {
			_ = c.reader.Collect(context.Background(), &rm)
		}
	}()
	wg.Wait()
	<-done
	c.collect()
	c.want("ddblease.acquisitions", workers*each, job)
	c.want("ddblease.losses", workers*each, job, ddbleaseotel.AttrReason.String("deadline"))
	c.want("ddblease.dynamodb.calls", workers*each, job, ddbleaseotel.AttrOperation.String("GetItem"), ddbleaseotel.AttrOutcome.String("ok"))
	for w := range workers {
		c.want("ddblease.leader", 0, job, ddbleaseotel.AttrOwner.String(fmt.Sprintf("o%d", w)))
	}
}

func TestNewNilProvider(t *testing.T) {
	if _, err := ddbleaseotel.New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
}

// BenchmarkObserveCall measures the cost a Metrics adds to each DynamoDB
// request (an EventCall: a counter and a histogram), with the SDK.
func BenchmarkObserveCall(b *testing.B) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	m, err := ddbleaseotel.New(mp)
	if err != nil {
		b.Fatal(err)
	}
	e := ddblease.Event{Kind: ddblease.EventCall, Job: "billing", Owner: "a", Op: "GetItem", Outcome: ddblease.CallOK, Latency: 3 * time.Millisecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Observe(e)
		}
	})
}
