package leasetable

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// A semaphore's line (docs/semaphores.md, Fairness; migration 000006): the
// head of a Locker's waiting calls for semaphore S queues, on a session
// connection of the Locker's own, for the exclusive session advisory lock
// on S's line key. PostgreSQL grants it in the order the sessions asked.
// While a session holds or waits for the key, pgfence_acquire_permit
// refuses (queued) every caller that is not in the line; the holder calls
// with in_line true, and leaves the line (unlocks) once it took a permit or
// stopped waiting. The line needs a session connection to the server: it is
// used only while the Locker's LISTEN connection listens, on a connection
// made with the same configuration.

// lineKeySQL is the line key of semaphore $1: no lease, permit or
// semaphore key hashes the same text (names hold no control character).
const lineKeySQL = `pg_catalog.hashtextextended($1 OPERATOR(pg_catalog.||) pg_catalog.chr(31) OPERATOR(pg_catalog.||) pg_catalog.chr(31), 7378831)`

// lineTakeSQL waits for, and takes, the line key of semaphore $1.
const lineTakeSQL = `SELECT pg_catalog.pg_advisory_lock(` + lineKeySQL + `)`

// lineLeaveSQL gives the line key of semaphore $1 back (a head that sent
// no claim; leaveClaimSQL otherwise).
const lineLeaveSQL = `SELECT pg_catalog.pg_advisory_unlock(` + lineKeySQL + `)`

// lineSetupSQL prepares a new line connection: no statement or lock timeout
// cuts its waits in the line (the caller's context bounds them), and, from
// PostgreSQL 14, the server ends the session once it has been idle for $1
// milliseconds, so that a paused or partitioned process does not hold a
// line for longer: lineHold pings it more often. The session holds the
// advisory lock on its random alive key $2 until it ends: a release hands
// a permit to the session's claim only while the key is held (handover.go).
const lineSetupSQL = `SELECT pg_catalog.set_config('statement_timeout', '0', false),
       pg_catalog.set_config('lock_timeout', '0', false),
       CASE WHEN pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog.>=) 140000
            THEN pg_catalog.set_config('idle_session_timeout', $1, false) END,
       pg_catalog.pg_advisory_lock($2::pg_catalog.int8)`

// lineIdleTimeout is the line connections' idle_session_timeout: how long
// a process that stopped answering keeps its place at the head of a line at
// most (PostgreSQL 14 and later; before, until its connection is found
// dead). linePing is how often a line's holder shows it is alive.
const (
	lineIdleTimeout = 5 * time.Second
	linePing        = lineIdleTimeout / 5
)

// lineIdleMax is how many line connections a Locker keeps for reuse, each
// for at most lineIdleKeep (well within lineIdleTimeout).
const (
	lineIdleMax  = 2
	lineIdleKeep = lineIdleTimeout / 2
)

// lineConn is a line connection and the alive key its session holds.
type lineConn struct {
	conn  *pgx.Conn
	alive int64
}

// idleLineConn is a line connection kept for reuse.
type idleLineConn struct {
	lineConn
	since time.Time
}

// lineHold is a waiting call's place at the head of a semaphore's line: the
// line key, held on conn, which a goroutine pings until leave, and the
// call's claim (handover.go).
type lineHold struct {
	k        *Locker
	sem      string
	mu       sync.Mutex // conn's: the pings and the claim calls share it
	lineConn            // the connection and its alive key
	claim    *permitClaim
	claimed  bool // a claim was registered (set by the waiting call's claim calls, read by keep after leave)
	giveBack bool // leave gives back a permit granted to the claim (set by leave)
	stop     chan struct{}
}

// lineOn reports whether waiting calls use the database's line: the LISTEN
// connection listens, so its configuration reaches a session of the server.
func (k *Locker) lineOn() bool {
	if k.hooks != nil && k.hooks.noDBLine {
		return false
	}
	k.mu.Lock()
	n := k.listener
	k.mu.Unlock()
	return n.Listening()
}

// enterLine waits until this Locker is the head of sem's line, holding the
// line key, or ctx ends. A connection whose wait failed is closed, which
// gives the key back if the server granted it.
func (k *Locker) enterLine(ctx context.Context, sem string) (*lineHold, error) {
	lc, err := k.lineConn(ctx)
	if err != nil {
		return nil, err
	}
	if k.hooks != nil && k.hooks.onDBLineWait != nil {
		k.hooks.onDBLineWait(sem)
	}
	if _, err := lc.conn.Exec(ctx, lineTakeSQL, sem); err != nil {
		closeLineConn(lc.conn)
		return nil, fmt.Errorf("pgfence: leasetable: wait in the line of semaphore %q: %w", sem, err)
	}
	h := &lineHold{k: k, sem: sem, lineConn: lc, stop: make(chan struct{})}
	if k.hooks == nil || !k.hooks.noClaim {
		k.claimOn(h, newClaim(sem))
	}
	k.background.Add(1)
	go h.keep()
	return h, nil
}

// lineConn returns a kept line connection, or opens one.
func (k *Locker) lineConn(ctx context.Context) (lineConn, error) {
	var stale []*pgx.Conn // closed outside k.mu
	k.mu.Lock()
	for len(k.lineIdle) > 0 {
		c := k.lineIdle[len(k.lineIdle)-1]
		k.lineIdle = k.lineIdle[:len(k.lineIdle)-1]
		if time.Since(c.since) < lineIdleKeep {
			k.mu.Unlock()
			for _, s := range stale {
				closeLineConn(s)
			}
			return c.lineConn, nil
		}
		stale = append(stale, c.conn)
	}
	k.mu.Unlock()
	for _, s := range stale {
		closeLineConn(s)
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (Go 1.24)
	alive := int64(binary.BigEndian.Uint64(b[:]))
	cctx, cancel := context.WithTimeout(ctx, k.cfg.QueryTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, k.cfg.ListenConnConfig)
	if err != nil {
		return lineConn{}, fmt.Errorf("pgfence: leasetable: open a line connection: %w", err)
	}
	if _, err := conn.Exec(cctx, lineSetupSQL, fmt.Sprint(lineIdleTimeout.Milliseconds()), alive); err != nil {
		closeLineConn(conn)
		return lineConn{}, fmt.Errorf("pgfence: leasetable: set up a line connection: %w", err)
	}
	return lineConn{conn, alive}, nil
}

// keep pings the line connection until leave, then gives the line key back
// and keeps the connection for reuse, or closes it.
func (h *lineHold) keep() {
	k := h.k
	defer k.background.Done()
	t := time.NewTicker(linePing)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if k.hooks != nil && k.hooks.noDBLinePing {
				continue
			}
			ctx, cancel := context.WithTimeout(k.closeCtx, k.cfg.QueryTimeout)
			h.mu.Lock()
			_, err := h.conn.Exec(ctx, "SELECT")
			h.mu.Unlock()
			cancel()
			if err != nil {
				// The key went with the session, or will: the holder's
				// attempts still count as in line, and only its own Locker
				// misses being refused.
				k.cfg.Logger.DebugContext(k.closeCtx, "pgfence: leasetable: line connection lost", "semaphore", h.sem, "error", err)
				h.mu.Lock()
				closeLineConn(h.conn)
				h.mu.Unlock()
				<-h.stop
				k.claimOff(h)
				return
			}
		case <-h.stop:
			// The claim goes (and with giveBack, a permit granted to it
			// but not adopted) before the key does.
			k.claimOff(h)
			ctx, cancel := context.WithTimeout(context.Background(), k.cfg.QueryTimeout)
			var left bool
			h.mu.Lock()
			var err error
			if h.claim != nil && h.claimed {
				err = h.conn.QueryRow(ctx, k.sql.leaveClaim, h.sem, h.claim.secret, h.giveBack).Scan(&left)
			} else {
				err = h.conn.QueryRow(ctx, lineLeaveSQL, h.sem).Scan(&left)
			}
			h.mu.Unlock()
			cancel()
			if err != nil || !left {
				closeLineConn(h.conn)
				return
			}
			k.mu.Lock()
			if !k.closed && len(k.lineIdle) < lineIdleMax {
				k.lineIdle = append(k.lineIdle, idleLineConn{h.lineConn, time.Now()})
				k.mu.Unlock()
				return
			}
			k.mu.Unlock()
			closeLineConn(h.conn)
			return
		}
	}
}

// leave gives the line's head to the next session in it, after clearing
// the claim; with giveBack, a permit already granted to the claim but not
// adopted is given back. It does not wait for the statement.
func (h *lineHold) leave(giveBack bool) {
	h.giveBack = giveBack
	close(h.stop)
}

// closeLineConns closes the kept line connections (Close).
func (k *Locker) closeLineConns() {
	k.mu.Lock()
	idle := k.lineIdle
	k.lineIdle = nil
	k.mu.Unlock()
	for _, c := range idle {
		closeLineConn(c.conn)
	}
}

// closeLineConn closes a line connection within a second; its session's
// locks go with it.
func closeLineConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
