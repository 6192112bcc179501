package ddblease_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// taskMetadata is the start of the document the ECS task metadata
// endpoint (version 4) serves at ${ECS_CONTAINER_METADATA_URI_V4}/task, as
// documented in the Amazon ECS developer guide.
const taskMetadata = `{
  "Cluster": "arn:aws:ecs:us-west-2:111122223333:cluster/default",
  "TaskARN": "arn:aws:ecs:us-west-2:111122223333:task/default/158d1c8083dd49d6b527399fd6414f5c",
  "Family": "curltest",
  "ServiceName": "MyService",
  "Revision": "26",
  "DesiredStatus": "RUNNING",
  "KnownStatus": "RUNNING",
  "PullStartedAt": "2020-10-02T00:43:06.202617438Z",
  "PullStoppedAt": "2020-10-02T00:43:06.31288465Z",
  "AvailabilityZone": "us-west-2d",
  "LaunchType": "EC2",
  "Containers": [{"DockerId": "598cba581fe3f939459eaba1e071d5c93bb2c49b7d1ba7db6bb19deeb70d8e38", "Name": "~internal~ecs~pause"}]
}`

var suffix = regexp.MustCompile(`-[0-9a-f]{8}$`)

// clearOwnerEnv unsets the variables DefaultOwner reads, for this test.
func clearOwnerEnv(t *testing.T) {
	for _, k := range []string{"ECS_CONTAINER_METADATA_URI_V4", "POD_NAME", "POD_NAMESPACE", "KUBERNETES_SERVICE_HOST"} {
		t.Setenv(k, "")
		require.NoError(t, os.Unsetenv(k))
	}
}

func TestDefaultOwnerECS(t *testing.T) {
	clearOwnerEnv(t)
	var paths []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, taskMetadata)
	}))
	defer ts.Close()
	t.Setenv("ECS_CONTAINER_METADATA_URI_V4", ts.URL+"/v4/0123abcd-metadata")
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1") // ECS wins

	a, b := ddblease.DefaultOwner(context.Background()), ddblease.DefaultOwner(context.Background())
	const arn = "arn:aws:ecs:us-west-2:111122223333:task/default/158d1c8083dd49d6b527399fd6414f5c"
	assert.True(t, strings.HasPrefix(a, arn+"-"), a)
	assert.Regexp(t, suffix, a)
	assert.Equal(t, a, b, "one process, one owner id")
	assert.Equal(t, []string{"/v4/0123abcd-metadata/task", "/v4/0123abcd-metadata/task"}, paths)
}

func TestDefaultOwnerECSFallsBack(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	fallback := regexp.MustCompile("^" + regexp.QuoteMeta(fmt.Sprintf("%s-%d-", host, os.Getpid())) + "[0-9a-f]{8}$")

	slowDone := make(chan struct{})
	defer close(slowDone)
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"slow", func(w http.ResponseWriter, r *http.Request) {
			select { // answers only after the owner lookup gave up
			case <-slowDone:
			case <-r.Context().Done():
			}
		}},
		{"status 500", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "agent restarting", http.StatusInternalServerError)
		}},
		{"not JSON", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "<html>") }},
		{"no TaskARN", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"Cluster":"default"}`) }},
		{"control character", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"TaskARN":"arn:aws:ecs:\u0007task"}`) }},
		{"connection closed", func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearOwnerEnv(t)
			ts := httptest.NewServer(tc.handler)
			defer ts.Close()
			t.Setenv("ECS_CONTAINER_METADATA_URI_V4", ts.URL)
			start := time.Now()
			owner := ddblease.DefaultOwner(context.Background())
			assert.Regexp(t, fallback, owner)
			if tc.name == "slow" {
				// Bounded by the lookup's own timeout (one second), not
				// by the server; the margin is for a loaded machine.
				assert.Less(t, time.Since(start), 30*time.Second)
			}
		})
	}

	t.Run("unreachable", func(t *testing.T) {
		clearOwnerEnv(t)
		ts := httptest.NewServer(http.NotFoundHandler())
		url := ts.URL
		ts.Close()
		t.Setenv("ECS_CONTAINER_METADATA_URI_V4", url)
		assert.Regexp(t, fallback, ddblease.DefaultOwner(context.Background()))
	})

	t.Run("cancelled context", func(t *testing.T) {
		clearOwnerEnv(t)
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, taskMetadata) }))
		defer ts.Close()
		t.Setenv("ECS_CONTAINER_METADATA_URI_V4", ts.URL)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.Regexp(t, fallback, ddblease.DefaultOwner(ctx))
	})
}

func TestDefaultOwnerKubernetes(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	for _, tc := range []struct {
		name      string
		pod, ns   string
		wantStart string
	}{
		{"downward API", "billing-7d9f6c-x2k4q", "", "billing-7d9f6c-x2k4q-"},
		{"with namespace", "billing-7d9f6c-x2k4q", "prod", "prod/billing-7d9f6c-x2k4q-"},
		{"hostname", "", "", host + "-"},
		{"blank pod name", "  ", "", host + "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearOwnerEnv(t)
			t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
			t.Setenv("POD_NAME", tc.pod)
			t.Setenv("POD_NAMESPACE", tc.ns)
			owner := ddblease.DefaultOwner(context.Background())
			assert.True(t, strings.HasPrefix(owner, tc.wantStart), "%q does not start with %q", owner, tc.wantStart)
			assert.Regexp(t, regexp.MustCompile("^"+regexp.QuoteMeta(tc.wantStart)+"[0-9a-f]{8}$"), owner)
		})
	}
}

func TestDefaultOwnerElsewhere(t *testing.T) {
	clearOwnerEnv(t)
	host, err := os.Hostname()
	require.NoError(t, err)
	owner := ddblease.DefaultOwner(context.Background())
	assert.Regexp(t, "^"+regexp.QuoteMeta(fmt.Sprintf("%s-%d-", host, os.Getpid()))+"[0-9a-f]{8}$", owner)

	// New's default is such an id, distinct per handle on one job.
	db := srv.Client(nil)
	table := "some-table-" + ddbtest.RandomID()
	a, err := ddblease.New(db, table, "job")
	require.NoError(t, err)
	b, err := ddblease.New(db, table, "job")
	require.NoError(t, err)
	assert.Regexp(t, suffix, a.Owner())
	assert.NotEqual(t, a.Owner(), b.Owner())
}

// The handles a process makes with the default owner share one owner id,
// so that an operator sees the process as one owner whatever jobs it
// leads; handles of the process that contend for one job (or a pool and a
// job of it) get numbered ids, and contend as two.
func TestDefaultOwnerOnePerProcess(t *testing.T) {
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	owner := func(l *ddblease.Lease, err error) string {
		t.Helper()
		require.NoError(t, err)
		return l.Owner()
	}
	process := ddblease.DefaultOwner(ctx)
	a := owner(ddblease.New(db, table, "billing"))
	assert.Equal(t, process, a, "the default owner is DefaultOwner's")
	assert.Equal(t, process, owner(ddblease.New(db, table, "report")), "another job, the same owner")
	other, err := ddblease.New(db, table, "billing", func(o *ddblease.Options) { o.Logger = quiet })
	require.NoError(t, err)
	assert.Equal(t, process+"-2", other.Owner(), "a second handle on one job")
	assert.Equal(t, process+"-3", owner(ddblease.New(db, table, "billing")), "a third")
	assert.Equal(t, process, owner(ddblease.New(db, "other-"+table, "billing")), "the same job in another table")

	pool, err := ddblease.NewPool(db, table, "tenants", []string{"t1", "report"})
	require.NoError(t, err)
	assert.Equal(t, process+"-2", pool.Lease("t1").Owner(), "the pool contends for report with a handle of the process")
	assert.Equal(t, process+"-3", owner(ddblease.New(db, table, "t1")))
	assert.Equal(t, process, owner(ddblease.New(db, table, "t2")))

	// Two handles on one job are two contenders: the second finds the lease
	// held by the first.
	first, err := ddblease.New(db, table, "billing", func(o *ddblease.Options) { o.Logger = quiet })
	require.NoError(t, err)
	_, err = first.TryAcquire(ctx)
	require.NoError(t, err)
	_, err = other.TryAcquire(ctx)
	var held *ddblease.HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, first.Owner(), held.Owner)
	assert.True(t, first.IsLeader())
	assert.False(t, other.IsLeader())
	require.NoError(t, first.Resign(ctx))
}
