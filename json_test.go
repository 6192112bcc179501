package ddblease_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The types an operator's tools print as JSON (ddblease status --json and
// the like) use the field names of the command's own JSON output:
// lowerCamelCase, RFC 3339 times, durations as numbers of seconds with
// the unit in the field's name (as Prometheus and kubectl do), no zero
// time.
func TestJSONFieldNames(t *testing.T) {
	at := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	rec := ddblease.Record{Owner: "task-1", Fence: 7, ExpiresAt: at.Add(30 * time.Second), Duration: 30 * time.Second,
		AcquiredAt: at, RenewedAt: at.Add(10 * time.Second),
		Control: ddblease.Control{Paused: true, PausedBy: "ops", PausedAt: at, ResignFence: 7, ResignBy: "ops",
			ResignAt: at, Triggers: 2}, LastFailedRun: "2026-11-30T01:00:00Z"}
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"State", ddblease.State{Job: "billing", Owner: "task-1", Leader: true, Fence: 7, AcquiredAt: at,
			RenewedAt: at, Deadline: at.Add(27 * time.Second)},
			`{"job":"billing","owner":"task-1","leader":true,"fence":7,"acquiredAt":"2026-11-30T02:00:00Z",` +
				`"renewedAt":"2026-11-30T02:00:00Z","deadline":"2026-11-30T02:00:27Z"}`},
		{"State of a standby", ddblease.State{Job: "billing", Owner: "task-2"},
			`{"job":"billing","owner":"task-2","leader":false,"fence":0}`},
		{"JobStatus", ddblease.JobStatus{Job: "billing", Lease: rec},
			`{"job":"billing","lease":{"owner":"task-1","fence":7,"expiresAt":"2026-11-30T02:00:30Z",` +
				`"acquiredAt":"2026-11-30T02:00:00Z","renewedAt":"2026-11-30T02:00:10Z","draining":false,` +
				`"control":{"paused":true,"pausedBy":"ops","pausedAt":"2026-11-30T02:00:00Z","resignRequestedFence":7,` +
				`"resignRequestedBy":"ops","resignRequestedAt":"2026-11-30T02:00:00Z","pendingTriggers":2},` +
				`"lastFailedRun":"2026-11-30T01:00:00Z","leaseDurationSeconds":30}}`},
		{"a Record of a lease of 1.5s", ddblease.Record{Owner: "task-1", Fence: 1, Duration: 1500 * time.Millisecond},
			`{"owner":"task-1","fence":1,"draining":false,"control":{"paused":false},"leaseDurationSeconds":1.5}`},
		{"a released Record", ddblease.Record{Owner: "task-1", Fence: 8,
			Control: ddblease.Control{ReleasedFence: 7, ReleasedBy: "ops", ReleasedAt: at, ResumedBy: "ops", ResumedAt: at,
				CatchUpPending: true}},
			`{"owner":"task-1","fence":8,"draining":false,"control":{"paused":false,"resumedBy":"ops",` +
				`"resumedAt":"2026-11-30T02:00:00Z","catchUpPending":true,"releasedFence":7,"releasedBy":"ops",` +
				`"releasedAt":"2026-11-30T02:00:00Z"}}`},
		{"RunRecord", ddblease.RunRecord{Job: "billing", Slot: at, Fence: 7, Owner: "task-1", Status: ddblease.RunFailed,
			StartedAt: at, FinishedAt: at.Add(time.Second), Error: "boom", Claims: 2, Missed: 3, AbandonedBy: 0,
			ExpiresAt: at.Add(720 * time.Hour), Trigger: "00000000000000aa"},
			`{"job":"billing","slot":"2026-11-30T02:00:00Z","fence":7,"owner":"task-1","status":"failed",` +
				`"startedAt":"2026-11-30T02:00:00Z","finishedAt":"2026-11-30T02:00:01Z","error":"boom","claims":2,` +
				`"missed":3,"expiresAt":"2026-12-30T02:00:00Z","trigger":"00000000000000aa"}`},
		{"a running RunRecord", ddblease.RunRecord{Job: "billing", Slot: at, Fence: 7, Owner: "task-1",
			Status: ddblease.RunRunning, StartedAt: at, Claims: 1, MissedUnknown: true},
			`{"job":"billing","slot":"2026-11-30T02:00:00Z","fence":7,"owner":"task-1","status":"running",` +
				`"startedAt":"2026-11-30T02:00:00Z","claims":1,"missedUnknown":true}`},
		{"Trigger", ddblease.Trigger{Job: "billing", ID: "00000000000000aa", At: at},
			`{"job":"billing","id":"00000000000000aa","at":"2026-11-30T02:00:00Z"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.v)
			require.NoError(t, err)
			assert.JSONEq(t, tc.want, string(b))
		})
	}

	// A Record decodes from its JSON form, lease duration included.
	b, err := json.Marshal(rec)
	require.NoError(t, err)
	var back ddblease.Record
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, rec, back)
	var half ddblease.Record
	require.NoError(t, json.Unmarshal([]byte(`{"owner":"a","fence":1,"leaseDurationSeconds":0.25}`), &half))
	assert.Equal(t, 250*time.Millisecond, half.Duration)
	for _, bad := range []string{`{"leaseDurationSeconds":"30s"}`, `{"leaseDurationSeconds":-1}`, `{"leaseDurationSeconds":1e300}`} {
		assert.Error(t, json.Unmarshal([]byte(bad), &back), bad)
	}
}
