package ddbleasegocron

import (
	"fmt"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/go-co-op/gocron/v2"
)

// CronSchedule parses crontab exactly as gocron.CronJob(crontab,
// withSeconds) does on a scheduler whose location is loc (gocron's
// WithLocation; time.Local by default; a CRON_TZ= or TZ= prefix in crontab
// wins), with gocron's own parser, and returns it as a ddblease.Schedule:
// its slots are the times gocron fires the job. A crontab gocron refuses
// is an error wrapping ddblease.ErrInvalid.
//
// It does not apply gocron's WithDaylightSavingsTimePolicy: a job that
// sets a policy other than the default fires, around a transition, at
// times this schedule does not give, and those firings fail to lock
// (ErrNoSlot).
func CronSchedule(crontab string, withSeconds bool, loc *time.Location) (ddblease.Schedule, error) {
	if loc == nil {
		loc = time.Local
	}
	c := gocron.NewDefaultCron(withSeconds)
	if err := c.IsValid(crontab, loc, time.Now()); err != nil {
		return nil, fmt.Errorf("%w: crontab %q: %w", ddblease.ErrInvalid, crontab, err)
	}
	return c, nil
}

// AlignedStart returns the gocron job option that starts a
// gocron.DurationJob(d) at the first multiple of d since the Unix epoch
// after now, so that its firings fall on the slots of ddblease.Every(d) on
// every replica, whenever each started. gocron then fires every d after
// that start.
func AlignedStart(d time.Duration, now time.Time) (gocron.JobOption, error) {
	if d <= 0 {
		return nil, fmt.Errorf("%w: AlignedStart: duration %v is not positive", ddblease.ErrInvalid, d)
	}
	return gocron.WithStartAt(gocron.WithStartDateTime(ddblease.Every(d).Next(now))), nil
}
