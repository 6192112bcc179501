package ddbleaserobfig_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/robfig/cron/v3"
)

// A robfig spec drives ddblease's RunSchedule directly, without a
// cron.Cron: RunSchedule campaigns, fires on the leader only, and claims
// each slot before running it. The replica's clock is put two seconds
// before 01:30 in New York on the night the clocks go back.
func Example_runSchedule() {
	db := srv.Client(nil)
	table := "leases-" + fmt.Sprint(time.Now().UnixNano())
	if err := ddblease.CreateTable(context.Background(), db, table); err != nil {
		fmt.Println(err)
		return
	}
	at, realStart := time.Date(2026, 11, 1, 5, 29, 58, 0, time.UTC), time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// snippet: runschedule
	sched, err := cron.ParseStandard("CRON_TZ=America/New_York 30 1 * * *")
	if err != nil {
		fmt.Println(err)
		return
	}
	lease, err := ddblease.New(db, table, "report", func(o *ddblease.Options) {
		o.Now = func() time.Time { return time.Now().Add(at.Sub(realStart)) } // the example's clock
		o.Logger = quiet
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = lease.RunSchedule(ctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
		ny, _ := time.LoadLocation("America/New_York")
		fmt.Println("slot", run.Slot().Format(time.RFC3339), "=", run.Slot().In(ny).Format("15:04 MST"), "fence", run.Fence())
		cancel() // one is enough for the example
		return nil
	})
	// snippet: end
	fmt.Println("RunSchedule returned", err)
	// Output:
	// slot 2026-11-01T05:30:00Z = 01:30 EDT fence 1
	// RunSchedule returned <nil>
}
