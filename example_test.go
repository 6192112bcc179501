package ddblease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
)

// Run campaigns, leads, and on shutdown drains and resigns. In a service the
// context comes from signal.NotifyContext(ctx, syscall.SIGTERM).
func ExampleLease_Run() {
	ctx := context.Background()
	db := srv.Client(nil) // a *dynamodb.Client
	table := "example-" + ddbtest.RandomID()
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	lease, err := ddblease.New(db, table, "nightly-billing", func(o *ddblease.Options) {
		o.Owner = "replica-1"
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, sigterm := context.WithCancel(ctx)
	err = lease.Run(runCtx, func(ctx context.Context, fence int64) error {
		fmt.Println("leading with fence", fence)
		sigterm() // as if SIGTERM arrived
		<-ctx.Done()
		fmt.Println("draining:", context.Cause(ctx))
		return nil
	})
	fmt.Println("Run returned", err)

	rec, err := lease.Holder(ctx)
	fmt.Println(rec.Owner, rec.Fence, "resigned:", rec.ExpiresAt.IsZero(), err)
	// Output:
	// leading with fence 1
	// draining: ddblease: shutting down: context canceled
	// Run returned <nil>
	// replica-1 1 resigned: true <nil>
}

// TryAcquire makes one attempt; a live lease held by someone else is a
// *HeldError that names the holder.
func ExampleLease_TryAcquire() {
	ctx := context.Background()
	db := srv.Client(nil)
	table := "example-" + ddbtest.RandomID()
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	a, _ := ddblease.New(db, table, "sweeper", func(o *ddblease.Options) { o.Owner = "a" })
	b, _ := ddblease.New(db, table, "sweeper", func(o *ddblease.Options) { o.Owner = "b" })

	fence, err := a.TryAcquire(ctx)
	fmt.Println("a:", fence, err)

	_, err = b.TryAcquire(ctx)
	var held *ddblease.HeldError
	if errors.As(err, &held) {
		fmt.Println("b: held by", held.Owner, "fence", held.Fence)
	}

	_ = a.Resign(ctx)
	fence, err = b.TryAcquire(ctx)
	fmt.Println("b:", fence, err)
	_ = b.Resign(ctx)
	// Output:
	// a: 1 <nil>
	// b: held by a fence 1
	// b: 2 <nil>
}

// An observer sees every change of leadership; build logs, metrics and
// alerts on it. It runs on the library's goroutines and must not block.
func ExampleOptions_observer() {
	ctx := context.Background()
	db := srv.Client(nil)
	table := "example-" + ddbtest.RandomID()
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	lease, err := ddblease.New(db, table, "nightly-billing", func(o *ddblease.Options) {
		o.Owner = "replica-1"
		o.Observer = func(e ddblease.Event) {
			switch e.Kind {
			case ddblease.EventAcquired, ddblease.EventDraining, ddblease.EventResigned:
				fmt.Println(e.Kind, e.Job, "fence", e.Fence)
			case ddblease.EventLost:
				fmt.Println(e.Kind, e.Job, "fence", e.Fence, "reason", e.Reason)
			case ddblease.EventStopped:
				fmt.Println(e.Kind, "err:", e.Err)
			}
		}
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, sigterm := context.WithCancel(ctx)
	_ = lease.Run(runCtx, func(ctx context.Context, fence int64) error {
		sigterm() // as if SIGTERM arrived
		<-ctx.Done()
		return nil
	})
	// Output:
	// acquired nightly-billing fence 1
	// draining nightly-billing fence 1
	// resigned nightly-billing fence 1
	// stopped err: <nil>
}

// A Pool spreads many jobs over the replicas that run it: here one replica
// runs alone and so leads all three. A replica that joins takes its share,
// handed over drained and resigned.
func ExamplePool() {
	ctx := context.Background()
	db := srv.Client(nil) // a *dynamodb.Client
	table := "example-" + ddbtest.RandomID()
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	tenants := []string{"report-acme", "report-globex", "report-initech"}
	pool, err := ddblease.NewPool(db, table, "reports", tenants, func(o *ddblease.Options) {
		o.Owner = "replica-1"
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, sigterm := context.WithCancel(ctx)
	var mu sync.Mutex
	led := map[string]int64{}
	err = pool.Run(runCtx, func(ctx context.Context, job string, fence int64) error {
		mu.Lock()
		led[job] = fence
		if len(led) == len(tenants) {
			sigterm() // as if SIGTERM arrived once every job is led
		}
		mu.Unlock()
		<-ctx.Done()
		return nil
	})
	fmt.Println("Run returned", err)
	fmt.Println(led)
	// Output:
	// Run returned <nil>
	// map[report-acme:1 report-globex:1 report-initech:1]
}
