/*
 * Sessions: many leases renewed by one heartbeat (docs/sessions.md).
 *
 * A model of the protocol for spin. Two replicas run one job. Each
 * replica keeps a session, its member item: a session id (sid, new for
 * each session of the replica), a version (sv, new at each renewal), an
 * expiry by the replica's wall clock, and an "ended" mark. The job's item
 * names the session it is bound to (owner and sid) and its fence. A
 * replica leads the job while it is bound to its session and its local
 * deadline, a lease less the margin after the send of the session's last
 * confirmed renewal, has not passed.
 *
 * A replica's read of the other's member item (a standby's watch) is
 * eventually consistent: it may return the item as it was before its
 * last renewal. Other reads, and the conditional writes, see the item as
 * it is. Beside it, each replica keeps the view of the members its last
 * member read returned (strongly consistent, but as old as that read:
 * a replica acts on it until it reads again, a pause included), and
 * judges by it whether a session has left its member item.
 *
 * Time is a global tick (now); each replica's wall clock is now + off[r],
 * the offsets within SKEW of each other. A replica begins at most one
 * action a tick (or none: a paused process); every request is sent,
 * applied and answered in separate steps, so any other step, and any
 * number of ticks, may fall between them (a slow network).
 *
 * The rules, as docs/sessions.md states them:
 *   R1 a renewal applies only if the member item still holds its sid and
 *      is not ended;
 *   R2 the local deadline counts from the renewal's send, and a renewal
 *      confirmed after the deadline does not revive the session;
 *   R3 a session is taken as lapsed when its version was read unchanged
 *      for a lease (by the reader's clock: the longer of the reader's
 *      lease and the one the member item records, which is its own), or
 *      its expiry is more than SKEW older than the reader's wall clock
 *      (with -DLL=4 the two replicas' leases differ: LL and L);
 *   R4 a lapsed session is ended by a write conditional on the sid and
 *      the version read, before any of its jobs is taken;
 *   R5 a job is taken by a write conditional on the session and fence
 *      read, which binds it to the taker's session and adds one to the
 *      fence;
 *   R6 a sink accepts an effect only if its fence is not below the
 *      highest it accepted (the guard);
 *   R7 a session that its member item no longer shows (the item deleted,
 *      or holding another session; here: not yet holding it) has left
 *      only if a member read sent after the replica found a job bound to
 *      it does not show it, and its jobs are taken a lease after that
 *      read (the longer of the reader's and the one the job's item
 *      records, its holder's).
 *
 * The properties (each assert names one):
 *   P1 two replicas never lead the job at once;
 *   P2 an ended session is never renewed;
 *   P3 each change of holder raises the fence;
 *   P4 a sink never accepts an effect whose fence is below one it
 *      accepted before.
 *
 * Each mutant (-D name) breaks one rule; spin must find the property it
 * guards violated (.ci/spin runs them):
 *   NO_END          R4 dropped: a lapsed session's job is taken without
 *                   ending the session (P1)
 *   END_ANY_VERSION R4 weakened: the end is not conditional on the version
 *                   read (P1)
 *   RENEW_ENDED     R1 weakened: a renewal ignores the "ended" mark (P2)
 *   DEADLINE_AT_ANSWER R2 broken: the deadline counts from the answer (P1)
 *   NO_SKEW         R3 broken: an expiry is taken as lapsed without the
 *                   SKEW margin (P1)
 *   NO_FENCE_STEP   R5 broken: taking a job keeps its fence (P3)
 *   GUARD_ANY       R6 dropped: the sink accepts every effect (P4)
 *   GONE_STALE      R7 broken: a session missing from the view counts
 *                   as left a lease after the replica first asked, by
 *                   whatever member read the view holds (P1)
 *   READER_LEASE    R3 broken: the version is watched for the reader's
 *                   own lease only, shorter than the member's (-DLL=4):
 *                   its jobs go before its session's deadline (P1)
 */

#define N     2   /* replicas */
#define L     3   /* lease duration of replica 1, ticks */
#ifndef LL
#define LL    L   /* lease duration of replica 0 (spin -DLL=4: longer, as
                     after a deploy that lengthens it). A replica's local
                     deadline after a renewal's send is its lease less the
                     margin, which covers clock rates; the model's clocks
                     run at one rate, and it takes the margin as zero, the
                     worst case */
#endif
#define LEASE(r) ((r) == 0 -> LL : L)
#define MAX(a, b) ((a) > (b) -> (a) : (b))
#define SKEW  2   /* the bound on the wall clocks' offsets */
#ifndef TMAX
#define TMAX  4   /* the last tick (spin -DTMAX=n for a longer horizon) */
#endif
#define NONE  255
#define SIDS  1   /* sessions each replica may start */
#define SID1  1   /* so each replica's one session has id 1, and a job
                     found bound to o's session is bound to o's sid 1 */

byte now;

/* the member items */
byte m_sid[N];
byte m_sv[N];
byte m_exp[N];
bool m_ended[N];
byte m_psv[N];  /* the version and expiry before the last renewal: what an */
byte m_pexp[N]; /* eventually consistent read may still return */
/* the lease a member item records (its expiry less its renewal's send)
   is its replica's, LEASE(r): the readers use it as it is */

/* the job's item */
byte j_owner = NONE;
byte j_sid;
byte j_fence;

/* the sink */
byte hwm;      /* the guard's high-water mark */
byte accepted; /* the highest fence accepted, as the property sees it */

/* what each replica believes */
bool holds[N];
byte deadline[N];
byte fence[N];
byte off[N];
byte maxfence;
bool fresh[N] = true;  /* a replica may begin an action this tick */

#define leads(r) (holds[r] && now < deadline[r])

init {
	/* the wall clocks: within SKEW of each other */
	if
	:: off[0] = 0; off[1] = 0
	:: off[0] = 0; off[1] = SKEW
	:: off[0] = SKEW; off[1] = 0
	fi;
	atomic { run clock(); run replica(0); run replica(1) }
}

proctype clock() {
end:	do
	:: now < TMAX -> atomic { now++; fresh[0] = true; fresh[1] = true }
	od
}

/* P1, checked in every reachable state */
active proctype monitor() {
end:	atomic { leads(0) && leads(1) -> assert(!(leads(0) && leads(1))) }
}

proctype replica(byte r) {
	byte o = 1 - r;       /* the other replica */
	byte sid, started;
	byte ts;              /* a request's send */
	bool ok, free;
	byte ro, rs, rf;      /* the job's item as read */
	byte rsv, rexp;       /* o's member item, as read */
	byte wsv;             /* o's session version, as watched ... */
	byte wsince = NONE;   /* ... since this tick (NONE: not watching) */
	bool handed, sent;    /* one hand-over and one effect each: enough for
	                         the properties, and fewer states */
	byte vsid;            /* o's session, as the last member read showed it */
	byte ask = NONE;      /* whether (GONE_STALE: when) a job was found
	                         bound to o's session, which the view lacked
	                         (R7) ... */
	byte miss = NONE;     /* ... and when a member read sent after that
	                         lacked it too */
	bool gone;

end:	do
	:: fresh[r] -> fresh[r] = false;
	if
	/* start a session: its member item written, a new sid */
	:: sid == 0 && started < SIDS ->
		atomic {
			started++;
			sid = started;
			m_sid[r] = sid; m_sv[r] = 1; m_ended[r] = false;
			m_exp[r] = now + off[r] + LEASE(r);
			deadline[r] = now + LEASE(r)
		}

	/* renew the session: sent, applied, answered */
	:: sid != 0 ->
		ts = now;
		atomic {
#ifdef RENEW_ENDED
			ok = (m_sid[r] == sid);
#else
			ok = (m_sid[r] == sid && !m_ended[r]);
#endif
			if
			:: ok ->
				assert(!m_ended[r]); /* P2 */
				m_psv[r] = m_sv[r]; m_pexp[r] = m_exp[r];
				m_sv[r]++;
				m_exp[r] = ts + off[r] + LEASE(r)
			:: else -> skip
			fi
		};
		atomic {
			if
#ifdef DEADLINE_AT_ANSWER
			:: ok && now < deadline[r] -> deadline[r] = now + LEASE(r)
#else
			:: ok && now < deadline[r] -> deadline[r] = ts + LEASE(r)
#endif
			:: else -> holds[r] = false; sid = 0 /* lost, or confirmed too late */
			fi
		};
		/* then read the members, the view the replica acts on until its
		   next renewal (R7); the read may fail, and leave the view as
		   it was */
		atomic {
			if
			:: sid != 0 ->
				vsid = m_sid[o];
				if
				:: ask != NONE && vsid == SID1 -> ask = NONE; miss = NONE
				:: ask != NONE && vsid != SID1 && miss == NONE -> miss = now /* sent after the ask: a later action */
				:: else -> skip
				fi
			:: true -> skip
			fi
		}

	/* take the job: read it; if its session is missing from the view,
	   wait for R7; if that session may be live, watch its member item
	   and, once it has lapsed, end it; then take the job with a
	   conditional write */
	:: sid != 0 && !holds[r] && now < deadline[r] ->
		atomic {
			ro = j_owner; rs = j_sid; rf = j_fence;
			free = (ro == NONE || ro == r || m_ended[ro]);
			gone = (!free && vsid != rs)
		};
		if
		:: gone ->
			if
			:: ask == NONE ->
#ifdef GONE_STALE
				ask = now
#else
				ask = 0 /* asked: R7 needs no more, as every later read of
				           this replica is a later action, sent after */
#endif
			:: else -> skip
			fi;
			/* the lease the job's item records is its holder's */
#ifdef GONE_STALE
			free = (now - ask >= MAX(LEASE(r), LEASE(ro)))
#else
			free = (miss != NONE && now - miss >= MAX(LEASE(r), LEASE(ro)))
#endif
		:: !free && !gone ->
			/* a standby's read is eventually consistent: it may return
			   the member item as it was before its last renewal */
			atomic {
				if
				:: rsv = m_sv[o]; rexp = m_exp[o]
				:: m_psv[o] != 0 -> rsv = m_psv[o]; rexp = m_pexp[o]
				fi;
				if
				:: wsince == NONE || wsv != rsv -> wsv = rsv; wsince = now
				:: else -> skip
				fi;
#if defined(NO_SKEW)
				free = (now - wsince >= MAX(LEASE(r), LEASE(o)) || rexp < now + off[r])
#elif defined(READER_LEASE)
				free = (now - wsince >= LEASE(r) || rexp + SKEW < now + off[r])
#else
				free = (now - wsince >= MAX(LEASE(r), LEASE(o)) || rexp + SKEW < now + off[r])
#endif
			};
			if
			:: free ->
				wsince = NONE;
#ifndef NO_END
				atomic {
#ifdef END_ANY_VERSION
					free = (m_sid[o] == rs);
#else
					free = (m_sid[o] == rs && m_sv[o] == wsv);
#endif
					if
					:: free -> m_ended[o] = true
					:: else -> skip
					fi
				}
#endif
			:: else -> skip
			fi
		:: else -> skip
		fi;
		if
		:: free ->
			atomic {
				ok = (j_owner == ro && j_sid == rs && j_fence == rf);
				if
				:: ok ->
					j_owner = r; j_sid = sid;
#ifndef NO_FENCE_STEP
					j_fence++;
#endif
					assert(j_fence > maxfence); /* P3 */
					maxfence = j_fence
				:: else -> skip
				fi
			};
			atomic {
				if
				:: ok && now < deadline[r] -> holds[r] = true; fence[r] = rf + 1
				:: else -> skip
				fi
			}
		:: else -> skip
		fi

	/* hand the job over: the tenure ends, then the job is freed */
	:: leads(r) && !handed ->
		handed = true;
		holds[r] = false;
		atomic {
			if
			:: j_owner == r && j_sid == sid && j_fence == fence[r] -> j_owner = NONE
			:: else -> skip
			fi
		}

	/* a side effect, sent by a leader, arriving at any later time */
	:: leads(r) && !sent ->
		sent = true;
		ts = fence[r];
		atomic {
			if
#ifdef GUARD_ANY
			:: true ->
#else
			:: ts >= hwm ->
#endif
				assert(ts >= accepted); /* P4 */
				hwm = ts; accepted = ts
			:: else -> skip
			fi
		}
	:: else -> skip
	fi;
	ts = 0; ok = false; free = false; gone = false; ro = 0; rs = 0; rf = 0; rsv = 0; rexp = 0 /* forgotten: fewer states */
	od
}
