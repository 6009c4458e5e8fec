package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/leasetable"
)

// databaseFlagUsage is the help line of every command's --database flag.
const databaseFlagUsage = "database URL or key=value string (default $DATABASE_URL, else the PG* variables)"

// schemaFlag defines --schema on f, with pgfence.DefaultSchema as default.
func schemaFlag(f *flags, p *string) {
	*p = pgfence.DefaultSchema
	f.String(p, "", "schema", "NAME", "the schema pgfence is installed in (an identifier, used as is)")
}

// checkSchema returns a usage error when schema is not a valid identifier.
func checkSchema(schema string) error {
	if schema == "" {
		return usageErrorf("--schema is empty")
	}
	if _, _, err := install.Schema("--schema", schema); err != nil {
		return usageErrorf("%v", err)
	}
	return nil
}

// connectTimeout bounds connecting when the connection string sets no
// connect_timeout of its own.
const connectTimeout = 15 * time.Second

// libpqEnv are the libpq environment variables that pgx reads; any of them
// set means the user chose a database through the environment.
var libpqEnv = []string{
	"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD",
	"PGPASSFILE", "PGSERVICE", "PGSERVICEFILE", "PGSSLMODE", "PGAPPNAME",
}

// connString returns the connection string to use: flagValue, else
// DATABASE_URL, else one that makes pgx take everything from the PG*
// variables. With none of them set it returns a usage error.
func connString(flagValue string) (string, error) {
	if s := strings.TrimSpace(flagValue); s != "" {
		return s, validate(s, "--database")
	}
	if s := strings.TrimSpace(os.Getenv("DATABASE_URL")); s != "" {
		return s, validate(s, "DATABASE_URL")
	}
	for _, k := range libpqEnv {
		if os.Getenv(k) != "" {
			// pgx fills in every setting from the PG* variables; the string
			// only names the application (PGAPPNAME's value if set), so
			// that it is never empty and shows in pg_stat_activity.
			app := os.Getenv("PGAPPNAME")
			if app == "" {
				app = "pgfence"
			}
			return "application_name=" + quoteKV(app), nil
		}
	}
	return "", usageErrorf("no database: pass --database URL, or set DATABASE_URL (or the PG* variables such as PGHOST and PGDATABASE)")
}

func validate(s, source string) error {
	if _, err := pgx.ParseConfig(s); err != nil {
		return usageErrorf("invalid database in %s: %v", source, err)
	}
	return nil
}

// quoteKV quotes a value for a libpq keyword/value connection string.
func quoteKV(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// connConfig parses dsn for one connection: a bad dsn is a usage error;
// connecting gives up after connectTimeout unless the connection string
// sets connect_timeout; see setConnDefaults for app.
func connConfig(dsn, app string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, usageErrorf("invalid database: %v", err)
	}
	setConnDefaults(cfg, app)
	return cfg, nil
}

// setConnDefaults gives cfg what the connection string did not set:
// connectTimeout, and application_name app unless app is empty.
func setConnDefaults(cfg *pgx.ConnConfig, app string) {
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok && app != "" {
		cfg.RuntimeParams["application_name"] = app
	}
}

// connect opens one connection to the database. ctx bounds the connection
// attempt and the connection's later use; connecting alone gives up after
// connectTimeout unless the connection string sets connect_timeout.
func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := connConfig(dsn, "")
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	return conn, nil
}

// poolConfig parses dsn for a pool of at most maxConns connections named
// app (unless the connection string names one); connecting gives up after
// connectTimeout unless it sets connect_timeout. A bad dsn is a usage error.
func poolConfig(dsn, app string, maxConns int32) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, usageErrorf("invalid database: %v", err)
	}
	setConnDefaults(cfg.ConnConfig, app)
	cfg.MaxConns = maxConns
	return cfg, nil
}

// closeConn closes conn, even when ctx has ended.
func closeConn(ctx context.Context, conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// explainSchemaError adds advice to errors that say pgfence is not
// installed in schema: pgfence.ErrNotInstalled (which says how to fix it
// already), an undefined table, function or schema (42P01, 42883, 3F000),
// and a missing privilege (42501).
func explainSchemaError(err error, schema string) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil, errors.Is(err, pgfence.ErrNotInstalled):
		return err
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883" || pgErr.Code == "3F000"):
		return fmt.Errorf("%w\npgfence is not installed in schema %q of this database: run 'pgfence migrate up --schema %s' first",
			err, schema, schema)
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return fmt.Errorf("%w\nthe role lacks pgfence's grants: as the owner, run 'pgfence grant ROLE --schema %s' "+
			"(with --operator for release --force and ls --forced)", err, schema)
	}
	return err
}

// newPool opens a pool of at most maxConns connections for a command named
// app and checks that the database answers.
func newPool(ctx context.Context, dsn, app string, maxConns int32) (*pgxpool.Pool, error) {
	pcfg, err := poolConfig(dsn, app, maxConns)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	return pool, nil
}

// openLocker opens what ls, prune and release work with, as the command
// named app: after checking schema, a pool of at most maxConns connections
// to database (see connString) and a Locker on it for schema that does not
// listen. done closes the Locker, then the pool. The errors are the
// command's: usage errors for a bad --schema or database, and
// explainSchemaError's advice when pgfence is not installed.
func (a *App) openLocker(ctx context.Context, database, schema, app string, maxConns int32) (
	pool *pgxpool.Pool, locker *leasetable.Locker, done func(), err error) {
	if err := checkSchema(schema); err != nil {
		return nil, nil, nil, err
	}
	dsn, err := connString(database)
	if err != nil {
		return nil, nil, nil, err
	}
	if pool, err = newPool(ctx, dsn, app, maxConns); err != nil {
		return nil, nil, nil, err
	}
	locker, err = leasetable.New(ctx, pool, &leasetable.Config{Schema: schema, DisableListen: true, Logger: a.logger()})
	if err != nil {
		pool.Close()
		return nil, nil, nil, explainSchemaError(err, schema)
	}
	return pool, locker, func() { locker.Close(); pool.Close() }, nil
}
