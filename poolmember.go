package ddblease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns a pool's membership: the renewal that writes this
// replica's member item (its session, session.go) and reads the others',
// how a member is judged live or gone, the removal of dead members, the
// pool's directory entry, and the leave at the end of a Run.

// maxWrites bounds the writes of one renewal whose answers keep showing
// another view than the one written.
const maxWrites = 3

// renew writes this replica's member item (its expiry, the view it acts
// on, its job list and the jobs it declines) and returns the live members
// the pool's partition holds. An answer that shows another view than the
// one written is written again at once, so that the others learn within a
// round trip which view this replica acts on. changed, if not nil, is
// what a look between renewals found (poolRun.look): its view is the
// first written, instead of a write of the view it replaces followed by
// a second one.
func (p *Pool) renew(ctx context.Context, changed *poolView) (poolView, error) {
	seen, declined := p.view()
	if changed != nil {
		seen = *changed
	}
	view := p.viewOf(seen)
	for range maxWrites {
		members, sent, err := p.write(ctx, view, slices.Sorted(maps.Keys(declined)))
		if err != nil {
			return poolView{}, err
		}
		now := p.opts.sendNow()
		p.watch(members, sent)
		p.forgetDead(ctx, members, now.at)
		seen = p.liveView(members, now)
		if p.viewOf(seen) == view {
			break
		}
		view = p.viewOf(seen)
	}
	return seen, nil
}

// write renews this replica's session (its member item: a new session
// at once when the current one ended), handles the notes it returns,
// then reads the pool's member items, and returns the members they list
// and when that read was sent, by the runtime clock.
func (p *Pool) write(ctx context.Context, view string, declined []string) (map[string]member, time.Time, error) {
	list, err := json.Marshal(declined)
	if err != nil {
		return nil, time.Time{}, err
	}
	if declined == nil {
		list = []byte("[]")
	}
	f := memberFields{view: view, list: p.jobsHash, declined: string(list), leaving: p.leaving.Load()}
	s := p.session()
	notes, err := s.renew(ctx, f)
	if errors.Is(err, errSessionEnded) {
		p.log.Info("ddblease: the pool session ended; starting another", "err", err)
		s = p.session()
		notes, err = s.renew(ctx, f)
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	p.handleNotes(ctx, s, notes)
	return p.readMembers(ctx)
}

// readMembers reads the pool's member items (a strongly consistent Query
// of its partition) and returns the members they list and when the read
// was sent, by the runtime clock.
func (p *Pool) readMembers(ctx context.Context) (map[string]member, time.Time, error) {
	y := p.opts.Layout
	lo, hi := prefixRange(skMember)
	sent := time.Now()
	items, err := query(ctx, p.db, p.table, y, y.poolPartition(p.name), lo, hi, 0, false, p.opts.CallTimeout,
		fmt.Sprintf("pool %q: read the members", p.name))
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make(map[string]member, len(items))
	for _, item := range items {
		m, err := decodeMember(y, item)
		if err != nil {
			p.log.Warn("ddblease: the pool has a malformed member item; ignoring it", "err", err)
		}
		if m.owner != "" {
			out[m.owner] = m
		}
	}
	return out, sent, nil
}

// handleNotes handles the jobs noted in the session's member item
// (Pool.noticeNote); the next renewal deletes the notes handled.
func (p *Pool) handleNotes(ctx context.Context, s *session, notes []string) {
	byJob := map[string][]string{}
	var jobs []string
	for _, n := range notes {
		job := noteJob(n)
		if byJob[job] == nil {
			jobs = append(jobs, job)
		}
		byJob[job] = append(byJob[job], n)
	}
	var handled []string
	for _, job := range jobs { // each job read once, however many notes name it
		if l := p.Lease(job); l == nil || p.noticeNote(ctx, l, s) {
			handled = append(handled, byJob[job]...)
		}
	}
	s.noteHandled(handled)
}

// watch records the members read by a Query sent at sent and, for each,
// since when its session's version has been read unchanged, by the
// runtime clock; for each session asked for in gone, it forgets it if
// the read shows it (the lapse rules judge it then), or notes when the
// first read sent after the ask ended without it (sessionFree).
func (p *Pool) watch(members map[string]member, sent time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A copy: sessionFree marks the ones it ended in it, under p.mu, while
	// the renewal goes on reading members without it.
	p.members = maps.Clone(members)
	real := time.Now()
	for owner, m := range members {
		if w, ok := p.watched[owner]; !ok || w.sid != m.sid || w.sv != m.sv {
			p.watched[owner] = watchedEntry{sid: m.sid, sv: m.sv, since: real}
		}
	}
	for owner := range p.watched {
		if _, ok := members[owner]; !ok {
			delete(p.watched, owner)
		}
	}
	for k, g := range p.gone {
		owner, sid, _ := strings.Cut(k, "\x00")
		switch m, ok := members[owner]; {
		case ok && m.sid == sid, real.Sub(g.asked) > 4*p.opts.LeaseDuration:
			delete(p.gone, k)
		case g.missing.IsZero() && sent.After(g.asked):
			g.missing = real
			p.gone[k] = g
		}
	}
}

// unchanged returns how long owner's session version has been read
// unchanged.
func (p *Pool) unchanged(owner string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.watched[owner]
	if !ok {
		return 0
	}
	return time.Since(w.since)
}

// liveIn returns the members that take jobs at now, sorted: not leaving,
// and with a session not ended nor lapsed (lapseOf: its expiry
// MaxClockSkew old, or its version read unchanged for a LeaseDuration by
// the runtime clock, which holds when a replica whose wall clock was
// ahead wrote an expiry too far out). This replica's own item is judged
// by its expiry alone.
func (p *Pool) liveIn(members map[string]member, now sent) []string {
	p.mu.Lock()
	watched := maps.Clone(p.watched)
	p.mu.Unlock()
	live := []string{}
	for owner, m := range members {
		w := watched[owner]
		if owner == p.opts.Owner {
			w = watchedEntry{}
		}
		if m.exp >= 0 && !m.leaving && m.ended == "" && !p.lapseOf(m, w).passed(now) {
			live = append(live, owner)
		}
	}
	slices.Sort(live)
	return live
}

// liveView returns the view of the members read: those live at now
// (liveIn), each with its entry.
func (p *Pool) liveView(members map[string]member, now sent) poolView {
	v := poolView{live: p.liveIn(members, now), members: map[string]member{}}
	for _, r := range v.live {
		v.members[r] = members[r]
	}
	return v
}

// untilLapse returns how long until the first member this replica counts
// live, other than itself, lapses by time alone (lapseOf), and false when
// there is none: the membership loop looks at the members then, so that a
// dead member's jobs are taken as soon as its lapse allows, as a lease's
// standby takes a lease. Each member is judged by its entry in looked,
// the members a read since the last renewal listed, if it is there, and
// by the renewal's read if not.
func (p *Pool) untilLapse(looked map[string]member) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.opts.sendNow()
	d, any := time.Duration(0), false
	for _, owner := range p.seen.live {
		m, ok := looked[owner]
		if !ok {
			m, ok = p.seen.members[owner]
		}
		if owner == p.opts.Owner || !ok {
			continue
		}
		w := p.lapseOf(m, p.watched[owner]).wait(now)
		if !any || w < d {
			d, any = w, true
		}
	}
	return d, any
}

// maxForget bounds the members one renewal ends or removes.
const maxForget = 10

// forgetDead removes the members of replicas long gone (dead, or whose
// leave failed) in two steps, so that the pool's partition does not grow
// with every deploy and no replica waits on a session that left its item.
// A member whose expiry is older than a LeaseDuration, or which has been
// read unchanged for two, is first ended (endSession): every replica that
// reads the mark takes its jobs at once (sessionFree), where a deleted
// item would have them wait a lease after the read that missed it. An
// ended member is deleted once its expiry is older than three leases, or
// it has been read unchanged for four, by which time the replicas the
// assignment gives its jobs have read the mark. A malformed member is
// deleted at once, and one without a session once it is gone. Each write
// is conditional on the session and its version read, or, for an item
// without a session, on having none; a failure is left for a later
// renewal.
func (p *Pool) forgetDead(ctx context.Context, members map[string]member, now time.Time) {
	n := 0
	for owner, m := range members {
		if owner == p.opts.Owner || n == maxForget {
			continue
		}
		bound := m.exp >= 0 && m.sid != "" && m.sv != ""
		switch {
		case bound && m.ended == "" && p.goneFor(owner, m, now, 1):
			n++
			if err := p.endSession(ctx, m); err == nil {
				p.markEnded(m)
			}
		case m.exp < 0, !bound && p.goneFor(owner, m, now, 1), m.ended != "" && p.goneFor(owner, m, now, 3):
			n++
			p.deleteMember(ctx, m)
		}
	}
}

// goneFor reports whether a member's expiry is older than k leases at
// now, or its version has been read unchanged for 2k.
func (p *Pool) goneFor(owner string, m member, now time.Time, k time.Duration) bool {
	return time.UnixMilli(m.exp).Add(k*p.opts.LeaseDuration).Before(now) || p.unchanged(owner) >= 2*k*p.opts.LeaseDuration
}

// deleteMember deletes a member item on condition that it holds the
// session and version read (none, for an item without a session).
func (p *Pool) deleteMember(ctx context.Context, m member) {
	in := &dynamodb.DeleteItemInput{TableName: aws.String(p.table), Key: p.opts.Layout.memberKey(p.name, m.owner),
		ExpressionAttributeNames: map[string]string{"#sid": memberSession}}
	if m.sid != "" && m.sv != "" {
		in.ConditionExpression = aws.String("#sid = :sid AND #sv = :sv")
		in.ExpressionAttributeNames["#sv"] = memberVersion
		in.ExpressionAttributeValues = map[string]types.AttributeValue{":sid": avS(m.sid), ":sv": avS(m.sv)}
	} else {
		in.ConditionExpression = aws.String("attribute_not_exists(#sid)")
	}
	cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
	_, err := p.db.DeleteItem(cctx, in)
	cancel()
	if err == nil {
		p.log.Info("ddblease: removed a replica gone from the pool", "member", m.owner)
	}
}

// leave ends this replica's session, whose jobs have all been resigned,
// and deletes its member item (on condition that it holds the session),
// so that the pool's partition does not keep it. A failure is logged: a
// job whose resignation failed waits for the others' watch of the
// session, as after a crash.
func (p *Pool) leave() {
	p.mu.Lock()
	s := p.sess
	p.seen = poolView{}
	p.mu.Unlock()
	s.end(LossDeadline, func(t *term) error {
		return fmt.Errorf("%w: %q fence %d: the pool stopped", ErrLost, t.l.job, t.fence)
	})
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.CallTimeout)
	defer cancel()
	_, err := p.db.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(p.table), Key: p.opts.Layout.memberKey(p.name, p.opts.Owner),
		ConditionExpression:       aws.String("#sid = :sid"),
		ExpressionAttributeNames:  map[string]string{"#sid": memberSession},
		ExpressionAttributeValues: map[string]types.AttributeValue{":sid": avS(s.sid)},
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		p.log.Warn("ddblease: could not leave the pool; the others remove its member item after its expiry", "err", err)
	}
}

// list writes the pool's directory entry, with its jobs, so that Admin
// lists it. A failure is logged: the pool runs all the same.
func (p *Pool) list(ctx context.Context) {
	entry := p.opts.Layout.directoryKey(skPoolPrefix, p.name)
	entry[attrPool] = avS(p.name)
	entry[attrPoolJobs] = &types.AttributeValueMemberSS{Value: p.jobs}
	cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
	defer cancel()
	if _, err := p.db.PutItem(cctx, &dynamodb.PutItemInput{TableName: aws.String(p.table), Item: entry}); err != nil {
		p.log.Warn("ddblease: could not list the pool in the table's directory", "err", err)
	}
}
