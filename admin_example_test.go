package ddblease_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
)

// An operator pauses a job, reads who paused it, and releases a lease by
// force: the fence goes up, so the old holder's fenced writes are refused.
func ExampleAdmin() {
	ctx := context.Background()
	db := srv.Client(nil) // a *dynamodb.Client: it has the Scan that Admin needs
	table := "example-" + ddbtest.RandomID()
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	lease, _ := ddblease.New(db, table, "nightly-billing", func(o *ddblease.Options) { o.Owner = "replica-1" })
	fence, _ := lease.TryAcquire(ctx)

	admin, err := ddblease.NewAdmin(db, table, func(o *ddblease.AdminOptions) { o.Operator = "alice" })
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := admin.Pause(ctx, "nightly-billing"); err != nil {
		fmt.Println(err)
		return
	}
	jobs, _ := admin.Jobs(ctx)
	for _, j := range jobs {
		fmt.Printf("%s: held by %s, fence %d, paused by %s\n", j.Job, j.Lease.Owner, j.Lease.Fence, j.Lease.Control.PausedBy)
	}

	rec, _ := admin.ForceRelease(ctx, "nightly-billing", fence)
	fmt.Println("fence after the release:", rec.Fence, "released by", rec.Control.ReleasedBy)
	guard, _ := ddblease.NewGuard(db, table, "nightly-billing")
	fmt.Println("old fence refused:", errors.Is(guard.Check(ctx, fence), ddblease.ErrStaleFence))
	_, err = admin.Job(ctx, "weekly-report")
	fmt.Println(errors.Is(err, ddblease.ErrUnknownJob))
	// Output:
	// nightly-billing: held by replica-1, fence 1, paused by alice
	// fence after the release: 2 released by alice
	// old fence refused: true
	// true
}
