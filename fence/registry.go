package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/install"
)

// MaxResourceName is the longest resource name, in bytes, the fence
// registry accepts.
const MaxResourceName = 512

// registryTable is the fence registry's table, named in its rejections.
const registryTable = "pgfence_fence_registry"

// ResourceOpts changes what [CheckResource] does. A nil *ResourceOpts is the
// same as the zero ResourceOpts.
type ResourceOpts struct {
	// Schema is the schema pgfence is installed in; empty means "pgfence".
	Schema string
}

// CheckResource presents token for resource to the fence registry of tx's
// database, in tx's transaction: a token at least the highest presented for
// resource is accepted and becomes the highest; an older one is rejected
// with a [*StaleTokenError] (matching pgfence.ErrFenced) whose Resource is
// set. An accepted check holds the resource's registry row locked until tx
// ends, so the writes tx makes commit before any newer token is accepted,
// and a rollback undoes the raise. tx must be a transaction (a
// *pgxpool.Pool is refused), in any database pgfence is installed in. It
// returns an error for an empty or too long resource, a token that is not
// positive, and the database's error; a role denied the check gets
// PostgreSQL's error with a hint naming the grant, `pgfence grant ROLE
// --check-only` (migrations.GrantOpts.CheckOnly).
func CheckResource(ctx context.Context, tx pgfence.DB, resource string, token int64, opts *ResourceOpts) error {
	switch tx.(type) {
	case nil:
		return errors.New("fence: CheckResource: nil transaction")
	case *pgxpool.Pool:
		return errors.New("fence: CheckResource needs a transaction, not a pool: the check and the writes it admits must commit together")
	}
	if err := checkResource(resource); err != nil {
		return fmt.Errorf("fence: CheckResource: %w", err)
	}
	if token <= 0 {
		return fmt.Errorf("fence: CheckResource: fencing token %d is not positive; tokens come from pgfence_next_token()", token)
	}
	schema := pgfence.DefaultSchema
	if opts != nil && opts.Schema != "" {
		schema = opts.Schema
	}
	if err := checkName("schema", schema); err != nil {
		return err
	}
	// Locks the resource's registry row until the transaction ends.
	sql := "SELECT " + pgx.Identifier{schema, "pgfence_fence_check"}.Sanitize() + "($1::pg_catalog.text, $2::pg_catalog.int8)"
	if _, err := tx.Exec(ctx, sql, resource, token); err != nil {
		if denied := checkDenied(err, schema); denied != nil {
			return denied
		}
		err = Classify(err)
		var stale *StaleTokenError
		if errors.As(err, &stale) {
			stale.Resource = resource
			return stale
		}
		return fmt.Errorf("fence: CheckResource: %w", err)
	}
	return nil
}

// checkDenied returns err, when PostgreSQL denied the check for want of a
// privilege, as an [install.PermissionError] hinting at the grant that gives
// a checking service what the check needs and nothing more
// (migrations.GrantOpts.CheckOnly: USAGE on the schema, EXECUTE on
// pgfence_fence_check and pgfence_schema_version). Otherwise nil.
func checkDenied(err error, schema string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != install.InsufficientPrivilege {
		return nil
	}
	var missing []string // WrapPermission names what PostgreSQL denied otherwise
	switch what, _ := strings.CutPrefix(pgErr.Message, "permission denied for "); {
	case strings.HasPrefix(what, "schema "):
		missing = []string{"USAGE on schema " + pgx.Identifier{schema}.Sanitize()}
	case what == "function pgfence_fence_check":
		missing = []string{"EXECUTE on function " + pgx.Identifier{schema}.Sanitize() + ".pgfence_fence_check(text, bigint)"}
	}
	var pe *install.PermissionError
	errors.As(install.WrapPermission(fmt.Errorf("fence: CheckResource: %w", err), "", schema, missing...), &pe)
	pe.CheckOnly = true
	return pe
}

// checkResource rejects a resource name the registry would refuse.
func checkResource(resource string) error {
	switch {
	case resource == "":
		return errors.New("empty resource name")
	case len(resource) > MaxResourceName:
		return fmt.Errorf("resource name is %d bytes long; the registry takes at most %d", len(resource), MaxResourceName)
	}
	return nil
}
