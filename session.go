package ddblease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns a pool replica's session (docs/sessions.md): its member
// item (member, decodeMember) and its renewal, its local deadline and the
// end of every tenure bound to it; and the rules by which a replica takes
// a job bound to another replica's session (sessionFree, and the end it
// writes first).

// session is one session of a pool replica: from its first renewal to
// its end (a refusal, its deadline passing, or the end of Pool.Run). It
// owns its lifetime (lifetime.go) and the tenures bound to it: each job
// the replica acquires while the session is live is bound to it, leads
// until the session's local deadline, and ends with it. It is the
// liveness of those tenures (tenure.go).
type session struct {
	p   *Pool
	sid string
	lt  *lifetime // from each confirmed renewal to the deadline it gives

	mu      sync.Mutex
	sv      string             // the version of the last confirmed renewal; "" before the first
	terms   map[*term]struct{} // the open tenures bound to it
	handled []string           // notes handled, deleted from the item by the next renewal
}

func newSession(p *Pool) *session {
	s := &session{p: p, sid: randomID(8), terms: map[*term]struct{}{}}
	s.lt = newLifetime(&p.opts, func() {
		s.end(LossDeadline, func(t *term) error {
			return fmt.Errorf("%w: %q fence %d: the pool session's local deadline passed without a confirmed renewal",
				ErrLost, t.l.job, t.fence)
		})
	})
	return s
}

// left returns how long the session may last from now by both clocks; 0
// before its first confirmed renewal and once it is over.
func (s *session) left() time.Duration { return s.lt.left() }

// bind binds an opening tenure to the session; false when the session
// is not live. The term's context must be set. The check and the binding
// are one step under s.mu, as the session's end is, so that no tenure is
// bound to a session that ended.
func (s *session) bind(t *term, _ sent) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lt.left() <= 0 {
		return false
	}
	s.terms[t] = struct{}{}
	return true
}

func (s *session) life() *lifetime { return s.lt }

// release forgets a tenure that ended. Called with the lease's mu held.
func (s *session) release(t *term) {
	s.mu.Lock()
	delete(s.terms, t)
	s.mu.Unlock()
}

// renewTerm has nothing to write: the session's renewal renews the tenure,
// which leads while the session lives.
func (s *session) renewTerm(_ context.Context, t *term) error {
	if !t.leads() {
		err := fmt.Errorf("%w: %q fence %d: the pool session's local deadline passed", ErrLost, t.l.job, t.fence)
		t.end(err, LossDeadline)
		return err
	}
	return nil
}

func (s *session) keep(*keeper)  {}
func (s *session) drain(*keeper) {}

// drainExpired resigns the job: the session would renew it while it
// lives.
func (s *session) drainExpired(t *term) {
	_ = t.resignRetrying(context.Background(), fmt.Errorf("%w: %q fence %d: DrainTimeout passed", ErrLost, t.l.job, t.fence))
}

// freeing clears the item's session binding: a standby of the pool takes
// it at its next poll.
func (s *session) freeing(u *leaseUpdate) { u.unbound() }

// binds binds an acquired item to the session and its pool.
func (s *session) binds(u *leaseUpdate) { u.bound(s.sid, s.p.name) }

// end ends the session and every tenure bound to it, with cause built for
// each.
func (s *session) end(reason LossReason, cause func(t *term) error) {
	s.mu.Lock()
	s.lt.end()
	terms := s.terms
	s.terms = map[*term]struct{}{}
	s.mu.Unlock()
	for t := range terms {
		t.end(cause(t), reason)
	}
}

// confirmed records a renewal with version sv, sent at snt, as
// confirmed now. A confirmation at or after the deadline it extends ends
// the session: a late answer never revives it.
func (s *session) confirmed(sv string, snt sent) bool {
	if !s.lt.confirm(snt) {
		s.end(LossDeadline, func(t *term) error {
			return fmt.Errorf("%w: %q fence %d: the pool session's renewal was confirmed only after its local deadline",
				ErrLost, t.l.job, t.fence)
		})
		return false
	}
	s.mu.Lock()
	s.sv = sv
	s.mu.Unlock()
	return true
}

// memberFields is what a renewal writes besides the session's own.
type memberFields struct {
	view     string
	list     string
	declined string // JSON array
	leaving  bool
}

// renew renews the session with one conditional write of the member
// item: before the first confirmed renewal, on condition that the item
// does not hold this session ended; after it, that it holds this session
// and no end mark. It returns the jobs noted in the item (an operator
// changed their lease items), and errSessionEnded, having ended the
// session, when the condition failed.
func (s *session) renew(ctx context.Context, f memberFields) (notes []string, err error) {
	p := s.p
	s.mu.Lock()
	first, handled := s.sv == "", slices.Clone(s.handled)
	s.mu.Unlock()
	snt := p.opts.sendNow()
	sv := randomID(8)
	names := map[string]string{"#x": memberExpiry, "#ren": attrRenewedAt, "#v": memberView, "#j": memberJobs, "#d": memberDeclined,
		"#sid": memberSession, "#sv": memberVersion, "#end": memberEnded, "#lv": memberLeaving, "#n": memberNotes}
	values := map[string]types.AttributeValue{
		":x": avN(p.opts.expiry(snt.at)), ":ren": avN(snt.at.UnixMilli()), ":v": avS(f.view), ":j": avS(f.list),
		":d": avS(f.declined), ":sid": avS(s.sid), ":sv": avS(sv), ":lv": avBool(f.leaving),
	}
	// The renewal's send time (renewedAt, as a lease item's) is the last
	// renewal of every job bound to the session: Admin reports it as
	// theirs (sessionExpiries).
	update := "SET #x = :x, #ren = :ren, #v = :v, #j = :j, #d = :d, #sid = :sid, #sv = :sv, #lv = :lv"
	values[":nos"] = avS(noSession)
	cond := "#sid = :sid AND (attribute_not_exists(#end) OR #end = :nos)"
	switch {
	case first:
		// A new session replaces whatever the item held (an earlier Run's
		// session, ended or not: its jobs wait for the watch, sessionFree).
		// The notes left for it name jobs this one reads once.
		update += ", #end = :nos"
		cond = "attribute_not_exists(#sid) OR #sid <> :sid OR attribute_not_exists(#end) OR #end = :nos"
	default:
		update += ", #end = :nos"
	}
	if len(handled) > 0 {
		update += " DELETE #n :h"
		values[":h"] = &types.AttributeValueMemberSS{Value: handled}
	} else {
		delete(names, "#n")
	}
	key := p.opts.Layout.memberKey(p.name, p.opts.Owner)
	cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
	out, err := p.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(p.table), Key: key, UpdateExpression: aws.String(update),
		ConditionExpression: aws.String(cond), ExpressionAttributeNames: names, ExpressionAttributeValues: values,
		ReturnValues: types.ReturnValueAllNew,
	})
	cancel()
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		s.end(LossDeposed, func(t *term) error {
			return fmt.Errorf("%w: %q fence %d: the pool session was ended by another replica", ErrLost, t.l.job, t.fence)
		})
		p.warnIfReplaced(ctx, key, s.sid)
		return nil, fmt.Errorf("%w: member item %q", errSessionEnded, p.opts.Layout.describe(key))
	case err != nil:
		return nil, fmt.Errorf("ddblease: pool %q: renew its member item %q: %w", p.name, p.opts.Layout.describe(key),
			explainTableError(ctx, p.db, p.table, p.opts.Layout, err))
	}
	if !s.confirmed(sv, snt) {
		return nil, fmt.Errorf("%w: member item %q: confirmed after the session's deadline", errSessionEnded, p.opts.Layout.describe(key))
	}
	s.mu.Lock()
	s.handled = nil
	s.mu.Unlock()
	if n, ok := out.Attributes[memberNotes].(*types.AttributeValueMemberSS); ok {
		notes = slices.Sorted(slices.Values(n.Value))
	}
	return notes, nil
}

// warnIfReplaced reads the member item whose renewal of session sid was
// refused, and logs a warning (at most one every warnEvery) when another
// session replaced sid without ending it: only a process that runs the
// pool under this replica's Owner writes that item, and two such
// processes end each other's sessions, their jobs moving between them.
// A session another replica ended bears its end mark instead. The read is
// a strongly consistent Query of the pool's partition, bounded to the one
// item (the pool's replicas are granted Query there, not GetItem:
// docs/deploy.md); a read that fails is logged too, at most one line every
// warnEvery, since the warning it would have given cannot be, unless ctx
// ended (the replica stops).
func (p *Pool) warnIfReplaced(ctx context.Context, key map[string]types.AttributeValue, sid string) {
	y := p.opts.Layout
	sk := skMember + p.opts.Owner
	items, err := query(ctx, p.db, p.table, y, y.poolPartition(p.name), sk, sk, 1, false, p.opts.CallTimeout,
		fmt.Sprintf("pool %q: read the member item whose renewal was refused", p.name))
	if err != nil && ctx.Err() != nil {
		return // the replica is stopping: nothing to tell
	}
	if err != nil {
		if ok, suppressed := p.warn.allow("same owner read", time.Now()); ok {
			p.log.Warn("ddblease: could not read the member item whose renewal was refused, to tell whether another process "+
				"runs this pool under this replica's Owner", "member", y.describe(key), "err", err,
				"similar_warnings_suppressed", suppressed)
		}
		return
	}
	if len(items) == 0 {
		return
	}
	m, err := decodeMember(y, items[0])
	if err != nil || m.sid == sid || m.ended != "" {
		return
	}
	if ok, suppressed := p.warn.allow("same owner", time.Now()); ok {
		p.log.Warn("ddblease: another process runs this pool under this replica's Owner, which Options.Owner forbids: "+
			"they end each other's sessions, and the jobs move between them", "member", y.describe(key),
			"similar_warnings_suppressed", suppressed)
	}
}

// noteHandled records jobs whose notes were handled: the next renewal
// deletes them from the member item.
func (s *session) noteHandled(jobs []string) {
	s.mu.Lock()
	s.handled = append(s.handled, jobs...)
	s.mu.Unlock()
}

// sessionFree reports whether a job bound to owner's session sid may be
// taken now (docs/sessions.md, rules 3 and 4): the session is one of this
// Run's own and over; its member item was read with the end mark; it
// lapsed (its expiry MaxClockSkew old, or its version read unchanged for
// a LeaseDuration) and this replica ended it, with a write conditional on
// the version it watched; or a member read sent after the first ask for
// it ended without it (its item deleted, or holding another session) a
// lease ago by the runtime's clock, which outlasts any deadline of its
// holder (goneEntry): the longer of this replica's LeaseDuration and
// held, the one the job's lease item records (its holder's; 0 if none).
func (p *Pool) sessionFree(ctx context.Context, owner, sid string, held time.Duration) bool {
	if owner == p.opts.Owner {
		p.mu.Lock()
		past, live := p.pastSessions[sid], p.sess != nil && p.sess.sid == sid
		p.mu.Unlock()
		if past || live {
			return past
		}
		// A session of this Owner that this Run never had: a predecessor's
		// (a process restarted under the same Owner, as a StatefulSet's pod
		// is, or an earlier Run). This replica's session replaced it in the
		// member item, so the rule for a session gone from its item frees
		// its jobs.
	}
	p.mu.Lock()
	m, ok := p.members[owner]
	w := p.watched[owner]
	if !ok || m.sid != sid {
		k := owner + "\x00" + sid
		g, asked := p.gone[k]
		if !asked {
			p.gone[k] = goneEntry{asked: time.Now()}
		}
		p.mu.Unlock()
		return !g.missing.IsZero() && time.Since(g.missing) >= max(p.opts.LeaseDuration, held)
	}
	if m.ended != "" {
		p.mu.Unlock()
		return true
	}
	if !p.lapsed(m, w) {
		p.mu.Unlock()
		return false
	}
	if done, ok := p.ending[m.sid]; ok {
		// Another of its jobs is ending it (one end per session, however
		// many of its jobs ask): its outcome is this one's.
		p.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return false
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		cur, ok := p.members[owner]
		return ok && cur.sid == m.sid && cur.ended != ""
	}
	done := make(chan struct{})
	p.ending[m.sid] = done
	p.mu.Unlock()
	err := p.endSession(ctx, m)
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.ending, m.sid)
	defer close(done)
	if err != nil {
		p.log.Debug("ddblease: could not end a lapsed pool session", "member", owner, "err", err)
		return false
	}
	p.markEndedLocked(m)
	return true
}

// markEnded records in the members last read that this replica ended
// m's session, if the entry still holds it, so that its jobs are free
// here before the next read shows the mark.
func (p *Pool) markEnded(m member) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.markEndedLocked(m)
}

// markEndedLocked is markEnded, with p.mu held.
func (p *Pool) markEndedLocked(m member) {
	if cur, ok := p.members[m.owner]; ok && cur.sid == m.sid && cur.sv == m.sv {
		cur.ended = p.opts.Owner
		p.members[m.owner] = cur
	}
}

// lapsed reports whether a member's session lapsed (lapseOf).
func (p *Pool) lapsed(m member, w watchedEntry) bool { return p.lapseOf(m, w).passed(p.opts.sendNow()) }

// lapseOf returns the lapse rule of a member's session as this replica
// watched it (w: its version as last read, and since when): its expiry,
// and its version watched for the longer of this replica's LeaseDuration
// and the member's own (its expiry less its renewal's send time, both by
// its clock), as a lease's takeover uses the longer of the reader's and
// the one its item records. A replica whose LeaseDuration is longer
// (a deploy that lengthens it) keeps its jobs until its own deadline.
func (p *Pool) lapseOf(m member, w watchedEntry) lapse {
	x := lapse{expires: time.UnixMilli(m.exp), lease: p.opts.LeaseDuration, skew: p.opts.MaxClockSkew}
	if m.renewed > 0 && m.exp > m.renewed {
		x.lease = max(x.lease, time.Duration(m.exp-m.renewed)*time.Millisecond)
	}
	if w.sid == m.sid && w.sv == m.sv {
		x.since = w.since
	}
	return x
}

// endSession ends a lapsed session with a write conditional on the
// session and the version watched, so that no renewal can land after it.
func (p *Pool) endSession(ctx context.Context, m member) error {
	cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
	defer cancel()
	_, err := p.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(p.table), Key: p.opts.Layout.memberKey(p.name, m.owner),
		UpdateExpression:          aws.String("SET #end = :me"),
		ConditionExpression:       aws.String("#sid = :sid AND #sv = :sv"),
		ExpressionAttributeNames:  map[string]string{"#end": memberEnded, "#sid": memberSession, "#sv": memberVersion},
		ExpressionAttributeValues: map[string]types.AttributeValue{":me": avS(p.opts.Owner), ":sid": avS(m.sid), ":sv": avS(m.sv)},
	})
	if err == nil {
		p.log.Info("ddblease: ended the lapsed session of a replica gone from the pool", "member", m.owner)
	}
	return err
}

// frees is the binding's (lease.go): it applies the session rules
// (sessionFree) to the lease item the pool's lease l last observed, when
// it is bound to a session other than this replica's live one, and
// records whether they free it. It reports whether they freed it now.
func (p *Pool) frees(ctx context.Context, l *Lease) bool {
	l.mu.Lock()
	obs := l.obs
	l.mu.Unlock()
	if !obs.present || obs.rec.Session == "" || obs.boundFree || obs.rec.Pool != p.name {
		return false
	}
	if !p.sessionFree(ctx, obs.rec.Owner, obs.rec.Session, obs.rec.Duration) {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if o := l.obs.rec; l.obs.present && o.version == obs.rec.version && o.Fence == obs.rec.Fence && o.Session == obs.rec.Session {
		l.obs.boundFree = true
		return true
	}
	return false
}

// noticeNote handles a note in the member item of session s: an operator
// changed this lease's item (Admin). It reads the item (strongly
// consistent) and, for the tenure bound to s, does what a heartbeat's
// answer does for a lease of its own: a moved fence (a forced release)
// ends the tenure; other changes reach the keeper (heartbeat.go). A job
// released by force from this replica is declined, as after a resign
// request (Pool.decline), before its tenure ends, so that it moves to
// another replica instead of coming back here. An item bound to s that no
// tenure holds (a forced release, whether its tenure ended here or before,
// by a resignation that the release refused) is freed: no one else may
// take it while s lives. It reports whether the note was handled; a
// failed read or free leaves it for the next renewal.
func (p *Pool) noticeNote(ctx context.Context, l *Lease, s *session) bool {
	rec, present, err := l.read(ctx, true)
	if err != nil {
		return false
	}
	l.observe(rec, present)
	t := l.current()
	released := present && rec.Owner == l.opts.Owner && rec.forceReleased() &&
		(rec.Session == s.sid || t != nil && t.live == liveness(s) && t.fence == rec.Control.ReleasedFence)
	if released {
		p.decline(l.job)
	}
	if t != nil && t.live == liveness(s) && t.holds() {
		if present && rec.Owner == l.opts.Owner && rec.Fence == t.fence {
			t.noticeControl()
			return true
		}
		t.end(&movedOnError{err: movedOn(l.job, t.fence, rec)}, LossDeposed)
	}
	if present && rec.Owner == l.opts.Owner && rec.Session == s.sid {
		return p.freeUnheld(ctx, l, s)
	}
	return true
}

// freeUnheld frees the lease item if it is bound to session s and no
// tenure of this handle holds it. It decides under the write lock, which
// an acquisition holds from its write until its tenure begins, so that an
// item this handle has just taken is never freed; when the lock is busy
// it reports false, and the note's next renewal tries again (the pool's
// renewal never waits for a job's write).
func (p *Pool) freeUnheld(ctx context.Context, l *Lease, s *session) bool {
	if !l.writes.tryLock(&l.notify) {
		return false
	}
	defer l.writes.unlock(&l.notify)
	rec, present, err := l.read(ctx, true)
	if err != nil {
		return false
	}
	l.observe(rec, present)
	if !present || rec.Owner != l.opts.Owner || rec.Session != s.sid {
		return true
	}
	if t := l.current(); t != nil && t.live == liveness(s) && t.holds() && t.fence == rec.Fence {
		return true // a tenure of this handle holds it
	}
	return p.free(ctx, l, rec)
}

// free frees a lease item bound to this replica's session that no tenure
// of it holds (an operator released it by force), on condition that it
// is unchanged, so that a standby of the pool takes it at its next poll.
// It reports whether the item is settled: freed, or changed since rec
// was read (the condition failed).
func (p *Pool) free(ctx context.Context, l *Lease, rec Record) bool {
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	defer cancel()
	u := newLeaseUpdate()
	u.released(l.opts.Now(), randomID(8))
	u.unbound()
	u.names["#owner"], u.names["#fence"] = attrOwner, attrFence
	u.values[":me"], u.values[":sid"], u.values[":f"] = avS(l.opts.Owner), avS(rec.Session), avN(rec.Fence)
	_, err := l.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(l.table), Key: l.opts.Layout.leaseKey(l.job),
		UpdateExpression:          aws.String(u.expression()),
		ConditionExpression:       aws.String("#owner = :me AND #ses = :sid AND #fence = :f"),
		ExpressionAttributeNames:  u.names,
		ExpressionAttributeValues: u.values,
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		l.log().Warn("ddblease: could not free a lease released by force; trying again at the pool session's next renewal",
			"fence", rec.Fence, "err", err)
		return false
	}
	return true
}

// isOver reports whether the session ended.
func (s *session) isOver() bool { return s.lt.isOver() }

// A note names the job whose lease item an operator changed, behind an id
// of its own (noteIDLen hex characters and a colon): a second change of the
// job noted while the holder handles the first is a second element of the
// set, which the holder's deletion of the first leaves in place. Were the
// note the job's name alone, the two would be one element, deleted unread
// with the first.
const noteIDLen = 16

// newNote returns a new note on job.
func newNote(job string) string { return randomID(noteIDLen/2) + ":" + job }

// noteJob returns the job a note names.
func noteJob(note string) string {
	if len(note) > noteIDLen && note[noteIDLen] == ':' {
		return note[noteIDLen+1:]
	}
	return note
}

// member is a pool's member item.
type member struct {
	owner    string
	exp      int64 // Unix ms; -1 if the item is malformed
	renewed  int64 // Unix ms: when its last renewal was sent, by its clock; 0 if not recorded
	view     string
	jobs     string
	declined []string // sorted
	sid, sv  string   // its session and the session's version
	ended    string   // who ended the session; "" while it is not ended
	leaving  bool
}

// decodeMember reads a member item. A malformed one is returned with
// expiry -1 (it is ignored, then removed) and an error, with its owner
// when its key names one.
func decodeMember(y Layout, item map[string]types.AttributeValue) (member, error) {
	m := member{exp: -1}
	sk, err := str(item, y.SortKey)
	if err == nil {
		m.owner = strings.TrimPrefix(sk, skMember)
	}
	m.sid, _ = str(item, memberSession)
	m.sv, _ = str(item, memberVersion)
	exp, eerr := num(item, memberExpiry)
	var rerr error
	if _, ok := item[attrRenewedAt]; ok {
		m.renewed, rerr = num(item, attrRenewedAt)
	}
	view, verr := str(item, memberView)
	jobs, jerr := str(item, memberJobs)
	list, lerr := str(item, memberDeclined)
	_, serr := str(item, memberSession)
	_, vserr := str(item, memberVersion)
	var nerr, lverr error
	if _, ok := item[memberEnded]; ok {
		if m.ended, nerr = str(item, memberEnded); m.ended == noSession {
			m.ended = "" // not ended
		}
	}
	if v, ok := item[memberLeaving]; ok {
		b, isBool := v.(*types.AttributeValueMemberBOOL)
		if !isBool {
			lverr = fmt.Errorf("attribute %q is not a BOOL", memberLeaving)
		} else {
			m.leaving = b.Value
		}
	}
	var declined []string
	if lerr == nil {
		if derr := json.Unmarshal([]byte(list), &declined); derr != nil {
			lerr = fmt.Errorf("attribute %q is not a JSON array of names: %v", memberDeclined, derr)
		}
	}
	if err = errors.Join(err, eerr, rerr, verr, jerr, lerr, serr, vserr, nerr, lverr); err != nil || exp < 0 {
		return m, fmt.Errorf("%w: member item %q: %v", ErrMalformedItem, y.describe(item), errors.Join(err, fmt.Errorf("expiry %d", exp)))
	}
	if len(declined) == 0 {
		declined = nil // "[]": none
	}
	slices.Sort(declined)
	m.exp, m.view, m.jobs, m.declined = exp, view, jobs, declined
	return m, nil
}
