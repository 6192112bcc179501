package main

import (
	"context"
	"time"

	"github.com/go-co-op/gocron/v2"
)

// before is the scheduler as it stood before ddblease, for the comparison
// in docs/schedulers.md: every replica runs every firing (or, with a
// mutex-style Locker keyed by the job name, whichever replica's clock
// fires first runs it, and a replica whose clock is behind may run the same
// firing again after the lock is released).
func before(ctx context.Context, report func(context.Context) error) error {
	// snippet: before
	s, err := gocron.NewScheduler(gocron.WithLocation(time.UTC))
	if err != nil {
		return err
	}
	_, err = s.NewJob(gocron.CronJob("0 2 * * *", false), gocron.NewTask(report), gocron.WithName("report"))
	if err != nil {
		return err
	}
	s.Start()
	<-ctx.Done()
	return s.Shutdown()
	// snippet: end
}

var _ = before
