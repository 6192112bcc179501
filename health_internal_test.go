package ddblease

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/stretchr/testify/assert"
)

// TestHealthVerdicts feeds sequences of events to the health tracker and
// checks the verdict at a given time after the last; the end-to-end tests
// in health_test.go drive it through a real Lease.
func TestHealthVerdicts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	schema := fmt.Errorf("poll: operation error DynamoDB: GetItem, RequestID: %s: %w", "r1",
		&smithyErr{code: "ValidationException"})
	schema2 := fmt.Errorf("poll: operation error DynamoDB: GetItem, RequestID: %s: %w", "r2",
		&smithyErr{code: "ValidationException"})
	throttled := &types.ProvisionedThroughputExceededException{}
	reset := fmt.Errorf("heartbeat: %w", errors.New("connection reset by peer"))

	for _, tc := range []struct {
		name    string
		events  []Event
		now     float64
		healthy bool
	}{
		{"nothing happened", nil, 100, true},
		{"leader renewing", []Event{{Kind: EventAcquired, Time: at(0)}, {Kind: EventRenewed, Time: at(1)}}, 2.9, true},
		{"leader overdue", []Event{{Kind: EventAcquired, Time: at(0)}, {Kind: EventRenewed, Time: at(1)}}, 3.1, false},
		{"leader lost", []Event{{Kind: EventAcquired, Time: at(0)}, {Kind: EventLost, Time: at(2.7)}}, 100, true},
		{"leader resigned", []Event{{Kind: EventAcquired, Time: at(0)}, {Kind: EventResigned, Time: at(1)}}, 100, true},
		{"run returned while leading", []Event{{Kind: EventAcquired, Time: at(0)}, {Kind: EventStopped, Time: at(1)}}, 100, true},
		{"run cancelled", []Event{{Kind: EventRetry, Op: "poll", Err: schema, Time: at(0)},
			{Kind: EventStopped, Err: context.Canceled, Time: at(0.5)}}, 100, true},
		{"same error within tolerance", []Event{
			{Kind: EventCall, Op: "GetItem", Outcome: CallError, Time: at(0)},
			{Kind: EventRetry, Op: "poll", Err: schema, Time: at(0)},
			{Kind: EventCall, Op: "GetItem", Outcome: CallError, Time: at(0.5)},
			{Kind: EventRetry, Op: "poll", Err: schema2, Time: at(0.5)}}, 0.9, true},
		{"same error beyond tolerance", []Event{
			{Kind: EventCall, Op: "GetItem", Outcome: CallError, Time: at(0)},
			{Kind: EventRetry, Op: "poll", Err: schema, Time: at(0)},
			{Kind: EventCall, Op: "GetItem", Outcome: CallError, Time: at(0.5)},
			{Kind: EventRetry, Op: "poll", Err: schema2, Time: at(0.5)}}, 1.1, false},
		{"the failed request succeeded since", []Event{
			{Kind: EventCall, Op: "GetItem", Outcome: CallError, Time: at(0)},
			{Kind: EventRetry, Op: "poll", Err: schema, Time: at(0)},
			{Kind: EventCall, Op: "GetItem", Outcome: CallOK, Time: at(0.5)}}, 100, true},
		{"another request succeeded since", []Event{
			{Kind: EventCall, Op: "UpdateItem", Outcome: CallError, Time: at(0)},
			{Kind: EventRetry, Op: "acquire", Err: schema, Time: at(0)},
			{Kind: EventCall, Op: "GetItem", Outcome: CallOK, Time: at(0.5)}}, 1.1, false},
		{"the error changed", []Event{
			{Kind: EventRetry, Op: "poll", Err: schema, Time: at(0)},
			{Kind: EventRetry, Op: "poll", Err: throttled, Time: at(0.5)}}, 1.1, true},
		{"the step changed", []Event{
			{Kind: EventRetry, Op: "poll", Err: reset, Time: at(0)},
			{Kind: EventRetry, Op: "acquire", Err: reset, Time: at(0.5)}}, 1.1, true},
		{"run returned an error", []Event{{Kind: EventStopped, Err: schema, Time: at(0)}}, 1.1, false},
		{"run returned an error, then led", []Event{{Kind: EventStopped, Err: schema, Time: at(0)},
			{Kind: EventCampaign, Time: at(0.5)}, {Kind: EventAcquired, Time: at(0.6)}}, 1.1, true},
		{"heartbeats failed until the deadline", []Event{{Kind: EventAcquired, Time: at(0)},
			{Kind: EventRetry, Op: "heartbeat", Err: reset, Time: at(1)},
			{Kind: EventLost, Reason: LossDeadline, Time: at(2.7)}}, 3.1, true},
		{"heartbeats failing", []Event{{Kind: EventAcquired, Time: at(0)},
			{Kind: EventRetry, Op: "heartbeat", Err: reset, Time: at(1)},
			{Kind: EventRetry, Op: "heartbeat", Err: reset, Time: at(1.5)}}, 3.1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h health
			for _, e := range tc.events {
				h.observe(e)
			}
			err := h.check(at(tc.now), "job", time.Second, time.Second, 0, time.Time{})
			if tc.healthy {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrUnhealthy)
				assert.NotContains(t, err.Error(), "\n")
			}
		})
	}
}

type smithyErr struct{ code string }

func (e *smithyErr) Error() string                 { return e.code + ": bad" }
func (e *smithyErr) ErrorCode() string             { return e.code }
func (e *smithyErr) ErrorMessage() string          { return "bad" }
func (e *smithyErr) ErrorFault() smithy.ErrorFault { return smithy.FaultClient }

// TestHealthFailedRunsStreak: the runs a handle recorded, as events, and
// the verdict with FailedRuns 2.
func TestHealthFailedRunsStreak(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	run := func(s float64, st RunStatus) Event {
		var err error
		if st == RunFailed {
			err = errors.New("boom")
		}
		return Event{Kind: EventRunFinished, Status: st, Err: err, Time: t0.Add(time.Duration(s * float64(time.Second)))}
	}
	for _, tc := range []struct {
		name    string
		events  []Event
		healthy bool
	}{
		{"none", nil, true},
		{"one failed", []Event{run(1, RunFailed)}, true},
		{"two failed", []Event{run(1, RunFailed), run(2, RunFailed)}, false},
		{"a success between", []Event{run(1, RunFailed), run(2, RunSucceeded), run(3, RunFailed)}, true},
		{"a success after", []Event{run(1, RunFailed), run(2, RunFailed), run(3, RunSucceeded)}, true},
		{"a skip does not end the streak", []Event{run(1, RunFailed), run(2, RunSkippedByPause), run(3, RunFailed)}, false},
		{"the tenure ends, the streak stays", []Event{run(1, RunFailed), run(2, RunFailed),
			{Kind: EventLost, Reason: LossDeposed, Time: t0.Add(3 * time.Second)}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h health
			for _, e := range tc.events {
				h.observe(e)
			}
			err := h.check(t0.Add(10*time.Second), "job", time.Second, time.Second, 2, time.Time{})
			if tc.healthy {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, ErrUnhealthy)
			assert.Contains(t, err.Error(), `job "job": its last 2 runs failed (the latest`)
			assert.Contains(t, err.Error(), "boom")
			assert.NoError(t, h.check(t0.Add(10*time.Second), "job", time.Second, time.Second, 0, time.Time{}), "not judged")
		})
	}
}
