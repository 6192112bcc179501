package ddblease_test

// A client that cannot sign its requests (no credentials, no region), as
// a user sees it: Run fails at once when nothing has ever reached the
// table, and rides it out as a transient failure once something has.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
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

// flakyCredentials is a provider whose n-th retrieval (from 1) fails with
// fail(ctx, n) when that is not nil, as a provider that fetches its
// credentials over the network (IMDS, the container endpoint, STS for a
// web identity) does while that network is not up. Its credentials expire
// at once, so that the SDK asks it for every request.
type flakyCredentials struct {
	calls atomic.Int64
	fail  func(ctx context.Context, n int64) error
}

func (c *flakyCredentials) Retrieve(ctx context.Context) (aws.Credentials, error) {
	if err := c.fail(ctx, c.calls.Add(1)); err != nil {
		return aws.Credentials{}, err
	}
	return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", CanExpire: true, Expires: time.Now()}, nil
}

// closedURL returns the address of a local port that refuses connections.
func closedURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "http://" + addr + "/credentials"
}

// stsRefusal is an error as the SDK's STS client returns it for a web
// identity it could not verify this once (a well-known transient refusal
// on EKS): a client-fault API error inside an HTTP response error.
func stsRefusal() error {
	return &smithy.OperationError{ServiceID: "STS", OperationName: "AssumeRoleWithWebIdentity",
		Err: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 400}},
			Err: &smithy.GenericAPIError{Code: "InvalidIdentityToken",
				Message: "Couldn't retrieve verification key from your identity provider", Fault: smithy.FaultClient},
		}}
}

// A start whose credentials cannot be fetched yet because the network is
// not up (a credentials endpoint that refuses connections, or answers
// after the request's timeout, as at a pod's boot before its network
// sidecar is ready) is not a client that can never sign: Run rides it out
// and leads once the credentials come, instead of failing (which would
// crash-loop the process).
func TestRunRidesOutCredentialsNotYetReachableAtStart(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	url := closedURL(t)
	for _, c := range []struct {
		name string
		fail func(ctx context.Context, n int64) error
	}{
		{"endpoint refuses connections", func(ctx context.Context, n int64) error {
			if n > 3 {
				return nil
			}
			resp, err := http.Get(url)
			if err == nil {
				resp.Body.Close()
				return errors.New("the closed port answered")
			}
			return fmt.Errorf("failed to load credentials: %w", err)
		}},
		{"endpoint slower than the request's timeout", func(ctx context.Context, n int64) error {
			if n == 1 {
				time.Sleep(time.Second) // CallTimeout is 400ms
			}
			return nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := withTimeout(t, 30*time.Second)
			db := clientWith(func(o *dynamodb.Options) { o.Credentials = &flakyCredentials{fail: c.fail} })
			l := newLease(t, db, table, "job-"+c.name, fast("a"))
			v := newLeaderView()
			done := make(chan error, 1)
			cctx, cancel := context.WithCancel(ctx)
			go func() { done <- l.Run(cctx, v.fn) }()
			t.Cleanup(func() { cancel(); <-done })
			select {
			case fence := <-v.starts:
				assert.Equal(t, int64(1), fence)
			case err := <-done:
				done <- err
				t.Fatalf("Run gave up on a network that was coming up: %v", err)
			case <-time.After(15 * time.Second):
				t.Fatal("no tenure")
			}
		})
	}
}

// A credentials service's refusal after a successful start (STS refusing
// a web identity token once) is transient like any credentials failure
// then: Run goes on campaigning and leads again once it passes.
func TestCredentialsServiceRefusalAfterStartIsTransient(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 40*time.Second)
	table := srv.NewTable(t)
	var failing atomic.Bool
	creds := &flakyCredentials{fail: func(context.Context, int64) error {
		if failing.Load() {
			return stsRefusal()
		}
		return nil
	}}
	db := clientWith(func(o *dynamodb.Options) { o.Credentials = creds })
	l := newLease(t, db, table, "job", fast("a"))
	v := newLeaderView()
	done := make(chan error, 1)
	cctx, cancel := context.WithCancel(ctx)
	go func() { done <- l.Run(cctx, v.fn) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Equal(t, int64(1), receive(t, v.starts, "leads"))

	failing.Store(true)
	eventually(t, "the tenure ends", func() bool { return !v.live() })
	eventually(t, "a failed look at the lease", func() bool {
		return errors.Is(l.CheckHealth(100*time.Millisecond), ddblease.ErrUnhealthy)
	})
	select {
	case err := <-done:
		done <- err
		t.Fatalf("Run returned on a passing refusal of the credentials service: %v", err)
	case <-time.After(3 * l.Options().RetryInterval):
	}
	failing.Store(false)
	select {
	case fence := <-v.starts:
		assert.Equal(t, int64(2), fence)
	case err := <-done:
		done <- err
		t.Fatalf("Run returned: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("no new tenure")
	}
}

// A credentials endpoint that never comes up (no credentials outside AWS,
// where the SDK's default chain ends at an unreachable IMDS) still makes
// Run fail with the SDK's cause, once it has been tried for a lease
// duration.
func TestRunGivesUpOnCredentialsNeverReachable(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	url := closedURL(t)
	creds := &flakyCredentials{fail: func(context.Context, int64) error {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return errors.New("the closed port answered")
		}
		return fmt.Errorf("no EC2 IMDS role found, %w", err)
	}}
	db := clientWith(func(o *dynamodb.Options) { o.Credentials = creds })
	l := newLease(t, db, table, "job", fast("a"))
	err := l.Run(ctx, func(context.Context, int64) error {
		t.Error("fn called")
		return nil
	})
	require.Error(t, err)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "Run retried until its context ended")
	assert.ErrorContains(t, err, table)
	assert.ErrorContains(t, err, "no EC2 IMDS role found")
	var opErr *net.OpError
	assert.ErrorAs(t, err, &opErr)
}

// daxLike is a client that is not the SDK's, as a DAX client is: it applies
// the options it is given to its own settings but builds no SDK middleware
// stack, and its first failures are its own network errors.
type daxLike struct {
	ddblease.DynamoDBAPI
	failures atomic.Int64
}

func (d *daxLike) fail(optFns []func(*dynamodb.Options)) error {
	var o dynamodb.Options
	for _, fn := range optFns {
		fn(&o)
	}
	if d.failures.Add(-1) >= 0 {
		return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	return nil
}

func (d *daxLike) GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if err := d.fail(optFns); err != nil {
		return nil, err
	}
	return d.DynamoDBAPI.GetItem(ctx, in, optFns...)
}

func (d *daxLike) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if err := d.fail(optFns); err != nil {
		return nil, err
	}
	return d.DynamoDBAPI.UpdateItem(ctx, in, optFns...)
}

// The "never sent" rule concludes nothing about a client that is not the
// SDK's: its network errors at start are retried like any network error.
func TestRunRidesOutNetworkErrorsOfAClientNotTheSDKs(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	dax := &daxLike{DynamoDBAPI: db}
	dax.failures.Store(3)
	l := newLease(t, dax, table, "job", fast("a"))
	v := newLeaderView()
	done := make(chan error, 1)
	cctx, cancel := context.WithCancel(ctx)
	go func() { done <- l.Run(cctx, v.fn) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case fence := <-v.starts:
		assert.Equal(t, int64(1), fence)
	case err := <-done:
		done <- err
		t.Fatalf("Run gave up on a network error: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("no tenure")
	}
}
