package chaos

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
)

// ReplicaConfig is what a replica process is started with.
type ReplicaConfig struct {
	Name      string
	Endpoint  string // the replica's proxy
	Table     string // leases and job runs
	Sink      string // the side-effect sink
	Job       string
	Lease     time.Duration
	Heartbeat time.Duration
	Retry     time.Duration
	Skew      time.Duration
	Drain     time.Duration
	Call      time.Duration
	Slot      time.Duration // the schedule: Every(Slot)
	Work      time.Duration // how long a tick works before its side effect
	Offset    time.Duration // clock offset
	DriftPPM  int64         // clock rate error
	Events    string        // history file
}

// SinkKey is the sink item that collects a job's side effects.
func SinkKey(job string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "sink#" + job}}
}

// RunReplica runs one replica until SIGTERM: it campaigns for the job and,
// while it leads, fires the schedule's slots; each tick writes its side
// effect through the guard into the sink and finishes its run.
func RunReplica(cfg ReplicaConfig) error {
	rec, err := NewRecorder(cfg.Events, cfg.Name)
	if err != nil {
		return err
	}
	defer rec.Close()
	rec.Record(Event{Kind: EvStart})

	clock := Clock(cfg.Offset, cfg.DriftPPM)
	// Tenures as the public observer reports them; the deadline is read
	// from the lease's State, as a user's code would.
	var lease *ddblease.Lease
	observe := func(e ddblease.Event) {
		switch e.Kind {
		case ddblease.EventAcquired, ddblease.EventRenewed:
			if st := lease.State(); st.Leader && st.Fence == e.Fence {
				rec.Record(Event{Kind: EvTenure, Fence: e.Fence, Deadline: RealDeadline(st.Deadline, clock, cfg.DriftPPM).UnixNano()})
			}
		case ddblease.EventLost, ddblease.EventResigned:
			rec.Record(Event{Kind: EvEnded, Fence: e.Fence})
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	db := ddbtest.Endpoint(cfg.Endpoint).Client(nil)
	lease, err = ddblease.New(db, cfg.Table, cfg.Job, func(o *ddblease.Options) {
		o.Observer = observe
		o.Owner = cfg.Name
		o.LeaseDuration, o.HeartbeatInterval, o.RetryInterval = cfg.Lease, cfg.Heartbeat, cfg.Retry
		o.MaxClockSkew, o.DrainTimeout, o.CallTimeout = cfg.Skew, cfg.Drain, cfg.Call
		o.Now = clock
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	})
	if err != nil {
		return err
	}
	guard, err := ddblease.NewGuard(db, cfg.Table, cfg.Job)
	if err != nil {
		return err
	}
	err = lease.RunSchedule(ctx, ddblease.Every(cfg.Slot), func(ctx context.Context, run *ddblease.JobRun) error {
		slot := run.Slot().UTC().Format(time.RFC3339Nano)
		rec.Record(Event{Kind: EvRun, Fence: run.Fence(), Slot: slot})
		// Work, then write the effect even if leadership was lost
		// meanwhile: a paused leader wakes up and tries, and the guard
		// must refuse it.
		select {
		case <-time.After(cfg.Work):
		case <-ctx.Done():
		}
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*cfg.Call)
		effErr := sinkWrite(ectx, guard, cfg, run.Fence(), run.Slot())
		cancel()
		rec.Record(Event{Kind: EvEffect, Fence: run.Fence(), Slot: slot, OK: effErr == nil, Err: errText(effErr)})
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*cfg.Call)
		finErr := run.Finish(fctx, effErr)
		cancel()
		rec.Record(Event{Kind: EvFinished, Fence: run.Fence(), Slot: slot, OK: finErr == nil, Err: errText(finErr)})
		return effErr
	}, func(o *ddblease.JobOptions) {
		o.CatchUpWindow = 4 * cfg.Slot
		o.Retention = time.Hour
	})
	// Under faults a tick can overrun DrainTimeout (its writes retrying)
	// and a resignation can fail: both are reported, as documented, and the
	// lease then lapses at its expiry. The checker still checks that no one
	// else led while this replica believed it did.
	ok := err == nil || errors.Is(err, ddblease.ErrNotResigned) || errors.Is(err, ddblease.ErrDrainTimeout) ||
		errors.Is(err, context.Canceled) // stopped while every attempt was failing: reported, as documented
	rec.Record(Event{Kind: EvExit, OK: ok, Err: errText(err)})
	if ok {
		return nil
	}
	return err
}

// sinkWrite appends the tick's effect to the sink item, guarded by the
// fence high-water mark and deduplicated by slot: the item has one
// attribute per slot that has an effect.
func sinkWrite(ctx context.Context, g *ddblease.Guard, cfg ReplicaConfig, fence int64, at time.Time) error {
	slot := at.UTC().Format(time.RFC3339Nano)
	slotAttr := "s" + strconv.FormatInt(at.UnixNano(), 10)
	entry := &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
		"fence":   &types.AttributeValueMemberN{Value: strconv.FormatInt(fence, 10)},
		"slot":    &types.AttributeValueMemberS{Value: slot},
		"replica": &types.AttributeValueMemberS{Value: cfg.Name},
	}}
	_, err := g.Update(ctx, fence, &dynamodb.UpdateItemInput{
		TableName:                aws.String(cfg.Sink),
		Key:                      SinkKey(cfg.Job),
		UpdateExpression:         aws.String("SET #log = list_append(if_not_exists(#log, :empty), :entry), #slot = :f"),
		ConditionExpression:      aws.String("attribute_not_exists(#slot)"),
		ExpressionAttributeNames: map[string]string{"#log": "log", "#slot": slotAttr},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":empty": &types.AttributeValueMemberL{Value: []types.AttributeValue{}},
			":entry": &types.AttributeValueMemberL{Value: []types.AttributeValue{entry}},
			":f":     &types.AttributeValueMemberN{Value: strconv.FormatInt(fence, 10)},
		},
	})
	return err
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	var stale *ddblease.StaleFenceError
	if errors.As(err, &stale) {
		return "stale: " + err.Error()
	}
	return err.Error()
}
