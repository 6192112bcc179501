package ddblease

import (
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// takeover is the one home of the rule by which a contender may take a
// lease it has observed. A lease may be taken when:
//   - there is no lease item;
//   - its recorded expiry is older than MaxClockSkew on the contender's
//     clock (the writer's clock may be that much behind);
//   - the contender has watched one renewal version unchanged for a whole
//     lease (the longer of its own LeaseDuration and the duration written)
//     on the runtime's monotonic clock: no clocks compared at all, and no
//     step of the wall clock (Options.Now) moves it;
//   - it is this handle's own item, carrying a version this handle wrote.
//
// The same value yields the DynamoDB condition that decides (condition),
// the client-side "may I try now" (mayTry), and how long a standby waits
// before the lease becomes takeable by time alone (wait). Each takes the
// instant as sent: by Options.Now, which expiries are compared with, and
// by the runtime's clock, which the watch runs on.
type takeover struct {
	obs   observation
	owner string        // this handle's owner id
	sid   string        // this handle's pool session, if live: the items bound to it are this handle's to take
	skew  time.Duration // MaxClockSkew
	lease time.Duration // this handle's LeaseDuration
}

// takeoverRule returns the rule for the last observation.
func (l *Lease) takeoverRule() takeover {
	l.mu.Lock()
	r := takeover{obs: l.obs, owner: l.opts.Owner, skew: l.opts.MaxClockSkew, lease: l.opts.LeaseDuration}
	l.mu.Unlock()
	if l.pool != nil {
		if s := l.pool.liveSession(); s != nil {
			r.sid = s.sid
		}
	}
	return r
}

// expiredAt is when the observed lease becomes takeable by its recorded
// expiry, on this handle's clock.
func (r takeover) expiredAt() time.Time { return r.obs.rec.ExpiresAt.Add(r.skew) }

// watchedAt is when the observed renewal version will have been watched
// unchanged for a whole lease, by the runtime's clock.
func (r takeover) watchedAt() time.Time {
	return r.obs.since.Add(max(r.lease, r.obs.rec.Duration))
}

// watched returns the renewal version watched unchanged for a whole lease.
func (r takeover) watched(now sent) (string, bool) {
	if !r.obs.present {
		return "", false
	}
	return r.obs.rec.version, !now.real.Before(r.watchedAt())
}

// mayTry reports whether an acquisition attempt may succeed now: nothing
// observed yet, no item, this handle's own item, or takeable by expiry or
// by watching.
func (r takeover) mayTry(now sent) bool {
	if !r.obs.valid || !r.obs.present {
		return true
	}
	if r.obs.rec.Session != "" {
		// Bound to a pool session: only the session rules free it.
		return r.obs.boundFree || r.sid != "" && r.obs.rec.Owner == r.owner && r.obs.rec.Session == r.sid
	}
	if r.obs.rec.Owner == r.owner {
		return true
	}
	_, watched := r.watched(now)
	return watched || now.at.After(r.expiredAt())
}

// wait returns how long until the observed lease becomes takeable by time
// alone (0 if it is, or if there is nothing to wait for).
func (r takeover) wait(now sent) time.Duration {
	if !r.obs.present || r.obs.rec.Session != "" {
		return 0
	}
	return max(min(r.expiredAt().Sub(now.at), r.watchedAt().Sub(now.real))+time.Millisecond, 0)
}

// condition returns the DynamoDB condition under which an acquisition
// sent at now takes the item, adding its values: the item is absent, or
// takeable by expiry, by watching, or ours (mine: the condition that the
// item carries a version this handle wrote, "" if none). rv is the version
// the acquisition writes: an item that carries it already is refused, so
// that a retry of a write that landed does not take a second fence. The
// item must also be well formed: a fence that is missing or not a number
// would restart fences.
//
// An item bound to a pool session is taken by expiry or watching never:
// only as this handle's own, or, for a lease of a pool, when it is bound
// to this handle's live session, or to the session last observed once
// the session rules freed it (sessionFree), on condition that it is still
// bound to that session with the fence observed.
func (r takeover) condition(now sent, rv, mine string, values map[string]types.AttributeValue) string {
	takeable := "#exp < :cutoff"
	values[":cutoff"] = avN(now.at.Add(-r.skew).UnixMilli())
	if seen, ok := r.watched(now); ok {
		takeable += " OR #rv = :seen"
		values[":seen"] = avS(seen)
	}
	takeable = "(attribute_not_exists(#ses) OR #ses = :nos) AND (" + takeable + ")"
	values[":nos"] = avS(noSession)
	if mine != "" {
		takeable += " OR (#owner = :me AND " + mine + ")"
	}
	if r.sid != "" {
		takeable += " OR (#owner = :me AND #ses = :mysid)"
		values[":mysid"] = avS(r.sid)
	}
	if o := r.obs; o.present && o.rec.Session != "" && o.boundFree {
		takeable += " OR (#owner = :bo AND #ses = :bs AND #fence = :bf)"
		values[":bo"], values[":bs"], values[":bf"] = avS(o.rec.Owner), avS(o.rec.Session), avN(o.rec.Fence)
	}
	values[":rv"], values[":tn"], values[":ts"] = avS(rv), avS("N"), avS("S")
	wellFormed := "attribute_type(#fence, :tn) AND attribute_type(#owner, :ts) AND attribute_type(#rv, :ts) " +
		"AND attribute_type(#exp, :tn)"
	return "attribute_not_exists(#pk) OR ((" + takeable + ") AND #rv <> :rv AND " + wellFormed + ")"
}
