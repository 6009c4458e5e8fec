package leasetable

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/internal/notifier"
)

// The hand-over (docs/semaphores.md, Hand-over; migration 000008): the head
// of a semaphore's line registers a claim on its line connection
// (pgfence_claim_permit): its owner, TTL, the SHA-256 of a secret it drew,
// a grant key, a version, the alive key its line session holds and the
// Locker's grant channel. A release that frees a permit of the semaphore
// grants it to the claim in the release's own statement while that
// session lives, and notifies the grant on the grant channel with a
// payload the grant key signs. The head adopts it from the notification:
// no statement of its own on the hand-over's path, and (migration 000009)
// no WAL flush either: the grant's token comes from a block the claim
// reserved durably, and the lease keeps the old one's expiry, which the
// adoption's local deadline follows. Every other way to a permit (a free
// slot, an expiry, a lost notification) goes through the claim call, which
// returns a grant already made to the claim.

// claimSQL is pgfence_claim_permit (%[1]s is the schema): $1 semaphore, $2
// permits, $3 owner, $4 TTL in microseconds, $5 the claim's secret, $6 its
// grant key, $7 its version, $8 the alive key of the line connection, $9
// the channel to notify the grant on.
const claimSQL = `SELECT acquired, name, owner, fence, acquired_at, expires_at, db_now, secret, permits, busy, claimed
FROM %[1]s.pgfence_claim_permit($1, $2, $3, $4, $5, $6, $7, $8, $9)`

// grantChannelPrefix starts the name of a Locker's grant channel.
const grantChannelPrefix = "pgfence_grant_"

// grantChannel returns a new Locker's grant channel: its LISTEN connection
// listens on it with [NotifyChannel], and a release notifies a grant to
// one of its claims there, so that no other Locker is woken by it.
func grantChannel() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail (Go 1.24)
	return grantChannelPrefix + hex.EncodeToString(b)
}

// leaveClaimSQL clears the claim of semaphore $1 registered with secret
// $2 (giving back a permit already granted to it when $3), then gives the
// line key back; the subquery runs first.
const leaveClaimSQL = `SELECT pg_catalog.pg_advisory_unlock(` + lineKeySQL + `)
FROM (SELECT %[1]s.pgfence_unclaim_permit($1, $2, $3) OFFSET 0) u`

// grantPrefix starts a grant's notification payload:
// g:tag:version:slot:token:granted_us:expires_us:mac.
const grantPrefix = "g:"

// permitClaim is the claim of a Locker's head of a semaphore's line.
type permitClaim struct {
	sem    string
	key    []byte // the grant key: signs the grant's notification
	secret string // the granted lease's secret

	// Guarded by Locker.mu.
	version int64     // the last version sent
	sent    time.Time // when it was sent

	grants chan handedGrant // buffered(1): a verified grant notification
}

// handedGrant is a grant to a claim, as its notification announces it.
type handedGrant struct {
	version              int64
	slot                 int
	token                int64
	grantedAt, expiresAt time.Time
	sent                 time.Time // when the claim's version was sent: the TTL runs from after it
}

// newClaim draws a claim's secret and grant key.
func newClaim(sem string) *permitClaim {
	b := make([]byte, 64)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail (Go 1.24)
	return &permitClaim{sem: sem, key: b[:32], secret: hex.EncodeToString(b[32:]), grants: make(chan handedGrant, 1)}
}

// grantMAC is the hex of sha256(key || sha256(key || 0x03 || msg)), as
// pgfence_hand_permit signs a grant.
func grantMAC(key []byte, msg string) string {
	return hex.EncodeToString(notifier.Envelope(key, 3, msg))
}

// parseGrant splits a grant payload into its tag, the signed text and the
// fields; ok is false for any other payload.
func parseGrant(payload string) (tag, msg, mac string, g handedGrant, ok bool) {
	i := strings.LastIndexByte(payload, ':')
	if !strings.HasPrefix(payload, grantPrefix) || i < 0 {
		return "", "", "", handedGrant{}, false
	}
	msg, mac = payload[:i], payload[i+1:]
	f := strings.Split(msg[len(grantPrefix):], ":")
	if len(f) != 6 {
		return "", "", "", handedGrant{}, false
	}
	var n [5]int64
	for j, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return "", "", "", handedGrant{}, false
		}
		n[j] = v
	}
	if n[1] < 0 || n[1] >= MaxPermits {
		return "", "", "", handedGrant{}, false
	}
	g = handedGrant{version: n[0], slot: int(n[1]), token: n[2], grantedAt: time.UnixMicro(n[3]), expiresAt: time.UnixMicro(n[4])}
	return f[0], msg, mac, g, true
}

// notifyGrant hands a grant notification to the claim it names, once its
// grant key verifies it; any other is dropped. So is a grant to a version
// of the claim before the last one sent: the call that sent the last one
// locked the claim first, and returned that grant itself.
func (k *Locker) notifyGrant(payload string) {
	tag, msg, mac, g, ok := parseGrant(payload)
	if !ok {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	name, ok := k.tagNames[tag]
	c := k.claims[name]
	if !ok || c == nil || subtle.ConstantTimeCompare([]byte(mac), []byte(grantMAC(c.key, msg))) != 1 {
		return
	}
	if g.version != c.version {
		return
	}
	g.sent = c.sent
	select {
	case c.grants <- g:
	default:
	}
}

// claimOn registers c as h's claim, so that grant notifications reach it.
func (k *Locker) claimOn(h *lineHold, c *permitClaim) {
	k.mu.Lock()
	defer k.mu.Unlock()
	h.claim = c
	k.claims[semaphoreKey(c.sem)] = c
}

// claimOff unregisters h's claim.
func (k *Locker) claimOff(h *lineHold) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if h.claim != nil && k.claims[semaphoreKey(h.claim.sem)] == h.claim {
		delete(k.claims, semaphoreKey(h.claim.sem))
	}
}

// grants returns the channel h's claim's grants arrive on; nil (never
// ready) without a claim.
func (h *lineHold) grants() <-chan handedGrant {
	if h == nil || h.claim == nil {
		return nil
	}
	return h.claim.grants
}

// claimAttempt sends pgfence_claim_permit on h's connection: the permit
// granted to the claim, a free one, or the claim registered (renewed) for
// the next release, unless this Locker's owner holds every permit held
// (its own release wakes the call in process).
func (k *Locker) claimAttempt(ctx context.Context, h *lineHold, permits int, t leaseTiming, attempts *int) (l *Lease, retryIn time.Duration, err error) {
	*attempts++
	back, err := k.startGrant()
	if err != nil {
		return nil, 0, err
	}
	defer back()
	c := h.claim
	k.mu.Lock()
	c.version++
	c.sent = time.Now()
	version, sent := c.version, c.sent
	k.mu.Unlock()
	// A grant that came before this call is to an earlier version: this
	// call returns it (or it was given back). Drop it.
	select {
	case <-c.grants:
	default:
	}
	var (
		rep       acquireReply
		pname     *string
		recorded  int
		expiresAt *time.Time
		secret    *string
		claimed   bool
	)
	err = h.statement(ctx, k, t, func(qctx context.Context, conn *pgx.Conn) error {
		var owner *string
		var token *int64
		var acquiredAt *time.Time
		rep.sent = sent
		err := conn.QueryRow(qctx, k.sql.claim, c.sem, permits, k.cfg.Owner, t.ttl.Microseconds(),
			c.secret, c.key, version, h.alive, k.grantChannel).Scan(
			&rep.acquired, &pname, &owner, &token, &acquiredAt, &expiresAt, &rep.dbNow, &secret, &recorded, &rep.busy, &claimed)
		if err != nil || !rep.acquired {
			return err
		}
		if pname == nil || owner == nil || token == nil || acquiredAt == nil || expiresAt == nil {
			return fmt.Errorf("pgfence_claim_permit granted %q without a token", c.sem)
		}
		rep.owner, rep.token, rep.acquiredAt, rep.expiresAt = *owner, *token, *acquiredAt, *expiresAt
		if secret != nil {
			rep.secret = *secret
		} else {
			// Granted to the claim by a release, at a version sent earlier:
			// db_now is this call's, so newLease counts what is left of the
			// lease from when this call was sent.
			rep.secret = c.secret
		}
		return nil
	})
	if claimed || err != nil {
		h.claimed = true // leave clears it (after an error, it may have been registered)
	}
	if err != nil {
		return nil, 0, err
	}
	return k.permitReply(ctx, c.sem, permits, t, rep, pname, recorded, expiresAt, false)
}

// adoptHanded makes a grant that reached h's claim by notification a held
// *Lease, as adoptGrant does an answer's.
func (k *Locker) adoptHanded(ctx context.Context, h *lineHold, g handedGrant, t leaseTiming) (*Lease, error) {
	back, err := k.startGrant()
	if err != nil {
		return nil, err
	}
	defer back()
	// Good for expires-granted from when the claim's version was sent,
	// before the grant (newLease).
	rep := acquireReply{
		found: true, acquired: true, owner: k.cfg.Owner, token: g.token, secret: h.claim.secret,
		acquiredAt: g.grantedAt, expiresAt: g.expiresAt, dbNow: g.grantedAt, sent: g.sent,
	}
	l, err := k.adoptGrant(ctx, PermitName(h.claim.sem, g.slot), rep, t)
	if err == nil && k.hooks != nil && k.hooks.onHanded != nil {
		k.hooks.onHanded(g.token)
	}
	return l, err
}

// statement runs fn on h's connection, which the pings share, as
// grantStatement runs a pool statement: once sent, it runs to its answer
// for at most QueryTimeout after ctx ended, and never past the TTL.
func (h *lineHold) statement(ctx context.Context, k *Locker, t leaseTiming, fn func(context.Context, *pgx.Conn) error) (err error) {
	defer func() { err = install.WrapPermission(err, "", k.cfg.Schema) }()
	h.mu.Lock()
	defer h.mu.Unlock()
	qctx, done := k.grantContext(ctx, t)
	defer done()
	return fn(qctx, h.conn)
}
