package ddblease

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A job the pool starts just as it stops (or hands the job over) finds its
// context ended when its Run begins: that attempts nothing, and is not an
// error of the pool, whereas Run called so returns one.
func TestPoolJobStartedAsThePoolStopsIsNoError(t *testing.T) {
	db := dynamodb.New(dynamodb.Options{Region: "us-east-1"})
	l, err := New(db, "table", "job", func(o *Options) { o.Owner = "a" })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	fn := func(context.Context, string, int64) error { called = true; return nil }
	assert.NoError(t, runJob(ctx, l, "job", fn))
	assert.False(t, called, "fn ran")
	err = l.Run(ctx, func(context.Context, int64) error { return nil })
	assert.ErrorIs(t, err, context.Canceled, "Run called with an ended context")
	assert.EqualError(t, err, `ddblease: run "job": context canceled`)
}

// A session missing from a member read proves that it left only if the
// read was sent after the replica found a job bound to it: an earlier read
// (one that a pause kept from being acted on) may predate the session
// itself. The replica frees it a LeaseDuration after such a read, and a
// read that shows it again voids what the missing one said.
func TestPoolSessionGoneOnlyByAReadSentAfterTheAsk(t *testing.T) {
	// The pool judges by the runtime clock: synctest's fake clock moves it.
	synctest.Test(t, func(t *testing.T) {
		const lease = 50 * time.Millisecond
		db := dynamodb.New(dynamodb.Options{Region: "us-east-1"})
		p, err := NewPool(db, "table", "reports", []string{"j"}, func(o *Options) {
			o.Owner, o.LeaseDuration, o.HeartbeatInterval, o.MaxClockSkew = "a", lease, lease/5, lease/5
		})
		require.NoError(t, err)
		p.begin()
		ctx := context.Background()
		alone := map[string]member{"a": {owner: "a", sid: "sa", sv: "1"}}
		withB := map[string]member{"a": {owner: "a", sid: "sa", sv: "2"}, "b": {owner: "b", sid: "sb", sv: "1",
			exp: time.Now().Add(time.Hour).UnixMilli()}}

		stale := time.Now()
		p.watch(alone, stale) // answered before b's session existed, acted on late
		assert.False(t, p.sessionFree(ctx, "b", "sb", 0), "the first ask")
		time.Sleep(2 * lease)
		assert.False(t, p.sessionFree(ctx, "b", "sb", 0), "freed by a read sent before the ask")

		p.watch(withB, time.Now()) // b's session is there: the ask starts again
		p.watch(alone, time.Now())
		time.Sleep(2 * lease)
		assert.False(t, p.sessionFree(ctx, "b", "sb", 0), "freed by a read older than the ask after a read showed it")

		time.Sleep(time.Millisecond)
		p.watch(alone, time.Now()) // sent after the ask: the session left
		assert.False(t, p.sessionFree(ctx, "b", "sb", 0), "freed at once")
		time.Sleep(lease + lease/5)
		assert.True(t, p.sessionFree(ctx, "b", "sb", 0), "a LeaseDuration after a read sent after the ask")
		// A job whose item records a longer lease (its holder's) waits
		// for that one: the holder may lead until it has passed.
		assert.False(t, p.sessionFree(ctx, "b", "sb", 3*lease), "freed before its holder's lease")
		time.Sleep(2 * lease)
		assert.True(t, p.sessionFree(ctx, "b", "sb", 3*lease), "its holder's lease after a read sent after the ask")
	})
}

// A member whose LeaseDuration is longer than the reader's (a deploy that
// lengthens it) keeps its place, and so its jobs, until its own lease has
// passed: the reader watches its version for the longer of the two, as a
// standby does a lease item that records a longer duration. Its expiry is
// far ahead here (its wall clock ahead), so only the watch can lapse it.
func TestPoolMemberLapseWaitsForTheLongerLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease, theirs = time.Second, 3 * time.Second
		db := dynamodb.New(dynamodb.Options{Region: "us-east-1"})
		p, err := NewPool(db, "table", "reports", []string{"j"}, func(o *Options) {
			o.Owner, o.LeaseDuration, o.HeartbeatInterval, o.MaxClockSkew = "a", lease, lease/5, lease/10
		})
		require.NoError(t, err)
		p.begin()
		ahead := time.Now().Add(time.Hour)
		members := map[string]member{
			"a": {owner: "a", sid: "sa", sv: "1", exp: time.Now().Add(lease).UnixMilli(), renewed: time.Now().UnixMilli()},
			"b": {owner: "b", sid: "sb", sv: "1", exp: ahead.UnixMilli(), renewed: ahead.Add(-theirs).UnixMilli()},
		}
		p.watch(members, time.Now())
		members["a"] = member{owner: "a", sid: "sa", sv: "2", exp: time.Now().Add(10 * theirs).UnixMilli()}
		time.Sleep(lease + lease/2)
		assert.Equal(t, []string{"a", "b"}, p.liveIn(members, p.opts.sendNow()), "b lapsed after the reader's lease")
		time.Sleep(theirs - lease)
		assert.Equal(t, []string{"a"}, p.liveIn(members, p.opts.sendNow()), "b live after its own lease")

		// Without a recorded renewal time the reader's lease is the one.
		members["b"] = member{owner: "b", sid: "sb", sv: "3", exp: ahead.UnixMilli()}
		p.watch(members, time.Now())
		time.Sleep(lease + lease/10)
		assert.Equal(t, []string{"a"}, p.liveIn(members, p.opts.sendNow()), "b live after the reader's lease")
	})
}
