package ddblease

import (
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
)

// The takeover rule, without a server: what a contender may try, when, and
// the condition that decides.
func TestTakeoverRule(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const skew, lease = time.Second, 30 * time.Second
	held := func(owner string, expires time.Time, since time.Time, written time.Duration) observation {
		return observation{valid: true, present: true, since: since,
			rec: seenItem{Owner: owner, Fence: 7, ExpiresAt: expires, Duration: written, version: "v7"}}
	}
	for _, c := range []struct {
		name     string
		obs      observation
		mayTry   bool
		wait     time.Duration // until takeable by time alone, plus a millisecond; 0 if long past
		watched  bool
		clauses  []string
		excluded []string
		wall     time.Duration // the wall clock (Options.Now) ahead of the runtime's by this
		ours     bool          // the item carries a version this handle wrote
	}{
		{name: "nothing observed yet", obs: observation{}, mayTry: true},
		{name: "no item", obs: observation{valid: true}, mayTry: true},
		{name: "own item", obs: held("me", now.Add(20*time.Second), now, lease), ours: true, mayTry: true,
			wait: 21*time.Second + time.Millisecond},
		{name: "this owner, a version another handle wrote (another process with the same Owner)",
			obs: held("me", now.Add(20*time.Second), now, lease), wait: 21*time.Second + time.Millisecond, excluded: []string{":seen"}},
		{name: "live, another owner", obs: held("b", now.Add(20*time.Second), now, lease),
			wait: 21*time.Second + time.Millisecond, excluded: []string{":seen"}},
		{name: "expired by less than the skew", obs: held("b", now.Add(-skew/2), now.Add(-time.Second), lease),
			wait: skew/2 + time.Millisecond},
		{name: "expired by exactly the skew", obs: held("b", now.Add(-skew), now.Add(-time.Second), lease),
			wait: time.Millisecond},
		{name: "expired by more than the skew", obs: held("b", now.Add(-2*skew), now.Add(-time.Second), lease),
			mayTry: true},
		{name: "resigned (expiry zero)", obs: held("b", time.Time{}, now, lease), mayTry: true},
		{name: "watched for less than a lease", obs: held("b", now.Add(time.Hour), now.Add(-lease+time.Second), lease),
			wait: time.Second + time.Millisecond},
		{name: "watched for a whole lease", obs: held("b", now.Add(time.Hour), now.Add(-lease), lease),
			mayTry: true, watched: true, clauses: []string{"#rv = :seen"}, wait: time.Millisecond}, // the wait's slack
		{name: "watched for a whole lease by the runtime's clock, the wall clock stepped back an hour",
			obs: held("b", now.Add(time.Hour), now.Add(-lease), lease), wall: -time.Hour,
			mayTry: true, watched: true, clauses: []string{"#rv = :seen"}, wait: time.Millisecond},
		{name: "the wall clock stepped an hour ahead as the watch began",
			obs: held("b", now.Add(2*time.Hour), now, lease), wall: time.Hour,
			wait: lease + time.Millisecond, excluded: []string{":seen"}},
		{name: "the writer's lease is longer than ours", obs: held("b", now.Add(time.Hour), now.Add(-lease), 2*lease),
			wait: lease + time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := takeover{obs: c.obs, owner: "me", ours: c.ours, skew: skew, lease: lease}
			at := sent{at: now.Add(c.wall), real: now}
			assert.Equal(t, c.mayTry, r.mayTry(at), "mayTry")
			assert.Equal(t, c.wait, r.wait(at), "wait")
			_, watched := r.watched(at)
			assert.Equal(t, c.watched, watched, "watched")
			values := map[string]types.AttributeValue{}
			cond := r.condition(at, "new", "#rv IN (:mine0)", values)
			for _, want := range append([]string{"attribute_not_exists(#pk)", "#exp < :cutoff", "#rv <> :rv",
				"(#owner = :me AND #rv IN (:mine0))", "attribute_type(#fence, :tn)"}, c.clauses...) {
				assert.Contains(t, cond, want)
			}
			for _, not := range c.excluded {
				assert.NotContains(t, cond, not)
			}
			assert.Equal(t, avN(at.at.Add(-skew).UnixMilli()), values[":cutoff"], "cutoff = now - skew, by the wall clock")
			assert.Equal(t, strings.Count(cond, "("), strings.Count(cond, ")"))
		})
	}
}
