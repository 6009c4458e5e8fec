package migrations_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// claimant is a head of a semaphore's line as the library's is: a session
// of its own that holds its alive key and listens for grants on its own
// channel.
type claimant struct {
	conn    *pgx.Conn
	alive   int64
	secret  string
	key     []byte
	channel string
}

// newClaimant opens a claimant's session as role (the superuser when "").
func newClaimant(t *testing.T, db *pgtest.DB, role string, alive int64) *claimant {
	t.Helper()
	ctx := testCtx(t)
	cfg := db.Pool.Config().ConnConfig.Copy()
	if role != "" {
		cfg = as(t, db, role)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_lock($1::int8)", alive)
	require.NoError(t, err)
	channel := "pgfence_grant_" + strconv.FormatInt(alive, 10)
	_, err = conn.Exec(ctx, "LISTEN "+channel)
	require.NoError(t, err)
	return &claimant{conn: conn, alive: alive, secret: strings.Repeat("c", 64), key: []byte(strings.Repeat("k", 32)), channel: channel}
}

// claim calls pgfence_claim_permit for one permit of sem at version v;
// it returns the name and token granted, if any.
func (c *claimant) claim(t *testing.T, sem string, v int64) (acquired bool, name *string, token *int64, secret *string) {
	t.Helper()
	require.NoError(t, c.conn.QueryRow(testCtx(t),
		`SELECT acquired, name, fence, secret FROM pgfence.pgfence_claim_permit($1, 1, 'waiter', 60000000, $2, $3, $4, $5, $6)`,
		sem, c.secret, c.key, v, c.alive, c.channel).Scan(&acquired, &name, &token, &secret))
	return acquired, name, token, secret
}

// grantMAC is pgfence_hand_permit's signature of msg.
func grantMAC(key []byte, msg string) string {
	in := sha256.Sum256(append(append(append([]byte{}, key...), 3), msg...))
	out := sha256.Sum256(append(append([]byte{}, key...), in[:]...))
	return hex.EncodeToString(out[:])
}

// holdPermit takes permit 0 of sem (one permit) for the holder for 60 s.
func holdPermit(t *testing.T, db *pgtest.DB, sem string) (name string, token int64, secret string) {
	t.Helper()
	return holdPermitTTL(t, db, sem, time.Minute)
}

// holdPermitTTL takes permit 0 of sem (one permit) for the holder for ttl.
func holdPermitTTL(t *testing.T, db *pgtest.DB, sem string, ttl time.Duration) (name string, token int64, secret string) {
	t.Helper()
	require.NoError(t, db.Pool.QueryRow(testCtx(t),
		`SELECT name, fence, secret FROM pgfence.pgfence_acquire_permit($1, 1, 'holder', $2, false)`, sem, ttl.Microseconds()).Scan(&name, &token, &secret))
	return name, token, secret
}

// committedWith runs fn in a transaction of b's and returns the
// synchronous_commit the transaction then commits with.
func committedWith(t *testing.T, b interface {
	Begin(context.Context) (pgx.Tx, error)
}, fn func(ctx context.Context, tx pgx.Tx)) string {
	t.Helper()
	ctx := testCtx(t)
	tx, err := b.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	fn(ctx, tx)
	var sync string
	require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&sync))
	require.NoError(t, tx.Commit(ctx))
	return sync
}

// releaseIn releases a lease in a transaction and returns the
// synchronous_commit it commits with.
func releaseIn(t *testing.T, db *pgtest.DB, name string, token int64, secret string) string {
	t.Helper()
	return committedWith(t, db.Pool, func(ctx context.Context, tx pgx.Tx) {
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pgfence.pgfence_release(ARRAY[$1], ARRAY[$2::int8], ARRAY[$3], ARRAY[0::int8])`,
			name, token, secret).Scan(&n))
		require.Equal(t, 1, n)
	})
}

// leaseRow returns a lease's owner, token and whether it is held with the
// SHA-256 of secret.
func leaseRow(t *testing.T, db *pgtest.DB, name, secret string) (owner string, token int64, heldBySecret bool) {
	t.Helper()
	require.NoError(t, db.Pool.QueryRow(testCtx(t), `SELECT owner, fence,
		expires_at > clock_timestamp() AND secret_hash = sha256(convert_to($2, 'UTF8'))
		FROM pgfence.pgfence_leases WHERE name = $1`, name, secret).Scan(&owner, &token, &heldBySecret))
	return owner, token, heldBySecret
}

// TestPermitHandover: since migration 000008 a release that frees a permit
// grants it, in the same statement, to the claim of the semaphore's line
// head: the row is the claimant's (its owner, its secret's hash, a larger
// token), and the claimant's session gets a notification signed with its
// grant key naming the slot, the token and the claim's version; its next
// claim call returns the same grant. Since 000009 the token is the next of
// the block the claim reserved (durable when the claim committed), the
// lease keeps the old one's expiry, and the release's commit does not wait
// for the flush. Controls: a grant whose old lease has less than half the
// claim's TTL left, and one whose block is behind the slot's token, draw a
// token, get a full TTL and wait for the flush; once the claimant's
// session no longer holds its alive key (a head that crashed), the release
// frees the permit as before.
func TestPermitHandover(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	c := newClaimant(t, db, "", 7001)
	others, err := pgx.ConnectConfig(ctx, db.Pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { _ = others.Close(context.Background()) })
	_, err = others.Exec(ctx, "LISTEN pgfence_lease_released")
	require.NoError(t, err)

	name, token, secret := holdPermit(t, db, "jobs")
	held := expiresAt(t, db, name)
	acquired, _, _, _ := c.claim(t, "jobs", 1)
	require.False(t, acquired, "the permit is held: the claim is registered")
	reserved, end := reserve(t, db, "jobs")
	require.Greater(t, reserved, token, "the claim reserved a block above the slot's token")
	require.Equal(t, reserved+1024, end, "one sequence value's block")
	require.Equal(t, "off", releaseIn(t, db, name, token, secret), "a grant from the block commits without waiting for the flush")

	owner, granted, mine := leaseRow(t, db, name, c.secret)
	require.Equal(t, "waiter", owner)
	require.True(t, mine, "held with the claimant's secret")
	require.Equal(t, reserved, granted, "the block's first token")
	require.Equal(t, held, expiresAt(t, db, name), "the old lease's expiry")
	next, _ := reserve(t, db, "jobs")
	require.Equal(t, reserved+1, next, "the block's token used")

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := c.conn.WaitForNotification(wctx)
	require.NoError(t, err)
	require.Equal(t, c.channel, n.Channel, "on the claimant's own channel")
	i := strings.LastIndexByte(n.Payload, ':')
	msg, mac := n.Payload[:i], n.Payload[i+1:]
	require.Equal(t, grantMAC(c.key, msg), mac, "signed with the grant key")
	f := strings.Split(msg, ":")
	require.Len(t, f, 7)
	require.Equal(t, []string{"g", "1", "0"}, []string{f[0], f[2], f[3]}, "version 1, slot 0")
	require.Equal(t, granted, mustInt(t, f[4]))
	require.Equal(t, held.UnixMicro(), mustInt(t, f[6]), "the old lease's expiry")
	require.Less(t, mustInt(t, f[5]), mustInt(t, f[6]))

	// Other Lockers' connections, listening on pgfence_lease_released, are
	// not woken: the first notification they get is a marker sent after.
	_, err = db.Pool.Exec(ctx, `SELECT pg_notify('pgfence_lease_released', 'marker')`)
	require.NoError(t, err)
	n, err = others.WaitForNotification(wctx)
	require.NoError(t, err)
	require.Equal(t, "marker", n.Payload)

	acquired, gname, gtoken, gsecret := c.claim(t, "jobs", 2)
	require.True(t, acquired, "the next claim call returns the grant")
	require.Equal(t, name, *gname)
	require.Equal(t, granted, *gtoken)
	require.Nil(t, gsecret, "the secret is the claimant's own")

	// Controls: too little of the old lease left, then a block behind the
	// slot's token: a drawn token, a full TTL, the flush awaited.
	sname, stoken, ssecret := holdPermitTTL(t, db, "short", 20*time.Second)
	acquired, _, _, _ = c.claim(t, "short", 1)
	require.False(t, acquired)
	reserved, _ = reserve(t, db, "short")
	require.Equal(t, "on", releaseIn(t, db, sname, stoken, ssecret), "20 s left of a 60 s claim: the flush awaited")
	_, slow, mine := leaseRow(t, db, sname, c.secret)
	require.True(t, mine)
	require.Greater(t, slow, reserved, "a drawn token")
	fullTTL(t, db, sname)

	bname, btoken, bsecret := holdPermitTTL(t, db, "behind", 60*time.Second)
	acquired, _, _, _ = c.claim(t, "behind", 1)
	require.False(t, acquired)
	_, err = db.Pool.Exec(ctx, `UPDATE pgfence.pgfence_permit_claims SET reserve_next = $2 WHERE sem = $1`, "behind", btoken)
	require.NoError(t, err)
	require.Equal(t, "on", releaseIn(t, db, bname, btoken, bsecret), "a block behind the slot's token: the flush awaited")
	_, slow, mine = leaseRow(t, db, bname, c.secret)
	require.True(t, mine)
	require.Greater(t, slow, btoken)
	fullTTL(t, db, bname)

	// Control: a claim whose session ended is passed over.
	_, err = c.conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_unlock($1::int8)", c.alive)
	require.NoError(t, err)
	acquired, _, _, _ = c.claim(t, "jobs", 3)
	require.False(t, acquired)
	require.Equal(t, "off", releaseIn(t, db, name, granted, c.secret), "freed, not granted: no flush awaited")
	owner, _, mine = leaseRow(t, db, name, c.secret)
	require.Equal(t, "waiter", owner)
	require.False(t, mine, "freed")
	var open int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.pgfence_leases WHERE name = $1 AND expires_at > clock_timestamp()`, name).Scan(&open))
	require.Zero(t, open)
}

// reserve returns the block of tokens sem's claim row reserved.
func reserve(t *testing.T, db *pgtest.DB, sem string) (next, end int64) {
	t.Helper()
	require.NoError(t, db.Pool.QueryRow(testCtx(t),
		`SELECT reserve_next, reserve_end FROM pgfence.pgfence_permit_claims WHERE sem = $1`, sem).Scan(&next, &end))
	return next, end
}

// expiresAt returns a lease row's expires_at.
func expiresAt(t *testing.T, db *pgtest.DB, name string) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, db.Pool.QueryRow(testCtx(t), `SELECT expires_at FROM pgfence.pgfence_leases WHERE name = $1`, name).Scan(&at))
	return at
}

// fullTTL requires that lease name runs the claim's full TTL (60 s) from
// its acquisition.
func fullTTL(t *testing.T, db *pgtest.DB, name string) {
	t.Helper()
	var ttl time.Duration
	require.NoError(t, db.Pool.QueryRow(testCtx(t),
		`SELECT expires_at - acquired_at FROM pgfence.pgfence_leases WHERE name = $1`, name).Scan(&ttl))
	require.Equal(t, 60*time.Second, ttl, "a full TTL")
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return v
}

// claimIn registers c's claim on sem at version v in a transaction, and
// returns the synchronous_commit its commit ran with.
func (c *claimant) claimIn(t *testing.T, sem string, v int64) string {
	t.Helper()
	return committedWith(t, c.conn, func(ctx context.Context, tx pgx.Tx) {
		var claimed bool
		require.NoError(t, tx.QueryRow(ctx,
			`SELECT claimed FROM pgfence.pgfence_claim_permit($1, 1, 'waiter', 60000000, $2, $3, $4, $5, $6)`,
			sem, c.secret, c.key, v, c.alive, c.channel).Scan(&claimed))
		require.True(t, claimed)
	})
}

// TestPermitClaimBlock: a claim that draws its block of tokens commits with
// synchronous_commit on (the draw's rule: its commit waits for the flush
// when the WAL that covers the token is not on disk), and one that keeps
// its block commits without waiting. The claim that drew the block keeps
// it whatever is drawn after (its acquire began before the draw); another
// claim keeps it only while no token was drawn after it, and draws a new
// one once one was (another name's acquire), so that a hand-over's token
// stays above every token a grant returned before the claim's acquire
// began; any claim draws a new one once the semaphore's slot holds a
// token not below the block's next.
func TestPermitClaimBlock(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	c := newClaimant(t, db, "", 7003)
	_, token, _ := holdPermit(t, db, "jobs")

	require.Equal(t, "on", c.claimIn(t, "jobs", 1), "a drawn block is made durable by the claim's commit")
	first, end := reserve(t, db, "jobs")
	require.Greater(t, first, token)
	require.Equal(t, first+1024, end)
	require.Equal(t, "off", c.claimIn(t, "jobs", 2), "the block kept: nothing to wait for")
	kept, _ := reserve(t, db, "jobs")
	require.Equal(t, first, kept)

	var other int64
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT fence FROM pgfence.pgfence_acquire(ARRAY['other'], 'someone', ARRAY[60000000::int8])`).Scan(&other))
	require.Greater(t, other, first)
	require.Equal(t, "off", c.claimIn(t, "jobs", 3), "the claim that drew the block keeps it")
	kept, _ = reserve(t, db, "jobs")
	require.Equal(t, first, kept)

	next := newClaimant(t, db, "", 7004)
	next.secret = strings.Repeat("d", 64)
	require.Equal(t, "on", next.claimIn(t, "jobs", 1), "another claim, a token drawn after the block: a new one")
	second, _ := reserve(t, db, "jobs")
	require.Greater(t, second, other)

	// Control for the slot's rule: the block set back below the slot's token.
	_, err := db.Pool.Exec(ctx, `UPDATE pgfence.pgfence_permit_claims SET reserve_next = $1::int8, reserve_end = $2::int8 WHERE sem = 'jobs'`,
		token, second+1024)
	require.NoError(t, err)
	require.Equal(t, "on", next.claimIn(t, "jobs", 2), "a block not above the slot's token: a new one")
	third, _ := reserve(t, db, "jobs")
	require.Greater(t, third, second)
}

// TestPermitUnclaimNeedsSecret: a claim is deleted, and a permit granted to
// it given back, only with the claim's secret. A role that knows the
// semaphore (and could read the claimant's alive key in pg_locks) but not
// the secret changes nothing; the control, the claimant with its secret,
// gives the permit back.
func TestPermitUnclaimNeedsSecret(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	role := newRoles(t, "app")[0]
	db := pgtest.NewDB(t)
	require.NoError(t, migrations.Grant(ctx, migrations.Target{URL: db.URL}, role, nil, nil))
	c := newClaimant(t, db, role, 7002)
	name, token, secret := holdPermit(t, db, "jobs")
	acquired, _, _, _ := c.claim(t, "jobs", 1)
	require.False(t, acquired)
	releaseIn(t, db, name, token, secret)
	_, granted, mine := leaseRow(t, db, name, c.secret)
	require.True(t, mine)

	other := connAs(t, db, role)
	var back *int64
	require.NoError(t, other.QueryRow(ctx, `SELECT pgfence.pgfence_unclaim_permit('jobs', $1, true)`, strings.Repeat("x", 64)).Scan(&back))
	require.Nil(t, back)
	_, _, mine = leaseRow(t, db, name, c.secret)
	require.True(t, mine, "a stranger's unclaim gives nothing back")
	_, err := other.Exec(ctx, `SELECT * FROM pgfence.pgfence_permit_claims`)
	require.ErrorContains(t, err, "permission denied", "no role but the owner reads the claims (grant keys)")
	_, err = other.Exec(ctx, `SELECT pgfence.pgfence_hand_permit($1, $2, $3, 0)`, name, granted, c.secret)
	require.ErrorContains(t, err, "permission denied")

	require.NoError(t, c.conn.QueryRow(ctx, `SELECT pgfence.pgfence_unclaim_permit('jobs', $1, true)`, c.secret).Scan(&back))
	require.NotNil(t, back)
	require.Equal(t, granted, *back)
	_, _, mine = leaseRow(t, db, name, c.secret)
	require.False(t, mine, "control: the claimant gives it back")
}

// TestPermitClaimBadArguments: pgfence_claim_permit refuses a secret of
// fewer than 32 bytes, a grant key of another length than 32 bytes, a
// version below 1, an empty grant channel and an owner the lease table
// would refuse (which would otherwise fail the release that grants the
// claim), each with invalid_parameter_value and no claim registered. The
// control, the same call with good arguments, registers one.
func TestPermitClaimBadArguments(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	c := newClaimant(t, db, "", 7003)
	holdPermit(t, db, "jobs")
	good := []any{"jobs", 1, "waiter", int64(60000000), c.secret, c.key, int64(1), c.alive, c.channel}
	with := func(i int, v any) []any {
		args := append([]any{}, good...)
		args[i] = v
		return args
	}
	claims := func() int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.pgfence_permit_claims WHERE secret_hash IS NOT NULL`).Scan(&n))
		return n
	}
	const call = `SELECT count(*) FROM pgfence.pgfence_claim_permit($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	for what, args := range map[string][]any{
		"short secret":    with(4, "x"),
		"short grant key": with(5, []byte("k")),
		"version 0":       with(6, int64(0)),
		"empty channel":   with(8, ""),
		"empty owner":     with(2, ""),
		"long owner":      with(2, strings.Repeat("o", 513)),
	} {
		_, err := c.conn.Exec(ctx, call, args...)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, what)
		require.Equal(t, "22023", pgErr.Code, what)
		require.Zero(t, claims(), what)
	}
	_, err := c.conn.Exec(ctx, call, good...)
	require.NoError(t, err)
	require.Equal(t, 1, claims(), "control: good arguments register the claim")
}
