/*
 * pgfence.pml: a Promela model of pgfence's protocol for one lock name and
 * one protected row, checked exhaustively by spin (model/run).
 *
 * What it models (model/README.md has the mapping to the SQL and Go code):
 *   - the database clock (now), which only advances;
 *   - the token sequence (seq, pgfence_next_token): a grant draws seq + 1;
 *     nextval's WAL record covers LOGAHEAD values ahead, and the sequence
 *     resumes after the value its last record on the standby (or disk)
 *     covers; a draw waits for the flush only when WAL is not flushed yet;
 *   - the lease row (pgfence_acquire, pgfence_renew, pgfence_release):
 *     owner (the secret's holder), fence, expires_at, judged on the
 *     database clock; or, with -DADVISORY, a session advisory lock, held
 *     by a session on the primary, lost when the session ends;
 *   - the protected row's fence_token and the guard (pgfence_guard_strict:
 *     a token must be presented, not below the row's, and issued);
 *   - a primary and a standby: a commit changes the primary at once; it
 *     is acknowledged once the standby has it (synchronous) or at once
 *     (-DASYNC); a failover (-DFAILOVER) promotes the standby, and the
 *     commits it lacks are gone; or (-DCRASH) one server whose WAL flush
 *     plays the standby, a power loss and restart the failover, with
 *     synchronous_commit on, or off (-DCRASH -DASYNC) for the commits that
 *     draw no token (-DDURABLE_WRITES: but on for the guarded writes);
 *   - N clients that acquire, renew, release, write, pause (any
 *     interleaving) and give up; a rogue role that can read the lease
 *     table but has no secret and no token;
 *   - with -DHANDOVER, a permit's hand-over (migration 000009): a client
 *     that finds the lease held registers a claim (pgfence_claim_permit),
 *     whose token is drawn, and made durable, by the claim's commit; a
 *     release grants the lease to the claim in its own update, with that
 *     token and the old lease's expiry, and commits without waiting for a
 *     flush or a standby (pgfence_hand_permit). Claims are unlogged: a
 *     crash or failover clears them.
 *
 * Properties (ghost state, asserted where the state changes):
 *   P1 guard sound: a write lands only if it presents a token, the token
 *      is not below the row's fence_token, and it was issued;
 *   P2 tokens grow: a drawn token is above every token acknowledged before
 *      it, and no token is acknowledged in two grants;
 *   P3 register monotonic: once a write with token t was acknowledged, no
 *      write with a token below t lands;
 *   P4 lease exclusive: no two clients believe they hold the lease at the
 *      same database time (a belief: an acknowledged grant or renewal, up
 *      to the expires_at it returned, until the client releases, gives up
 *      or learns it lost);
 *   P5 (-DGUARD_LT only) once-only: no token lands twice.
 * PROPS (a bit mask, 1 = P1 ... 16 = P5) selects which are asserted.
 *
 * Controls, each removing one check of the protocol: -DNOGUARD (the
 * row's token is not compared), -DNOSTRICT (a write without a token is
 * not rejected, as the default trigger mode lets an UPDATE that leaves
 * the column alone through), -DNOISSUED (a token above the sequence is
 * accepted), -DNOSECRET (release needs only the token, not the secret),
 * -DCANCEL_WAIT (a commit's cancelled wait for the synchronous standby is
 * acknowledged, as PostgreSQL does), -DNOFLUSHCHECK (a draw never waits
 * for the flush), -DHANDOVER_FULL_TTL (a hand-over grants a full TTL
 * instead of the old lease's expiry), -DHANDOVER_UNDURABLE (a claim's
 * commit does not wait for its token's flush);
 * and PROPS=16 without -DGUARD_LT (the default <= guard, P5 asserted).
 */

#ifndef N
#define N 2
#endif
#ifndef TTL
#define TTL 2
#endif
#ifndef MAXT
#define MAXT 4
#endif
#ifndef MAXTOK
#define MAXTOK 4
#endif
#ifndef PROPS
#define PROPS 15
#endif
#ifndef LOGAHEAD
#define LOGAHEAD 1 /* nextval's WAL record covers this many values ahead (PostgreSQL: 32) */
#endif

#define FOREVER 255 /* an advisory holder's belief has no expiry */

/* In-flight commit of a client: none, on the primary waiting for the
 * standby, acknowledged, failed (the primary died before the standby had
 * it: the client sees an error). */
#define F_NONE 0
#define F_WAIT 1
#define F_ACK 2
#define F_FAIL 3

/* What the in-flight commit is. */
#define K_GRANT 1
#define K_RENEW 2
#define K_WRITE 3
#define K_CLAIM 4

typedef DB {
	byte seq;   /* pgfence_leases_fence_seq: the last value drawn, 0 none (in memory) */
	byte logged; /* the value its last WAL record covers: where it resumes after a failover or crash */
	byte owner; /* lease row: holder (client + 1; stands for its secret), 0 none */
	byte fence; /* lease row: fence */
	byte exp;   /* lease row: expires_at on the database clock */
	byte rtok;  /* protected row: fence_token */
	byte adv;   /* advisory lock: holding session (client + 1), 0 none; never replicated */
	byte lb     /* ghost (P5): tokens of the writes that landed in this history */
}

DB P; /* primary */
DB S; /* standby */
byte now;    /* database clock */
bool failed; /* the failover happened: S was promoted, no standby left (-DCRASH: the server restarted) */

byte tok[N];  /* token of the lease handle the client has, 0 none */
byte bexp[N]; /* the client believes it holds while now < bexp[c] */
byte fl[N];   /* in-flight commit state (F_*) */
byte fk[N];   /* its kind (K_*) */
byte ft[N];   /* its token */
byte fv[N];   /* the expires_at it returned (grant, renewal) */
bool lost[N]; /* advisory: the client's session ended; it has not noticed */
byte claim;   /* -DHANDOVER: the registered claim's client + 1, 0 none (unlogged: primary only) */
byte res;     /* its reserved token */

/* Ghost state for the properties. */
byte max_acked;  /* largest token acknowledged in a grant */
byte acked_bits; /* tokens acknowledged in grants */
byte wfloor;     /* largest token of an acknowledged write */

hidden byte P1_guard_sound;
hidden byte P2_tokens_grow;
hidden byte P3_register_monotonic;
hidden byte P4_lease_exclusive;
hidden byte P5_token_lands_once;

#define BIT(t) (1 << (t))

/* The server acknowledges client c's in-flight commit. */
inline acknowledge(c) {
	fl[c] = F_ACK;
	if
	:: fk[c] == K_GRANT ->
#if (PROPS & 2)
		P2_tokens_grow = ((acked_bits & BIT(ft[c])) == 0);
		assert(P2_tokens_grow);
#endif
		acked_bits = acked_bits | BIT(ft[c]);
		if :: ft[c] > max_acked -> max_acked = ft[c] :: else -> skip fi
	:: fk[c] == K_WRITE ->
		if :: ft[c] > wfloor -> wfloor = ft[c] :: else -> skip fi
	:: fk[c] == K_CLAIM -> /* a claim is seen by releases once its commit is done */
		claim = c + 1; res = ft[c]
	:: else -> skip
	fi
}

/* Client c has taken in the outcome of its in-flight commit. */
inline settle(c) {
	fl[c] = F_NONE; fk[c] = 0; ft[c] = 0; fv[c] = 0
}

/* Client c has committed on the primary. With a standby, the commit waits
 * for it (synchronous) or not (-DASYNC). With -DCRASH there is no standby
 * and S is what the server has flushed to disk: the commit waits for the
 * flush if flush is true. */
inline committed(c, kind, t, v, flush) {
	fk[c] = kind; ft[c] = t; fv[c] = v;
#if defined(CRASH)
	if
	:: flush -> fl[c] = F_WAIT
	:: else -> acknowledge(c)
	fi
#elif defined(ASYNC)
	acknowledge(c)
#else
	if
	:: failed -> acknowledge(c) /* no standby left to wait for */
	:: else -> fl[c] = F_WAIT
	fi
#endif
}

/* synchronous_commit of the server, for ordinary commits (releases,
 * writes): on, or off with -DCRASH -DASYNC. Token draws force
 * it on. */
#if defined(CRASH) && defined(ASYNC)
#define SYNC_COMMIT false
#else
#define SYNC_COMMIT true
#endif
/* pgfence_renew forces synchronous_commit on, as token draws do;
 * -DRENEW_ORDINARY (a control) makes it an ordinary commit. */
#ifdef RENEW_ORDINARY
#define RENEW_SYNC_COMMIT SYNC_COMMIT
#else
#define RENEW_SYNC_COMMIT true
#endif
/* -DDURABLE_WRITES: the application commits its guarded writes with
 * synchronous_commit on whatever the server's setting. */
#ifdef DURABLE_WRITES
#define WRITE_SYNC_COMMIT true
#else
#define WRITE_SYNC_COMMIT SYNC_COMMIT
#endif

/* nextval: one WAL record per LOGAHEAD + 1 values; the values it covers
 * are handed out without one. */
inline draw() {
	P.seq++;
	if :: P.seq > P.logged -> P.logged = P.seq + LOGAHEAD :: else -> skip fi
}

/* P2's first half, for the token just drawn. */
inline drawn() {
#if (PROPS & 2)
	P2_tokens_grow = (P.seq > max_acked);
	assert(P2_tokens_grow);
#endif
	skip
}

/* The primary has WAL its standby (-DCRASH: its disk) has not. */
#define DIFFERS (S.logged != P.logged || S.owner != P.owner || S.fence != P.fence || \
                 S.exp != P.exp || S.rtok != P.rtok || S.lb != P.lb)

inline ack_waiting(c) {
	if :: fl[c] == F_WAIT -> acknowledge(c) :: else -> skip fi
}
inline fail_waiting(c) {
	if :: fl[c] == F_WAIT -> fl[c] = F_FAIL :: else -> skip fi
}

/* P4, checked where a belief starts or extends: it is exact, since a
 * belief only shrinks as the clock advances. */
inline check_exclusive(c) {
#if (PROPS & 8)
	P4_lease_exclusive = !(bexp[c] > now &&
		((c != 0 && bexp[0] > now) || (c != 1 && bexp[1] > now)
#if N > 2
		 || (c != 2 && bexp[2] > now)
#endif
		));
	assert(P4_lease_exclusive);
#endif
	skip
}

/* The guard on the protected row (pgfence_guard_strict, column fence_token)
 * for a write presenting token t (0: none). Sets ok. */
#ifdef GUARD_LT
#define NOT_BELOW(t) ((t) > P.rtok)          /* fence.UpdateStmt.Strict: fence_token < token */
#else
#define NOT_BELOW(t) ((t) >= P.rtok)         /* default: fence_token <= token */
#endif
inline guard(t, ok) {
	ok = true;
#ifndef NOSTRICT
	if :: t == 0 -> ok = false :: else -> skip fi              /* PF004: no token */
#endif
#ifndef NOGUARD
	if :: t != 0 && !NOT_BELOW(t) -> ok = false :: else -> skip fi /* PF001: stale */
#endif
#ifndef NOISSUED
	if :: t > P.rtok && t > P.seq -> ok = false :: else -> skip fi /* PF001: never issued */
#endif
}

/* A write presenting t that passed the guard lands: check P1 (and P3, P5
 * for a holder's write) against the state before it. */
inline lands(t, holder) {
#if (PROPS & 1)
	P1_guard_sound = (t != 0 && t >= P.rtok && (t <= P.rtok || t <= P.seq));
	assert(P1_guard_sound);
#endif
#if (PROPS & 4)
	if
	:: holder -> P3_register_monotonic = (t >= wfloor); assert(P3_register_monotonic)
	:: else -> skip
	fi;
#endif
#if (PROPS & 16)
	if
	:: t != 0 -> P5_token_lands_once = ((P.lb & BIT(t)) == 0); assert(P5_token_lands_once);
		P.lb = P.lb | BIT(t)
	:: else -> skip
	fi;
#endif
	if :: t != 0 -> P.rtok = t :: else -> skip fi
}

/* The client stops using its lease (released, gave up, learned it lost). */
inline drop(c) {
	tok[c] = 0; bexp[c] = 0; lost[c] = false
}

hidden byte ok; /* the guard's verdict, used within one atomic step */

#ifdef HANDOVER_UNDURABLE
#define CLAIM_FLUSH false
#else
#define CLAIM_FLUSH FLUSH_CHECK
#endif

/* A grant handed to client c by a release: its commit waits for neither
 * the flush nor a standby (synchronous_commit off), so the claimant is
 * told at once (the notification). */
inline handed(c, t, v) {
	fk[c] = K_GRANT; ft[c] = t; fv[c] = v;
	acknowledge(c)
}

#ifdef NOFLUSHCHECK
#define FLUSH_CHECK false
#else
#define FLUSH_CHECK (DIFFERS)
#endif

active [N] proctype Client() {
idle:
	do
#ifndef ADVISORY
	:: atomic { /* pgfence_acquire: the row is free or expired */
		P.exp <= now && P.seq < MAXTOK ->
		draw();
		P.owner = _pid + 1; P.fence = P.seq; P.exp = now + TTL;
		printf("t=%d c%d: granted the lease, token %d, expires_at %d\n", now, _pid, P.seq, P.exp);
		drawn();
		committed(_pid, K_GRANT, P.seq, P.exp, true) /* writes a row: waits for the flush */
	   }
#else
	:: atomic { /* pg_try_advisory_lock + pgfence_next_token in one statement */
		P.adv == 0 && P.seq < MAXTOK ->
		draw();
		P.adv = _pid + 1;
		printf("t=%d c%d: granted the advisory lock, token %d\n", now, _pid, P.seq);
		drawn();
		/* pgfence_next_token: the commit waits for the flush only when
		 * WAL is not flushed yet (flush_lsn < insert_lsn), read after the draw */
		committed(_pid, K_GRANT, P.seq, FOREVER, FLUSH_CHECK)
	   }
#endif
		if
		:: atomic { fl[_pid] == F_ACK -> tok[_pid] = ft[_pid]; bexp[_pid] = fv[_pid]; settle(_pid);
			printf("t=%d c%d: holds token %d (grant acknowledged)\n", now, _pid, tok[_pid]);
#ifdef ADVISORY
			lost[_pid] = (P.adv != _pid + 1); /* the session ended meanwhile */
#endif
			check_exclusive(_pid) }
			goto holding
		:: atomic { fl[_pid] == F_FAIL -> settle(_pid) } /* an error: not acquired */
		fi
#ifdef HANDOVER
	:: atomic { /* pgfence_claim_permit: the lease is held by another; the
	             * claim's token is drawn, and its commit waits for the flush
	             * when the WAL covering it is not flushed yet */
		claim == 0 && P.owner != 0 && P.owner != _pid + 1 && P.exp > now && P.seq < MAXTOK ->
		draw();
		printf("t=%d c%d: claims, token %d reserved\n", now, _pid, P.seq);
		drawn();
		committed(_pid, K_CLAIM, P.seq, 0, CLAIM_FLUSH)
	   }
		if
		:: atomic { fl[_pid] == F_ACK -> settle(_pid) } /* registered (a crash may have cleared it since) */
		:: atomic { fl[_pid] == F_FAIL -> settle(_pid) } /* an error: no claim */
		fi;
		if
		:: atomic { fl[_pid] == F_ACK -> tok[_pid] = ft[_pid]; bexp[_pid] = fv[_pid]; settle(_pid);
			printf("t=%d c%d: holds token %d until %d (handed over)\n", now, _pid, tok[_pid], bexp[_pid]);
			check_exclusive(_pid) }
			goto holding
		:: atomic { claim == _pid + 1 -> claim = 0; res = 0 } /* leaves the line: pgfence_unclaim_permit */
		:: atomic { claim != _pid + 1 && fl[_pid] == F_NONE -> skip } /* no claim (an error, a crash) */
		fi
#endif
	od;
holding:
	do
	:: atomic { /* a guarded write presenting the token: at any time, even
	             * past the belief (the client may have paused since it checked) */
		tok[_pid] != 0 ->
		guard(tok[_pid], ok);
		if
		:: ok -> printf("t=%d c%d: write with token %d lands (row's was %d)\n", now, _pid, tok[_pid], P.rtok);
			lands(tok[_pid], true); committed(_pid, K_WRITE, tok[_pid], 0, WRITE_SYNC_COMMIT)
		:: else -> printf("t=%d c%d: write with token %d fenced (row's is %d)\n", now, _pid, tok[_pid], P.rtok);
			drop(_pid); goto idle /* ErrFenced: the lock is lost */
		fi
	   }
		if
		:: atomic { fl[_pid] == F_ACK -> settle(_pid) }
		:: atomic { fl[_pid] == F_FAIL -> settle(_pid) } /* outcome unknown; still holding */
		fi
#ifndef ADVISORY
	:: atomic { /* pgfence_renew: the token, the secret, not expired */
		tok[_pid] != 0 ->
		if
		:: P.fence == tok[_pid] && P.owner == _pid + 1 && P.exp > now ->
			if :: now + TTL > P.exp -> P.exp = now + TTL :: else -> skip fi;
			printf("t=%d c%d: renewed token %d until %d\n", now, _pid, tok[_pid], P.exp);
			committed(_pid, K_RENEW, tok[_pid], P.exp, RENEW_SYNC_COMMIT)
		:: else -> printf("t=%d c%d: renewal of token %d refused\n", now, _pid, tok[_pid]);
			drop(_pid); goto idle /* not renewed: the lease is lost */
		fi
	   }
		if
		:: atomic { fl[_pid] == F_ACK ->
			printf("t=%d c%d: believes it holds until %d (renewal acknowledged)\n", now, _pid, fv[_pid]);
			if :: fv[_pid] > bexp[_pid] -> bexp[_pid] = fv[_pid]; check_exclusive(_pid) :: else -> skip fi;
			settle(_pid) }
		:: atomic { fl[_pid] == F_FAIL -> settle(_pid) } /* an error: the belief stays as it was */
		fi
	:: atomic { /* Release: the client stops first; pgfence_release needs
	             * the token and the secret, and a lease not yet expired */
		tok[_pid] != 0 ->
		if
		:: P.fence == tok[_pid] && P.owner == _pid + 1 && P.exp > now ->
#ifdef HANDOVER
			if
			:: claim != 0 && res > P.fence && fl[claim - 1] == F_NONE ->
				/* pgfence_hand_permit: the claim's token, the old expiry */
				P.owner = claim; P.fence = res;
#ifdef HANDOVER_FULL_TTL
				P.exp = now + TTL;
#endif
				printf("t=%d c%d: released token %d, handed to c%d with token %d until %d\n",
					now, _pid, tok[_pid], claim - 1, res, P.exp);
				handed(claim - 1, res, P.exp);
				claim = 0; res = 0
			:: else -> P.exp = now;
				printf("t=%d c%d: released token %d\n", now, _pid, tok[_pid])
			fi
#else
			P.exp = now;
			printf("t=%d c%d: released token %d\n", now, _pid, tok[_pid])
#endif
		:: else -> skip
		fi;
		drop(_pid); goto idle
	   }
	:: atomic { drop(_pid); goto idle } /* gives up locally (its deadline, or it stops) */
#else
	:: atomic { /* the watchdog finds the session gone */
		lost[_pid] -> drop(_pid); goto idle
	   }
	:: atomic { /* Release: pg_advisory_unlock on the holder's session */
		tok[_pid] != 0 ->
		if :: P.adv == _pid + 1 -> P.adv = 0 :: else -> skip fi;
		drop(_pid); goto idle
	   }
#endif
	od
}

#ifdef NOSECRET
#define SECRET_CHECKED false
#else
#define SECRET_CHECKED true
#endif

/* A role that reads the lease table and writes the protected table, but
 * has no secret and was granted no token. */
active proctype Rogue() {
end:
	do
	:: atomic { guard(0, ok);
		if
		:: ok -> printf("t=%d rogue: write without a token lands\n", now); lands(0, false)
		:: else -> skip
		fi }
	:: atomic { P.seq < MAXTOK -> guard(P.seq + 1, ok);
		if
		:: ok -> printf("t=%d rogue: write with token %d, never issued, lands\n", now, P.seq + 1); lands(P.seq + 1, false)
		:: else -> skip
		fi }
#ifndef ADVISORY
	:: atomic { /* pgfence_release with the visible token and a wrong secret */
		!SECRET_CHECKED && P.fence != 0 && P.exp > now -> P.exp = now;
		printf("t=%d rogue: released token %d without its secret\n", now, P.fence)
	   }
#endif
	od
}

/* The database clock. */
active proctype Clock() {
end:
	do
	:: atomic { now < MAXT -> now++ }
	od
}

/* Streaming replication: the standby catches up with the primary (a prefix
 * of its commits, since this can run between any two of them), and the
 * commits waiting for it are acknowledged. Advisory locks are not
 * replicated. With -DCRASH: the WAL flush (a commit's, or the WAL
 * writer's), which goes on after a restart. */
#ifdef CRASH
#define REPLICATING true
#define CAUGHT_UP "t=%d disk: WAL flushed (sequence logged to %d, row token %d)\n"
#else
#define REPLICATING (!failed)
#define CAUGHT_UP "t=%d standby: has every commit (sequence logged to %d, row token %d)\n"
#endif
active proctype Replication() {
end:
	do
	:: d_step {
		REPLICATING && (DIFFERS || fl[0] == F_WAIT || fl[1] == F_WAIT
#if N > 2
		            || fl[2] == F_WAIT
#endif
		) ->
		S.logged = P.logged; S.owner = P.owner; S.fence = P.fence; S.exp = P.exp; S.rtok = P.rtok; S.lb = P.lb;
		printf(CAUGHT_UP, now, S.logged, S.rtok);
		ack_waiting(0); ack_waiting(1);
#if N > 2
		ack_waiting(2);
#endif
	   }
	od
}

#if defined(FAILOVER) || defined(CRASH)
/* The primary dies and the standby is promoted; clients reconnect to it.
 * Commits the standby lacks are gone, the sequence resumes after the value
 * its last WAL record covers; sessions end with their advisory locks;
 * commits waiting for the standby fail. With -DCRASH: the server crashes
 * (a power loss: what is not on disk is gone) and restarts from its WAL. */
#ifdef CRASH
#define FAULT "t=%d CRASH: restarted from the flushed WAL (sequence resumes after %d, lease token %d expires_at %d, row token %d; it had drawn %d, row token %d)\n"
#else
#define FAULT "t=%d FAILOVER: standby promoted (sequence resumes after %d, lease token %d expires_at %d, row token %d; the primary had drawn %d, row token %d)\n"
#endif
active proctype Failover() {
	d_step {
		printf(FAULT, now, S.logged, S.fence, S.exp, S.rtok, P.seq, P.rtok);
		P.seq = S.logged; P.logged = S.logged;
		P.owner = S.owner; P.fence = S.fence; P.exp = S.exp; P.rtok = S.rtok; P.lb = S.lb;
		P.adv = 0; failed = true;
		claim = 0; res = 0; /* unlogged: emptied */
		fail_waiting(0); fail_waiting(1);
#if N > 2
		fail_waiting(2);
#endif
#ifdef ADVISORY
		if :: tok[0] != 0 -> lost[0] = true :: else -> skip fi;
		if :: tok[1] != 0 -> lost[1] = true :: else -> skip fi;
#if N > 2
		if :: tok[2] != 0 -> lost[2] = true :: else -> skip fi;
#endif
#endif
	}
}
#endif

#ifdef CANCEL_WAIT
/* A commit's wait for the synchronous standby is cancelled (a cancel
 * request, statement_timeout): PostgreSQL then reports the commit as done,
 * with a WARNING that it "has already committed locally, but might not
 * have been replicated to the standby". */
active proctype CancelWait() {
end:
	do
	:: atomic { fl[0] == F_WAIT -> printf("t=%d c0: wait for the standby cancelled, commit acknowledged\n", now); acknowledge(0) }
	:: atomic { fl[1] == F_WAIT -> printf("t=%d c1: wait for the standby cancelled, commit acknowledged\n", now); acknowledge(1) }
#if N > 2
	:: atomic { fl[2] == F_WAIT -> printf("t=%d c2: wait for the standby cancelled, commit acknowledged\n", now); acknowledge(2) }
#endif
	od
}
#endif

#ifdef ADVISORY
/* A session is terminated (pg_terminate_backend, a network cut): its
 * advisory lock is free at once; its client learns it later. */
active proctype Terminate() {
end:
	do
	:: atomic { P.adv != 0 -> printf("t=%d c%d: session terminated, advisory lock free\n", now, P.adv - 1);
		lost[P.adv - 1] = true; P.adv = 0 }
	od
}
#endif
