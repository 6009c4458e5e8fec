package leasetable_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// hostileSQL is what an attacker with CREATE on schema public plants: a
// log writable by all, and look-alikes of what leasetable's statements and
// New's install check call, with the built-ins' own signatures (they win
// wherever public comes before pg_catalog on the caller's search_path)
// and, for the functions, text overloads (they win for untyped literals
// even when pg_catalog comes first). Each records that it ran, then does
// what the real one does.
var hostileSQL = []string{
	`CREATE TABLE public.attacker_ran (fn text NOT NULL)`,
	`GRANT SELECT, INSERT ON public.attacker_ran TO PUBLIC`,
	`CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
		AS $f$ BEGIN INSERT INTO public.attacker_ran VALUES ('now'); RETURN pg_catalog.now(); END $f$`,
	`CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
		AS $f$ BEGIN INSERT INTO public.attacker_ran VALUES ('clock_timestamp'); RETURN pg_catalog.clock_timestamp(); END $f$`,
	`CREATE FUNCTION public.to_regclass(a text) RETURNS regclass LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
		AS $f$ BEGIN INSERT INTO public.attacker_ran VALUES ('to_regclass'); RETURN pg_catalog.to_regclass(a); END $f$`,
	`CREATE FUNCTION public.quote_ident(a text) RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
		AS $f$ BEGIN INSERT INTO public.attacker_ran VALUES ('quote_ident'); RETURN pg_catalog.quote_ident(a); END $f$`,
	`CREATE FUNCTION public.attacker_texteq(a text, b text) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
		AS $f$ BEGIN INSERT INTO public.attacker_ran VALUES ('text = text'); RETURN pg_catalog.texteq(a, b); END $f$`,
	`CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.attacker_texteq)`,
	`CREATE FUNCTION public.attacker_tsgt(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
		AS $f$ BEGIN INSERT INTO public.attacker_ran VALUES ('timestamptz > timestamptz'); RETURN pg_catalog.timestamptz_gt(a, b); END $f$`,
	`CREATE OPERATOR public.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = public.attacker_tsgt)`,
	`CREATE FUNCTION public.attacker_textcat(a text, b text) RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
		AS $f$ BEGIN INSERT INTO public.attacker_ran VALUES ('text || text'); RETURN pg_catalog.textcat(a, b); END $f$`,
	`CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = public.attacker_textcat)`,
	// A look-alike of the lease table, for statements that would name it
	// without its schema.
	`CREATE TABLE public.pgfence_leases (name text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz)`,
	`GRANT ALL ON public.pgfence_leases TO PUBLIC`,
}

// TestHostileSearchPath runs every statement a Locker sends (New's check,
// acquire, wait and wake-up, renew, list, get, prune, force release,
// release) as an application role with only pgfence's grants, whose
// search_path includes public, where an attacker planted look-alikes
// (CVE-2018-1058): none of them may run, and tokens still increase. The
// negative control shows the planted objects do run for unqualified SQL on
// the same connections.
func TestHostileSearchPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		searchPath   string
		operatorsWin bool // public before pg_catalog: same-signature look-alikes win
	}{
		{`"$user", public`, false},
		{`public, pg_catalog`, true},
	} {
		t.Run(tc.searchPath, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			db := pgtest.NewDB(t)
			for _, stmt := range hostileSQL {
				_, err := db.Pool.Exec(ctx, stmt)
				require.NoError(t, err, stmt)
			}
			app, _ := newRolePool(t, db, true)
			hostile := db.NewPool(t, func(c *pgxpool.Config) {
				c.ConnConfig.User = app.Config().ConnConfig.User
				c.ConnConfig.RuntimeParams["search_path"] = tc.searchPath
			})
			var path string
			require.NoError(t, hostile.QueryRow(ctx, "SHOW search_path").Scan(&path))
			require.Equal(t, tc.searchPath, path)

			k, err := leasetable.New(ctx, hostile, &leasetable.Config{TTL: 3 * time.Second, RenewInterval: 200 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(k.Close)
			other, err := leasetable.New(ctx, hostile, &leasetable.Config{TTL: 3 * time.Second})
			require.NoError(t, err)
			t.Cleanup(other.Close)

			var tokens []int64
			l, err := k.TryAcquire(ctx, "job", nil)
			require.NoError(t, err)
			tokens = append(tokens, l.Token())
			require.NoError(t, l.Renew(ctx))
			list, err := k.List(ctx)
			require.NoError(t, err)
			require.Len(t, list, 1)
			info, ok, err := k.Get(ctx, "job")
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, l.Token(), info.Token)

			// A waiter in another Locker, woken through LISTEN/NOTIFY.
			got := make(chan pgfence.Lease, 1)
			errc := make(chan error, 1)
			go func() {
				w, err := other.Acquire(ctx, "job", nil)
				got <- w
				errc <- err
			}()
			require.NoError(t, l.Release(ctx))
			w := <-got
			require.NoError(t, <-errc)
			tokens = append(tokens, w.Token())

			fr, err := k.ForceRelease(ctx, "job", "hostile test")
			require.NoError(t, err)
			tokens = append(tokens, fr.Token)
			require.ErrorIs(t, w.Renew(ctx), pgfence.ErrLeaseLost)
			_, err = k.ForcedReleases(ctx, 10)
			require.NoError(t, err)
			n, err := k.Prune(ctx, leasetable.MinPruneAge)
			require.NoError(t, err)
			require.Zero(t, n, "nothing ended a minute ago")
			l, err = k.TryAcquire(ctx, "job", nil)
			require.NoError(t, err)
			tokens = append(tokens, l.Token())
			require.NoError(t, l.Release(ctx))

			for i := 1; i < len(tokens); i++ {
				require.Greater(t, tokens[i], tokens[i-1], "tokens strictly increase: %v", tokens)
			}
			var ran []string
			require.NoError(t, db.Pool.QueryRow(ctx,
				`SELECT coalesce(array_agg(DISTINCT fn ORDER BY fn), '{}') FROM public.attacker_ran`).Scan(&ran))
			require.Empty(t, ran, "a planted look-alike ran")
			var planted int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM public.pgfence_leases`).Scan(&planted))
			require.Zero(t, planted, "the look-alike table was written")

			// Negative control: the same connections do reach planted
			// objects when SQL leaves the schema out: the table name finds
			// the look-alike, and with public first the look-alike
			// operators and now() run too.
			var unqualified, real int
			require.NoError(t, hostile.QueryRow(ctx,
				`SELECT count(*) FROM pgfence_leases WHERE name = 'job' OR expires_at > now()`).Scan(&unqualified))
			require.NoError(t, hostile.QueryRow(ctx,
				`SELECT count(*) FROM pgfence.pgfence_leases`).Scan(&real))
			require.Zero(t, unqualified, "the unqualified name reads the attacker's empty table")
			require.Equal(t, 1, real)
			require.NoError(t, db.Pool.QueryRow(ctx,
				`SELECT coalesce(array_agg(DISTINCT fn ORDER BY fn), '{}') FROM public.attacker_ran`).Scan(&ran))
			if tc.operatorsWin {
				// The table is empty: only now() and the operators of a
				// row could run, and there is no row; call them directly.
				require.NoError(t, hostile.QueryRow(ctx,
					`SELECT 'a' = 'a' AND now() > now() - interval '1 second'`).Scan(new(bool)))
				require.NoError(t, db.Pool.QueryRow(ctx,
					`SELECT coalesce(array_agg(DISTINCT fn ORDER BY fn), '{}') FROM public.attacker_ran`).Scan(&ran))
				require.Equal(t, []string{"now", "text = text", "timestamptz > timestamptz"}, ran,
					fmt.Sprintf("unqualified SQL under search_path %s", tc.searchPath))
			} else {
				require.Empty(t, ran, "with pg_catalog first, same-signature look-alikes lose")
			}
		})
	}
}
