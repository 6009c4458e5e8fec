package fence_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

// The hand-written recipe of "Plain SQL and sqlc": present the token, claim
// the row (reading it), write it setting the column to the token.
const (
	claimSQL = `UPDATE guarded SET fence_token = $1 WHERE id = $2 RETURNING v`
	writeSQL = `UPDATE guarded SET v = $1, fence_token = $2 WHERE id = $3`
)

// recipe runs the claim and the write in one transaction as token, after
// present (nil: nothing presented), and returns the write's error.
func recipe(t *testing.T, b *testBundle, token int64, present func(pgx.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	if present != nil {
		if err := present(tx); err != nil {
			return err
		}
	}
	var v int
	if err := fence.Classify(tx.QueryRow(ctx, claimSQL, token, 1).Scan(&v)); err != nil {
		return err
	}
	if _, err := fence.Check(tx.Exec(ctx, writeSQL, v+1, token, 1)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// TestPresentOneRecipeBothModes runs the recipe for a lone worker in both
// trigger modes, presenting with fence.Present and with pgfence_present.
// Control: without presenting, strict mode rejects the write after the claim
// as presenting no token (ErrNoToken, not ErrFenced); with it, a stale
// holder is still fenced.
func TestPresentOneRecipeBothModes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, mode := range []struct{ name, ddl string }{{"strict", strictDDL}, {"default", defaultDDL}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := guardedSetup(t, mode.ddl, "fence_token")
			goPresent := func(tok int64) func(pgx.Tx) error {
				return func(tx pgx.Tx) error { return fence.Present(ctx, tx, tok) }
			}
			sqlPresent := func(tok int64) func(pgx.Tx) error {
				return func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "SELECT "+b.fn("pgfence_present")+"($1)", tok)
					return err
				}
			}
			for i := range 3 {
				require.NoError(t, recipe(t, b, 55, goPresent(55)), "write %d", i)
				require.NoError(t, recipe(t, b, 55, sqlPresent(55)), "write %d", i)
			}
			var v int
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT v FROM guarded WHERE id = 1").Scan(&v))
			require.Equal(t, 6, v, "every write of the lone worker succeeded")

			err := recipe(t, b, 55, nil)
			if mode.name == "strict" {
				require.ErrorIs(t, err, pgfence.ErrNoToken, "negative control: the write after the claim presents nothing")
				require.NotErrorIs(t, err, pgfence.ErrFenced)
			} else {
				require.NoError(t, err, "the default mode reads the raised column")
			}

			err = recipe(t, b, 40, goPresent(40))
			require.ErrorIs(t, err, pgfence.ErrFenced, "a stale holder that presents its token is fenced")
			var se *fence.StaleTokenError
			require.ErrorAs(t, err, &se)
			require.Equal(t, int64(40), se.Presented)
			require.Equal(t, int64(55), se.Current)
		})
	}
}

// TestPresentRefusesBadInput checks what Present and pgfence_present refuse.
func TestPresentRefusesBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	require.ErrorContains(t, fence.Present(ctx, b.pool, 5), "not a pool")
	require.Error(t, fence.Present(ctx, nil, 5))
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.ErrorContains(t, fence.Present(ctx, tx, 0), "not positive")
	require.NoError(t, fence.Present(ctx, tx, 7), "control: a positive token in a transaction")
	var setting string
	require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('pgfence.token')").Scan(&setting))
	require.Equal(t, "7", setting)

	_, err = b.pool.Exec(ctx, "SELECT "+b.fn("pgfence_present")+"(0)")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22023", pgErr.Code)
}

// TestNoTokenObserved checks that a builder's write rejected for presenting
// no token (here by a trigger of the caller's that clears pgfence.token and
// writes a strict table) is observed as NoTokenWrite, not StaleWrite, while
// a stale one is a StaleWrite.
func TestNoTokenObserved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := guardedSetup(t, strictDDL, "fence_token")
	b.exec(t, `CREATE FUNCTION touch_guarded() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM set_config('pgfence.token', '', true);
			UPDATE guarded SET v = v + 1 WHERE id = 1;
			RETURN NEW;
		END $$;
		CREATE TRIGGER touch AFTER UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION touch_guarded()`)
	b.account(t, 1, 0, 0)
	var events []pgfence.Event
	obs := pgfence.ObserverFunc(func(_ context.Context, e pgfence.Event) { events = append(events, e) })

	_, err := addBalance.Observer(obs).Exec(ctx, b.pool, 55, 1, 1)
	var ne *fence.NoTokenError
	require.ErrorAs(t, err, &ne)
	require.Equal(t, `"accounts"`, ne.Table)
	require.Equal(t, []pgfence.Event{pgfence.NoTokenWrite{Table: `"accounts"`, Current: rowToken}}, events)

	b.exec(t, "DROP TRIGGER touch ON accounts")
	b.exec(t, "UPDATE accounts SET fence_token = 60")
	events = nil
	_, err = addBalance.Observer(obs).Exec(ctx, b.pool, 55, 1, 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	require.Equal(t, []pgfence.Event{pgfence.StaleWrite{Table: `"accounts"`, Presented: 55, Current: 60}}, events)
}

// pqError has what lib/pq's *pq.Error offers Classify: SQLState and Get.
type pqError struct{ code, detail, message string }

func (e *pqError) Error() string    { return "pq: " + e.code }
func (e *pqError) SQLState() string { return e.code }
func (e *pqError) Get(k byte) string {
	switch k {
	case 'D':
		return e.detail
	case 'M':
		return e.message
	}
	return ""
}

// TestClassifyOtherDrivers checks that an error of another driver with a
// SQLState method (lib/pq's) is classified like pgx's. Control: the same
// error without the method is returned unchanged.
func TestClassifyOtherDrivers(t *testing.T) {
	t.Parallel()
	stale := fmt.Errorf("exec: %w", &pqError{fence.SQLState, "presented=4 current=9", ""})
	err := fence.Classify(stale)
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, int64(4), se.Presented)
	require.Equal(t, int64(9), se.Current)
	_, err = fence.CheckResult(nil, stale)
	require.ErrorIs(t, err, pgfence.ErrFenced)

	_, err = fence.CheckResult(nil, &pqError{fence.SQLStateNoToken, "presented= current=9",
		"pgfence: DELETE on public.jobs presents no fencing token (strict mode; current 9)"})
	require.ErrorIs(t, err, pgfence.ErrNoToken)
	require.NotErrorIs(t, err, pgfence.ErrFenced)
	var ne *fence.NoTokenError
	require.ErrorAs(t, err, &ne)
	require.Equal(t, `"public"."jobs"`, ne.Table)
	require.Equal(t, int64(9), ne.Current)
	require.ErrorIs(t, fence.Classify(&pqError{fence.SQLStateMalformedToken, "", ""}), fence.ErrMalformedToken)

	plain := errors.New("pq: stale fencing token")
	require.Equal(t, plain, fence.Classify(plain), "control: an error without SQLState is left alone")
}
