package main

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
)

// tally is what the summary found.
type tally struct {
	run      int    // slots with a run
	handover int    // slots without a run before the hand-over's first run
	missed   int    // slots without a run before the failover's first run
	verdict  string // how that compares with the catch-up rule
}

// marks are the fences of the tenures the story is about.
type marks struct {
	handover int64 // the tenure that followed the SIGTERM
	victim   int64 // the tenure that crashed
	failover int64 // the tenure that followed the crash
}

// effectItem is a slot's effect as the sink holds it.
type effectItem struct {
	by    string
	fence int64
}

// summary lists the slots with ListRuns, as an operator's tool would, and
// checks them: one succeeded run per slot while someone led, fences in slot
// order, each tenure's first slot as the catch-up rule says, and at most one
// effect per slot in the sink.
func (c *cluster) summary(ctx context.Context, m marks) (tally, error) {
	var t tally
	db := c.srv.Client(nil)
	op, err := ddblease.New(db, c.table, job, func(o *ddblease.Options) { o.Owner = "operator" })
	if err != nil {
		return t, err
	}
	c.mu.Lock()
	jobs, effects := maps.Clone(c.started), maps.Clone(c.effects)
	owners, acquired := map[int64]string{}, map[int64]time.Time{}
	for _, h := range c.history {
		owners[h.fence], acquired[h.fence] = h.r.name, h.acquired
	}
	c.mu.Unlock()
	slotKey := map[time.Time]string{} // a slot's IdempotencyKey, from its job run
	var to time.Time
	for key, s := range jobs {
		slotKey[s.slot] = key
		if s.slot.After(to) {
			to = s.slot
		}
	}
	sched := ddblease.Every(*tick)
	from := sched.Next(start.Add(-*window))
	runs, err := op.ListRuns(ctx, sched, from, to)
	if err != nil {
		return t, err
	}
	bySlot := map[time.Time]ddblease.RunRecord{}
	for _, r := range runs {
		bySlot[r.Slot] = r
	}

	fmt.Printf("\nslots %s to %s, from ListRuns (an operator's handle, no tenure) and the sink:\n", hms(from), hms(to))
	fmt.Printf("  %-12s  %5s  %-9s  %-9s  %6s  %6s  %s\n", "slot", "fence", "owner", "status", "late", "missed", "effect")
	var prev *ddblease.RunRecord // the latest run so far, in slot order
	gap := 0                     // slots without a run since prev
	for s := from; !s.After(to); s = sched.Next(s) {
		r, ok := bySlot[s]
		if !ok {
			note := "skipped by the first leader's catch-up: no run (before the demo)"
			if prev != nil {
				note, gap = "no run: skipped by a catch-up", gap+1
			}
			fmt.Printf("  %-12s  %5s  %-9s  %-9s  %6s  %6s  %s\n", hms(s), "-", "-", "-", "", "", note)
			continue
		}
		t.run++
		missed := strconv.Itoa(r.Missed)
		if r.MissedUnknown {
			missed = "?"
		}
		eff, err := c.effectOf(ctx, db, slotKey[s], effects)
		if err != nil {
			return t, err
		}
		shown := "none"
		if eff != nil {
			shown = fmt.Sprintf("by %s with fence %d", eff.by, eff.fence)
		}
		fmt.Printf("  %-12s  %5d  %-9s  %-9s  %6s  %6s  %s\n", hms(s), r.Fence, r.Owner, r.Status,
			r.StartedAt.Sub(s).Round(time.Millisecond), missed, shown)

		switch {
		case r.Status == ddblease.RunRunning && r.Fence == m.victim:
			fmt.Printf("  %12s  ↳ left running by the crash; no catch-up abandons it, being older than the window\n", "")
		case r.Status != ddblease.RunSucceeded:
			c.fail("slot %s: run %s", hms(s), r.Status)
		case eff == nil:
			c.fail("slot %s: the run succeeded but its effect is not in the sink", hms(s))
		case eff.fence != r.Fence || eff.by != r.Owner:
			c.fail("slot %s: run by %s with fence %d, effect by %s with fence %d", hms(s), r.Owner, r.Fence, eff.by, eff.fence)
		}
		if owners[r.Fence] != r.Owner {
			c.fail("slot %s: run by %s with fence %d, which %q held", hms(s), r.Owner, r.Fence, owners[r.Fence])
		}
		switch {
		case prev != nil && r.Fence < prev.Fence:
			c.fail("slot %s has fence %d, after fence %d", hms(s), r.Fence, prev.Fence)
		case prev != nil && r.Fence == prev.Fence && gap > 0:
			// A run that overran later slots: the rule fires the latest and
			// counts the others as missed.
			if r.MissedUnknown || r.Missed != gap {
				c.fail("%s before %s have no run although fence %d led", plural(gap, "slot"), hms(s), r.Fence)
			} else {
				fmt.Printf("  %12s  ↳ %s skipped: the run before overran them (Missed %d)\n", "", plural(gap, "slot"), r.Missed)
			}
		case prev == nil || r.Fence != prev.Fence:
			verdict := c.catchUp(sched, prev, r, gap, acquired[r.Fence])
			switch r.Fence {
			case m.handover:
				t.handover = gap
			case m.failover:
				t.missed, t.verdict = gap, verdict
			}
		}
		prev, gap = &r, 0
	}
	for key, n := range effects {
		if n > 1 {
			c.fail("%s has %d effects", key, n)
		}
	}
	return t, nil
}

// catchUp checks a tenure's first run r against the catch-up rule. prev is
// the latest run before it (nil if none), gap the slots between them, and
// acquired when the tenure's acquiring write was sent.
func (c *cluster) catchUp(sched ddblease.Schedule, prev *ddblease.RunRecord, r ddblease.RunRecord, gap int, acquired time.Time) string {
	// The new leader looked for due slots at some instant between sending
	// its acquiring write and claiming r: the rule must hold at one of them.
	// The job's first tenure (fence 1) counts no slot before it as missed:
	// no one led then.
	var since time.Time
	if r.Fence == 1 {
		since = acquired
	}
	p, ok := predict(sched, prev, acquired, since)
	if !ok(r) {
		if p, ok = predict(sched, prev, r.StartedAt, since); !ok(r) {
			c.fail("catch-up rule not followed by fence %d: %s; it fired %s with Missed %d", r.Fence, p, hms(r.Slot), r.Missed)
			return "does NOT match the catch-up rule"
		}
	}
	fmt.Printf("  %12s  ↳ catch-up ✓ fence %d: %s\n", "", r.Fence, p)
	switch {
	case gap == 0:
		return "matches the catch-up rule: nothing to catch up"
	case p.late:
		return fmt.Sprintf("matches the catch-up rule: of the %d slots due while no one led, the latest, %s, was caught up"+
			" and %s skipped, %d of them within the %v window and so counted in its Missed",
			gap+1, hms(r.Slot), plural(gap, "older slot"), p.missed, *window)
	}
	return fmt.Sprintf("matches the catch-up rule: the %s due while no one led were all older than the %v window by then, so none was fired",
		plural(gap, "slot"), *window)
}

// prediction is what the catch-up rule says a new leader fires first.
type prediction struct {
	at     time.Time // when the leader looks
	slot   time.Time // the slot it fires first
	late   bool      // fired late, as a catch-up, rather than when it falls due
	missed int       // the skipped slots it counts as missed: within the window, after prev
	why    string
}

func (p prediction) String() string {
	return fmt.Sprintf("looking at %s, it %s: fire %s, Missed %d", hms(p.at), p.why, hms(p.slot), p.missed)
}

// predict applies the catch-up rule for a leader, that never led before,
// looking for due slots at t; prev is the latest run before (nil if none),
// and slots before since are not counted as missed. ok tells whether a
// first run matches it.
func predict(sched ddblease.Schedule, prev *ddblease.RunRecord, t, since time.Time) (prediction, func(ddblease.RunRecord) bool) {
	p := prediction{at: t}
	floor := t.Add(-*window)
	latest := sched.Next(t.Add(-*tick)) // the slot in (t-tick, t]
	switch first := sched.Next(floor); {
	case first.After(t):
		p.slot, p.why = first, fmt.Sprintf("finds no slot due within the %v window, and waits for the next", *window)
	case prev != nil && !latest.After(prev.Slot):
		p.slot, p.why = sched.Next(latest), "finds the latest due slot already run, and waits for the next"
	default:
		p.slot, p.late, p.why = latest, true, fmt.Sprintf("catches up the latest due slot, within the %v window", *window)
		if prev != nil && prev.Slot.After(floor) {
			floor = prev.Slot
		}
		for s := sched.Next(floor); s.Before(latest); s = sched.Next(s) {
			if !s.Before(since) {
				p.missed++
			}
		}
	}
	return p, func(r ddblease.RunRecord) bool {
		return r.Slot.Equal(p.slot) && (r.MissedUnknown || r.Missed == p.missed)
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// effectOf reads the slot's effect from the sink, with a consistent read.
func (c *cluster) effectOf(ctx context.Context, db *dynamodb.Client, key string, effects map[string]int) (*effectItem, error) {
	if key == "" {
		return nil, nil // no job run in this process claimed the slot
	}
	out, err := db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(c.table),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "effect#" + key},
			"sk": &types.AttributeValueMemberS{Value: "effect"}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil || out.Item == nil {
		if err == nil && effects[key] > 0 {
			c.fail("%s: a guarded put was accepted but the sink has no item", key)
		}
		return nil, err
	}
	var e effectItem
	if by, ok := out.Item["by"].(*types.AttributeValueMemberS); ok {
		e.by = by.Value
	}
	if f, ok := out.Item["fence"].(*types.AttributeValueMemberN); ok {
		e.fence, _ = strconv.ParseInt(f.Value, 10, 64)
	}
	return &e, nil
}
