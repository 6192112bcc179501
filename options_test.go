package ddblease_test

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewRejectsBadInput(t *testing.T) {
	t.Parallel()
	db := srv.Client(nil)
	set := func(f func(*ddblease.Options)) []func(*ddblease.Options) { return []func(*ddblease.Options){f} }
	cases := []struct {
		name  string
		db    ddblease.DynamoDBAPI
		table string
		job   string
		opts  []func(*ddblease.Options)
		want  string
	}{
		{"nil client", nil, "leases", "job", nil, "client is nil"},
		{"empty job", db, "leases", "", nil, "job name is empty"},
		{"long job", db, "leases", strings.Repeat("j", ddblease.MaxJobLength+1), nil, "over the limit"},
		{"control character in job", db, "leases", "a\nb", nil, "control character"},
		{"bad UTF-8 job", db, "leases", "a\xffb", nil, "UTF-8"},
		{"short table", db, "t", "job", nil, "3 to 255"},
		{"bad table", db, "lea ses", "job", nil, "letters, digits"},
		{"negative lease", db, "leases", "job", set(func(o *ddblease.Options) { o.LeaseDuration = -time.Second }), "LeaseDuration is negative"},
		{"tiny lease", db, "leases", "job", set(func(o *ddblease.Options) { o.LeaseDuration = time.Millisecond }), "outside 10ms"},
		{"huge lease", db, "leases", "job", set(func(o *ddblease.Options) { o.LeaseDuration = 1000 * time.Hour }), "outside 10ms"},
		{"negative heartbeat", db, "leases", "job", set(func(o *ddblease.Options) { o.HeartbeatInterval = -1 }), "HeartbeatInterval is negative"},
		{"heartbeat at half the lease", db, "leases", "job", set(func(o *ddblease.Options) {
			o.LeaseDuration, o.HeartbeatInterval = 10*time.Second, 5*time.Second
		}), "below LeaseDuration/2"},
		{"negative retry", db, "leases", "job", set(func(o *ddblease.Options) { o.RetryInterval = -1 }), "RetryInterval is negative"},
		{"1ns retry", db, "leases", "job", set(func(o *ddblease.Options) { o.RetryInterval = time.Nanosecond }), "RetryInterval 1ns is below 1ms"},
		{"retry just below 1ms", db, "leases", "job", set(func(o *ddblease.Options) { o.RetryInterval = time.Millisecond - 1 }), "below 1ms"},
		{"negative skew", db, "leases", "job", set(func(o *ddblease.Options) { o.MaxClockSkew = -1 }), "MaxClockSkew is negative"},
		{"skew over lease", db, "leases", "job", set(func(o *ddblease.Options) { o.MaxClockSkew = time.Minute }), "MaxClockSkew"},
		{"negative drain", db, "leases", "job", set(func(o *ddblease.Options) { o.DrainTimeout = -1 }), "DrainTimeout is negative"},
		{"call timeout over heartbeat", db, "leases", "job", set(func(o *ddblease.Options) { o.CallTimeout = time.Minute }), "CallTimeout"},
		{"owner with newline", db, "leases", "job", set(func(o *ddblease.Options) { o.Owner = "a\nb" }), "Owner"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := ddblease.New(c.db, c.table, c.job, c.opts...)
			require.ErrorIs(t, err, ddblease.ErrInvalid)
			assert.ErrorContains(t, err, c.want)
			assert.Nil(t, l)
		})
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	l, err := ddblease.New(srv.Client(nil), "leases", "job", nil)
	require.NoError(t, err)
	o := l.Options()
	assert.Equal(t, 30*time.Second, o.LeaseDuration)
	assert.Equal(t, 10*time.Second, o.HeartbeatInterval)
	assert.Equal(t, time.Second, o.RetryInterval)
	assert.Equal(t, time.Second, o.MaxClockSkew)
	assert.Equal(t, 10*time.Second, o.DrainTimeout)
	assert.Equal(t, 5*time.Second, o.CallTimeout)
	assert.NotNil(t, o.Logger)
	assert.NotNil(t, o.Now)
	other, err := ddblease.New(srv.Client(nil), "leases", "job")
	require.NoError(t, err)
	assert.NotEqual(t, l.Owner(), other.Owner(), "two handles on one job get different default owners")
	assert.Contains(t, l.Owner(), "-")
}

func TestMissingTable(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 10*time.Second)
	l := newLease(t, srv.Client(nil), "no-such-table-"+ddbtest.RandomID(), "job", fast("a"))
	_, err := l.TryAcquire(ctx)
	var notFound *types.ResourceNotFoundException
	assert.ErrorAs(t, err, &notFound)
	_, err = l.Acquire(ctx)
	assert.ErrorAs(t, err, &notFound, "Acquire gives up on errors that retrying cannot fix")
	assert.ErrorAs(t, l.Run(ctx, func(context.Context, int64) error { return nil }), &notFound)
	_, err = l.Holder(ctx)
	assert.ErrorAs(t, err, &notFound)
}

// A lease item that this package did not write, or that was damaged, is an
// error, never a panic and never a lease.
func TestMalformedLeaseItem(t *testing.T) {
	t.Parallel()
	n := func(s string) types.AttributeValue { return &types.AttributeValueMemberN{Value: s} }
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	good := func() map[string]types.AttributeValue {
		return withKey("lease#job", map[string]types.AttributeValue{
			"owner": s("x"), "fence": n("3"), "expiresAt": n("1"), "rv": s("v"),
		})
	}
	cases := map[string]func(map[string]types.AttributeValue){
		"fence is a string":   func(m map[string]types.AttributeValue) { m["fence"] = s("three") },
		"fence is fractional": func(m map[string]types.AttributeValue) { m["fence"] = n("3.5") },
		"fence missing":       func(m map[string]types.AttributeValue) { delete(m, "fence") },
		"owner is a number":   func(m map[string]types.AttributeValue) { m["owner"] = n("7") },
		"expiry is a string":  func(m map[string]types.AttributeValue) { m["expiresAt"] = s("soon") },
		"version missing":     func(m map[string]types.AttributeValue) { delete(m, "rv") },
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := withTimeout(t, 10*time.Second)
			table, db := tableAndClient(t)
			item := good()
			damage(item)
			_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item})
			require.NoError(t, err)
			l := newLease(t, db, table, "job", fast("a"))
			_, err = l.Holder(ctx)
			assert.ErrorIs(t, err, ddblease.ErrMalformedItem)
			fence, err := l.TryAcquire(ctx)
			assert.Error(t, err, "acquired fence %d over a malformed item", fence)
			assert.False(t, l.IsLeader())
			_, err = l.Acquire(ctx)
			assert.Error(t, err, "Acquire gives up on a malformed item")
		})
	}

	// A damaged draining flag is reported by readers; an acquisition, which
	// rewrites the flag, repairs it.
	t.Run("draining is a string", func(t *testing.T) {
		t.Parallel()
		ctx := withTimeout(t, 10*time.Second)
		table, db := tableAndClient(t)
		item := good()
		item["draining"] = s("yes")
		_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item})
		require.NoError(t, err)
		l := newLease(t, db, table, "job", fast("a"))
		_, err = l.Holder(ctx)
		assert.ErrorIs(t, err, ddblease.ErrMalformedItem)
		fence, err := l.TryAcquire(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(4), fence)
		rec, err := l.Holder(ctx)
		require.NoError(t, err)
		assert.False(t, rec.Draining)
	})
}

func TestCreateTable(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	db := srv.Client(nil)
	name := "ddblease-create-" + ddbtest.RandomID()
	t.Cleanup(func() {
		_, _ = db.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(name)})
	})
	require.NoError(t, ddblease.CreateTable(ctx, db, name))
	require.NoError(t, ddblease.CreateTable(ctx, db, name), "an existing table with the right schema is accepted")
	l := newLease(t, db, name, "job", fast("a"))
	_, err := l.TryAcquire(ctx)
	require.NoError(t, err)

	other := "ddblease-other-" + ddbtest.RandomID()
	require.NoError(t, ddbtest.CreateRawTable(ctx, db, other, "id", types.ScalarAttributeTypeS))
	t.Cleanup(func() {
		_, _ = db.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(other)})
	})
	err = ddblease.CreateTable(ctx, db, other)
	assert.ErrorIs(t, err, ddblease.ErrTableSchema)
	assert.ErrorContains(t, err, other)

	assert.ErrorIs(t, ddblease.CreateTable(ctx, nil, name), ddblease.ErrInvalid)
	assert.ErrorIs(t, ddblease.CreateTable(ctx, db, "x"), ddblease.ErrInvalid)
}

func TestResignOnSignal(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"))
	b := newLease(t, db, table, "job", fast("b"))
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	stop := a.ResignOnSignal(syscall.SIGUSR1)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGUSR1))
	require.Eventually(t, func() bool { return !a.IsLeader() }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, stop())
	require.NoError(t, stop(), "stop is idempotent")
	fence, err := b.TryAcquire(ctx)
	require.NoError(t, err, "the standby takes over at once")
	assert.Equal(t, int64(2), fence)

	// Without a signal, stop just unregisters.
	stop = b.ResignOnSignal(syscall.SIGUSR1)
	require.NoError(t, stop())
	assert.True(t, b.IsLeader())
}

// nilClient is a user's own client type; a nil *nilClient in a DynamoDBAPI
// is as unusable as a nil *dynamodb.Client.
type nilClient struct{ ddblease.DynamoDBAPI }

// A client variable that was declared and never assigned passes a nil
// check of the interface, and would panic inside the SDK on the first
// request: every constructor refuses it with ErrInvalid, naming its type.
// So would a zero dynamodb.Client, made without dynamodb.New.
func TestConstructorsRefuseTypedNilClient(t *testing.T) {
	t.Parallel()
	var sdk *dynamodb.Client
	var own *nilClient
	for _, c := range []struct {
		name string
		db   ddblease.DynamoDBAPI
		want string
	}{
		{"nil *dynamodb.Client", sdk, "nil *dynamodb.Client"},
		{"nil pointer of a wrapper", own, "nil *ddblease_test.nilClient"},
		{"zero dynamodb.Client", new(dynamodb.Client), "dynamodb.New"},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				require.ErrorIs(t, err, ddblease.ErrInvalid, what)
				assert.ErrorContains(t, err, c.want, what)
			}
			l, err := ddblease.New(c.db, "leases", "job")
			check("New", err)
			assert.Nil(t, l)
			g, err := ddblease.NewGuard(c.db, "leases", "job")
			check("NewGuard", err)
			assert.Nil(t, g)
			check("CreateTable", ddblease.CreateTable(context.Background(), c.db, "leases"))
			check("CheckClient", ddblease.CheckClient(c.db))
		})
	}
	a, err := ddblease.NewAdmin(sdk, "leases")
	require.ErrorIs(t, err, ddblease.ErrInvalid, "NewAdmin")
	assert.ErrorContains(t, err, "nil *dynamodb.Client")
	assert.Nil(t, a)
	assert.NoError(t, ddblease.CheckClient(srv.Client(nil)), "a real client")
}

// RetryInterval's floor is 1ms: below it every standby would poll in a
// busy loop. 1ms itself is accepted.
func TestRetryIntervalFloor(t *testing.T) {
	t.Parallel()
	l, err := ddblease.New(srv.Client(nil), "leases", "job", func(o *ddblease.Options) { o.RetryInterval = time.Millisecond })
	require.NoError(t, err)
	assert.Equal(t, time.Millisecond, l.Options().RetryInterval)
}
