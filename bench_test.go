package ddblease_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/reqcount"
)

// Per-call cost of the lease writes against a raw UpdateItem that sends the
// very request the library sends (captured from it, so the expressions
// cannot drift apart), on the same server. The overhead ratio is
// BenchmarkTryAcquire / BenchmarkRawUpdateItem/acquire and
// BenchmarkHeartbeat / BenchmarkRawUpdateItem/heartbeat, read from one run:
//
//	go test -run '^$' -bench . -benchmem -count 10 ./ | tee new.txt
//	benchstat new.txt
//
// The server is the in-process one unless DDBLEASE_TEST_ENDPOINT names
// another (dynalite, say). BENCHMARKS.md has figures.

func benchOpts(o *ddblease.Options) {
	o.Owner = "bench"
	o.Logger = quiet
}

func benchLease(b *testing.B, db ddblease.DynamoDBAPI, table, job string) *ddblease.Lease {
	b.Helper()
	l, err := ddblease.New(db, table, job, benchOpts)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// captured returns the acquire and heartbeat requests the library sends for
// a lease held by owner "bench" with fence 1.
func captured(b *testing.B, table string) (acquire, heartbeat *dynamodb.UpdateItemInput) {
	b.Helper()
	ctx := context.Background()
	rec := &reqcount.Recorder{DynamoDBAPI: srv.Client(nil)}
	l := benchLease(b, rec, table, "capture")
	if _, err := l.TryAcquire(ctx); err != nil {
		b.Fatal(err)
	}
	acquire = rec.LastUpdate()
	if err := l.Heartbeat(ctx); err != nil {
		b.Fatal(err)
	}
	heartbeat = rec.LastUpdate()
	if err := l.Resign(ctx); err != nil {
		b.Fatal(err)
	}
	return acquire, heartbeat
}

// BenchmarkTryAcquire takes a free lease: one conditional UpdateItem per
// call, on an item that does not exist yet.
func BenchmarkTryAcquire(b *testing.B) {
	table := srv.NewTable(b)
	db := srv.Client(nil)
	ctx := context.Background()
	leases := make([]*ddblease.Lease, b.N)
	for i := range leases {
		leases[i] = benchLease(b, db, table, fmt.Sprintf("acquire-%d", i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := leases[i].TryAcquire(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHeartbeat renews a held lease: one UpdateItem conditional on
// owner and fence per call.
func BenchmarkHeartbeat(b *testing.B) {
	table := srv.NewTable(b)
	ctx := context.Background()
	l := benchLease(b, srv.Client(nil), table, "heartbeat")
	if _, err := l.TryAcquire(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := l.Heartbeat(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := l.Resign(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRawUpdateItem sends the library's own acquire and heartbeat
// requests straight through the SDK client.
func BenchmarkRawUpdateItem(b *testing.B) {
	b.Run("acquire", func(b *testing.B) {
		table := srv.NewTable(b)
		acquire, _ := captured(b, table)
		db := srv.Client(nil)
		ctx := context.Background()
		ins := make([]*dynamodb.UpdateItemInput, b.N)
		for i := range ins {
			ins[i] = reqcount.OnKey(acquire, fmt.Sprintf("raw-acquire-%d", i))
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := db.UpdateItem(ctx, ins[i]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("heartbeat", func(b *testing.B) {
		table := srv.NewTable(b)
		acquire, heartbeat := captured(b, table)
		db := srv.Client(nil)
		ctx := context.Background()
		// An item held by owner "bench" with fence 1, as heartbeat expects.
		if _, err := db.UpdateItem(ctx, reqcount.OnKey(acquire, "raw-heartbeat")); err != nil {
			b.Fatal(err)
		}
		in := reqcount.OnKey(reqcount.KeepVersion(heartbeat, acquire), "raw-heartbeat")
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := db.UpdateItem(ctx, in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
