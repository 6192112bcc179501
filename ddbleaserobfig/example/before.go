package main

import (
	"context"
	"time"

	"github.com/robfig/cron/v3"
)

// before is the cron as it stood before ddblease, for the comparison in
// docs/schedulers.md: every replica runs every firing.
func before(ctx context.Context, report func()) error {
	// snippet: before
	c := cron.New(cron.WithLocation(time.UTC))
	if _, err := c.AddFunc("0 2 * * *", report); err != nil {
		return err
	}
	c.Start()
	<-ctx.Done()
	<-c.Stop().Done()
	return nil
	// snippet: end
}

var _ = before
