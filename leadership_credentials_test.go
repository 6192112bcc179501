package ddblease_test

// A client that cannot sign its requests (no credentials, no region), as
// a user sees it: Run fails at once when nothing has ever reached the
// table, and rides it out as a transient failure once something has.

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errNoCredentials = errors.New("no credentials in this environment")

// credentials is a provider that fails while failing is set; its
// credentials expire at once, so that the SDK asks it for every request.
type credentials struct{ failing atomic.Bool }

func (c *credentials) Retrieve(context.Context) (aws.Credentials, error) {
	if c.failing.Load() {
		return aws.Credentials{}, errNoCredentials
	}
	return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", CanExpire: true, Expires: time.Now()}, nil
}

// clientWith returns a client of the test server with the given changes.
func clientWith(optFns ...func(*dynamodb.Options)) *dynamodb.Client {
	return dynamodb.New(srv.Client(nil).Options(), optFns...)
}

// A start that has never reached the table fails at once with the SDK's
// cause: without credentials, and without a region. Nothing is retried,
// nothing warned, and the health check reports the failure.
func TestRunFailsFastWhenTheClientCannotSign(t *testing.T) {
	t.Parallel()
	never := func(context.Context, int64) error {
		t.Error("fn called")
		return nil
	}
	table := srv.NewTable(t)
	creds := &credentials{}
	creds.failing.Store(true)
	for _, c := range []struct {
		name  string
		db    *dynamodb.Client
		check func(t *testing.T, err error)
	}{
		{"no credentials", clientWith(func(o *dynamodb.Options) { o.Credentials = creds }), func(t *testing.T, err error) {
			assert.ErrorIs(t, err, errNoCredentials)
		}},
		{"no region", clientWith(func(o *dynamodb.Options) { o.Region, o.BaseEndpoint = "", nil }), func(t *testing.T, err error) {
			assert.ErrorContains(t, err, "region")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// Had Run retried, it would have returned when this context
			// ended, with an error wrapping context.DeadlineExceeded.
			ctx := withTimeout(t, 10*time.Second)
			var logged countingHandler
			l := newLease(t, c.db, table, "job-"+c.name, fast("a"), func(o *ddblease.Options) { o.Logger = slog.New(&logged) })
			err := l.Run(ctx, never)
			require.Error(t, err)
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "Run retried until its context ended")
			assert.ErrorContains(t, err, table)
			c.check(t, err)
			assert.Zero(t, logged.warnings.Load(), "retried")
			assert.ErrorIs(t, l.CheckHealth(time.Nanosecond), ddblease.ErrUnhealthy)
		})
	}
}

// Credentials that fail after a successful start are a transient failure:
// the tenure ends at its deadline, the health check turns unhealthy, Run
// goes on campaigning and leads again once the credentials are back.
func TestCredentialsFailingAfterStartAreTransient(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 40*time.Second)
	table := srv.NewTable(t)
	creds := &credentials{}
	db := clientWith(func(o *dynamodb.Options) { o.Credentials = creds })
	l := newLease(t, db, table, "job", fast("a"))
	v := newLeaderView()
	stop := runAsync(ctx, l, v.fn)
	t.Cleanup(func() { _ = stop() })
	require.Equal(t, int64(1), receive(t, v.starts, "leads"))

	creds.failing.Store(true)
	eventually(t, "the tenure ends", func() bool { return !v.live() })
	assert.False(t, l.IsLeader())
	eventually(t, "the health check turns unhealthy", func() bool {
		return errors.Is(l.CheckHealth(100*time.Millisecond), ddblease.ErrUnhealthy)
	})
	assert.ErrorContains(t, l.CheckHealth(100*time.Millisecond), errNoCredentials.Error())

	creds.failing.Store(false)
	require.Equal(t, int64(2), receive(t, v.starts, "leads again"))
	assert.NoError(t, stop())
}
