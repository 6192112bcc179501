// Package ddbleaseotel records the events of ddblease leases and guards as
// OpenTelemetry metrics: which replica leads, how close a leader came to
// losing its lease, how often leadership changed, DynamoDB requests by
// outcome, job runs by status, slots missed and stale writes refused.
//
// It depends only on the OpenTelemetry metrics API; the application picks
// the SDK and the exporter (Prometheus, OTLP). Wire it as the observer of
// each handle:
//
//	m, err := ddbleaseotel.New(meterProvider)
//	l, err := ddblease.New(db, table, "billing", m.Instrument)
//	defer m.Track(l)() // the leader and fence gauges read the lease itself
//	g, err := ddblease.NewGuard(db, table, "billing", m.InstrumentGuard)
//
// One Metrics value may serve any number of leases and guards, from any
// goroutines. The instruments, their units and attributes are listed in
// docs/observability.md.
package ddbleaseotel

import (
	"context"
	"errors"
	"sync"

	"github.com/ddblease/ddblease"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the meter Metrics uses.
const ScopeName = "github.com/ddblease/ddblease/ddbleaseotel"

// Attribute keys of the instruments.
const (
	// AttrJob is the job name. (Not "job": Prometheus reserves that label
	// for the scrape job and would rename ours "exported_job".)
	AttrJob = attribute.Key("ddblease.job")
	// AttrOwner is the handle's owner id, on the leader and fence gauges.
	AttrOwner = attribute.Key("ddblease.owner")
	// AttrReason is the LossReason of ddblease.losses.
	AttrReason = attribute.Key("ddblease.loss.reason")
	// AttrOperation is the DynamoDB operation, as in the database
	// semantic conventions.
	AttrOperation = attribute.Key("db.operation.name")
	// AttrOutcome is the CallOutcome of a DynamoDB request.
	AttrOutcome = attribute.Key("ddblease.call.outcome")
	// AttrStatus is the RunStatus of a job run.
	AttrStatus = attribute.Key("ddblease.run.status")
	// AttrStep is the step a retry repeats (poll, acquire, heartbeat, ...).
	AttrStep = attribute.Key("ddblease.step")
	// AttrGuardOp is the guard form that refused a write.
	AttrGuardOp = attribute.Key("ddblease.guard.operation")
	// AttrPool is the pool name, in place of AttrJob, on the calls and
	// retries of a pool's membership (its member item's renewal and
	// reads), which no one job makes.
	AttrPool = attribute.Key("ddblease.pool")
)

// Metrics turns ddblease events into OpenTelemetry instruments. Its
// methods are safe for concurrent use and never block beyond a short
// critical section, as an observer must not.
type Metrics struct {
	acquisitions, losses, resignations, handovers metric.Int64Counter
	calls, runs, slotsMissed, refusals, retries   metric.Int64Counter
	heartbeat, margin, callDuration, runDuration  metric.Float64Histogram
	leader, fence                                 metric.Int64ObservableGauge
	reg                                           metric.Registration

	attrMu sync.RWMutex
	attrs  map[attrKey]metric.MeasurementOption // attribute sets, by job and values

	mu      sync.Mutex
	handles map[handleKey]*handle
}

type handleKey struct{ job, owner string }

// handle is what Metrics knows of one lease handle.
type handle struct {
	lease      *ddblease.Lease // set by Track
	leader     bool            // from the events, for an untracked lease
	fence      int64
	lastHolder string // the last holder this handle saw, itself included
}

// Second-based bucket boundaries: requests and heartbeats take
// milliseconds; margins are a fraction of a lease (30s by default); runs
// last up to hours.
var (
	latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	marginBuckets  = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 25, 30, 60, 120, 300}
	runBuckets     = []float64{0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200}
)

// New creates the instruments on a meter of mp named ScopeName.
func New(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		return nil, errors.New("ddbleaseotel: MeterProvider is nil")
	}
	mt := mp.Meter(ScopeName)
	m := &Metrics{handles: map[handleKey]*handle{}, attrs: map[attrKey]metric.MeasurementOption{}}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := mt.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := mt.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	m.acquisitions = counter("ddblease.acquisitions", "{acquisition}", "Tenures this replica began.")
	m.losses = counter("ddblease.losses", "{loss}", "Tenures that ended other than by this replica resigning, by reason.")
	m.resignations = counter("ddblease.resignations", "{resignation}", "Tenures this replica gave up (a resignation write that fails is a retry of step resign).")
	m.handovers = counter("ddblease.handovers", "{handover}", "Changes of holder this replica saw: another holder replaced, or the lease taken over by this replica.")
	m.calls = counter("ddblease.dynamodb.calls", "{call}", "DynamoDB requests, by operation and outcome.")
	m.runs = counter("ddblease.runs", "{run}", "Job runs whose outcome was recorded, by status.")
	m.slotsMissed = counter("ddblease.slots.missed", "{slot}", "Schedule slots skipped by a catch-up that no tenure ran (one when the number is unknown).")
	m.refusals = counter("ddblease.guard.refusals", "{refusal}", "Writes a guard refused for a stale fence, by guard operation.")
	m.retries = counter("ddblease.retries", "{retry}", "Failed steps that will be tried again, by step.")
	m.heartbeat = histogram("ddblease.heartbeat.duration", "Duration of the write of each successful renewal.", latencyBuckets)
	m.margin = histogram("ddblease.heartbeat.margin", "Time the tenure had left before its local deadline when a renewal was confirmed.", marginBuckets)
	m.callDuration = histogram("ddblease.dynamodb.call.duration", "Duration of DynamoDB requests, by operation and outcome.", latencyBuckets)
	m.runDuration = histogram("ddblease.run.duration", "Duration of job runs from the claim to the recorded outcome, by status.", runBuckets)
	var err error
	m.leader, err = mt.Int64ObservableGauge("ddblease.leader", metric.WithUnit("{leader}"),
		metric.WithDescription("1 while this replica leads the job, else 0."))
	errs = append(errs, err)
	m.fence, err = mt.Int64ObservableGauge("ddblease.fence", metric.WithUnit("{fence}"),
		metric.WithDescription("Fencing token of this replica's current or last tenure; 0 if none."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m.reg, err = mt.RegisterCallback(m.observeGauges, m.leader, m.fence)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Close unregisters the gauges' callback; the counters stay usable.
func (m *Metrics) Close() error { return m.reg.Unregister() }

// Instrument is an option for ddblease.New: it makes m the observer of the
// lease, after any Observer set by an earlier option, which it still calls.
func (m *Metrics) Instrument(o *ddblease.Options) { o.Observer = m.Chain(o.Observer) }

// InstrumentGuard is an option for ddblease.NewGuard, as Instrument is for
// ddblease.New.
func (m *Metrics) InstrumentGuard(o *ddblease.GuardOptions) { o.Observer = m.Chain(o.Observer) }

// Chain returns an observer that records each event, then passes it to
// next, if next is not nil.
func (m *Metrics) Chain(next func(ddblease.Event)) func(ddblease.Event) {
	if next == nil {
		return m.Observe
	}
	return func(e ddblease.Event) {
		m.Observe(e)
		next(e)
	}
}

// Track makes the leader and fence gauges of l read l.State at each
// collection, so that they fall to 0 when the tenure ends at its deadline
// even before an event says so. The returned function stops tracking l and
// removes its gauges. Untracked leases are reported from their events, from
// the start of their campaign (or acquisition) until Run or RunSchedule
// returns.
func (m *Metrics) Track(l *ddblease.Lease) (untrack func()) {
	k := handleKey{l.Job(), l.Owner()}
	m.mu.Lock()
	m.handleLocked(k).lease = l
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		if h := m.handles[k]; h != nil && h.lease == l {
			delete(m.handles, k)
		}
		m.mu.Unlock()
	}
}

func (m *Metrics) handleLocked(k handleKey) *handle {
	h := m.handles[k]
	if h == nil {
		h = &handle{}
		m.handles[k] = h
	}
	return h
}

// Observe records one event. It is the observer Instrument installs.
func (m *Metrics) Observe(e ddblease.Event) {
	ctx := context.Background()
	job := m.attrs1(e, "", "")
	switch e.Kind {
	case ddblease.EventCampaign:
		// Start the counters at zero, so that rates and increases are
		// defined before the first change.
		m.acquisitions.Add(ctx, 0, job)
		m.resignations.Add(ctx, 0, job)
		m.handovers.Add(ctx, 0, job)
		m.update(e, func(*handle) bool { return false })
	case ddblease.EventAcquired:
		handover := m.update(e, func(h *handle) bool {
			h.leader, h.fence = true, e.Fence
			changed := h.lastHolder != "" && h.lastHolder != e.Owner
			h.lastHolder = e.Owner
			return changed
		})
		m.acquisitions.Add(ctx, 1, job)
		if handover {
			m.handovers.Add(ctx, 1, job)
		}
	case ddblease.EventRenewed:
		m.update(e, func(h *handle) bool { h.leader, h.fence = true, e.Fence; return false })
		m.heartbeat.Record(ctx, e.Latency.Seconds(), job)
		m.margin.Record(ctx, e.Margin.Seconds(), job)
	case ddblease.EventLost:
		m.update(e, func(h *handle) bool { h.leader = false; return false })
		m.losses.Add(ctx, 1, m.attrs1(e, AttrReason, string(e.Reason)))
	case ddblease.EventResigned:
		m.update(e, func(h *handle) bool { h.leader = false; return false })
		m.resignations.Add(ctx, 1, job)
	case ddblease.EventStopped:
		// An untracked handle's gauges end with its campaign, so that a
		// process that makes many handles does not accumulate series.
		if e.Owner != "" {
			m.mu.Lock()
			k := handleKey{e.Job, e.Owner}
			if h := m.handles[k]; h != nil {
				h.leader = false
				if h.lease == nil {
					delete(m.handles, k)
				}
			}
			m.mu.Unlock()
		}
	case ddblease.EventLeaderSeen:
		if e.Holder == "" {
			return
		}
		if m.update(e, func(h *handle) bool {
			changed := h.lastHolder != "" && h.lastHolder != e.Holder
			h.lastHolder = e.Holder
			return changed
		}) {
			m.handovers.Add(ctx, 1, job)
		}
	case ddblease.EventCall:
		a := m.attrs2(e, AttrOperation, e.Op, AttrOutcome, string(e.Outcome))
		m.calls.Add(ctx, 1, a)
		m.callDuration.Record(ctx, e.Latency.Seconds(), a)
	case ddblease.EventRetry:
		m.retries.Add(ctx, 1, m.attrs1(e, AttrStep, e.Op))
	case ddblease.EventRunFinished:
		a := m.attrs1(e, AttrStatus, string(e.Status))
		m.runs.Add(ctx, 1, a)
		m.runDuration.Record(ctx, e.Duration.Seconds(), a)
	case ddblease.EventSlotsMissed:
		n := int64(e.Missed)
		if n < 0 {
			n = 1
		}
		m.slotsMissed.Add(ctx, n, job)
	case ddblease.EventStaleFence:
		m.refusals.Add(ctx, 1, m.attrs1(e, AttrGuardOp, e.Op))
	}
}

// update applies fn to the state of e's handle under m.mu and returns its
// result. Events without an owner (a Guard's) have no handle.
func (m *Metrics) update(e ddblease.Event, fn func(*handle) bool) bool {
	if e.Owner == "" {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return fn(m.handleLocked(handleKey{e.Job, e.Owner}))
}

func (m *Metrics) observeGauges(_ context.Context, o metric.Observer) error {
	type row struct {
		k      handleKey
		lease  *ddblease.Lease
		leader bool
		fence  int64
	}
	m.mu.Lock()
	rows := make([]row, 0, len(m.handles))
	for k, h := range m.handles {
		rows = append(rows, row{k, h.lease, h.leader, h.fence})
	}
	m.mu.Unlock()
	for _, r := range rows {
		if r.lease != nil { // read outside m.mu: State takes the lease's lock
			s := r.lease.State()
			r.leader, r.fence = s.Leader, s.Fence
		}
		a := metric.WithAttributeSet(attribute.NewSet(AttrJob.String(r.k.job), AttrOwner.String(r.k.owner)))
		v := int64(0)
		if r.leader {
			v = 1
		}
		o.ObserveInt64(m.leader, v, a)
		o.ObserveInt64(m.fence, r.fence, a)
	}
	return nil
}

type attrKey struct {
	job, pool, a, b string
	k1, k2          attribute.Key
}

// subject returns the attribute key naming what e concerns: its job, or,
// for a pool's membership (no job), its pool.
func subject(e ddblease.Event) attrKey {
	if e.Job == "" && e.Pool != "" {
		return attrKey{pool: e.Pool}
	}
	return attrKey{job: e.Job}
}

// attrs1 returns the attribute set {subject, k=v}, or {subject} if k is "".
func (m *Metrics) attrs1(e ddblease.Event, k attribute.Key, v string) metric.MeasurementOption {
	a := subject(e)
	a.k1, a.a = k, v
	return m.attrSet(a)
}

// attrs2 returns the attribute set {subject, k1=v1, k2=v2}.
func (m *Metrics) attrs2(e ddblease.Event, k1 attribute.Key, v1 string, k2 attribute.Key, v2 string) metric.MeasurementOption {
	a := subject(e)
	a.k1, a.a, a.k2, a.b = k1, v1, k2, v2
	return m.attrSet(a)
}

// attrSet returns the attribute set k stands for, made once.
func (m *Metrics) attrSet(k attrKey) metric.MeasurementOption {
	m.attrMu.RLock()
	a, ok := m.attrs[k]
	m.attrMu.RUnlock()
	if ok {
		return a
	}
	kv := []attribute.KeyValue{AttrJob.String(k.job)}
	if k.pool != "" {
		kv = []attribute.KeyValue{AttrPool.String(k.pool)}
	}
	if k.k1 != "" {
		kv = append(kv, k.k1.String(k.a))
	}
	if k.k2 != "" {
		kv = append(kv, k.k2.String(k.b))
	}
	a = metric.WithAttributeSet(attribute.NewSet(kv...))
	m.attrMu.Lock()
	m.attrs[k] = a
	m.attrMu.Unlock()
	return a
}
