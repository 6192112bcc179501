package ddbleasetest_test

// readme:begin (docs/testing.md shows this file from here to readme:end)
import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
)

// A job must stop when its lease is lost; here every heartbeat fails.
func TestJobStopsWhenLeaseIsLost(t *testing.T) {
	srv := ddbleasetest.NewServer(t) // in process; closed when the test ends
	faults := ddbleasetest.NewFaults()
	db := srv.Client(faults.Wrap) // endpoint, region and dummy credentials set
	table := srv.NewTable(t)      // a fresh lease table, deleted when the test ends
	lease, err := ddblease.New(db, table, "nightly", func(o *ddblease.Options) {
		o.LeaseDuration = time.Second // short, so that the test is quick
		o.MaxClockSkew = 100 * time.Millisecond
	})
	if err != nil {
		t.Fatal(err)
	}

	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	var cause error
	err = lease.Run(ctx, func(ctx context.Context, fence int64) error {
		faults.Fail("UpdateItem", ddbleasetest.ServerError, -1) // heartbeats fail from now on
		<-ctx.Done()                                            // the job runs until its context ends
		cause = context.Cause(ctx)
		stop() // else Run campaigns again
		return nil
	})
	if !errors.Is(cause, ddblease.ErrLost) {
		t.Fatalf("the job stopped because of %v (Run: %v), want ErrLost", cause, err)
	}
}

// readme:end
