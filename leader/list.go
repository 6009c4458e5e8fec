package leader

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/install"
)

// listSQL reads every election that has had a proclaimed term (%[1]s is
// the schema), with its current term: the held lease of that name
// (expires_at after the database's now()) and the value that term
// proclaimed. Lease columns are NULL when nobody leads. It takes no locks.
const listSQL = `
SELECT e.name, l.owner, l.fence, l.acquired_at, l.expires_at, d.value, d.token IS NOT NULL
FROM (SELECT DISTINCT k.name FROM %[1]s.pgfence_leaders k) AS e
LEFT JOIN %[1]s.pgfence_leases l
    ON l.name OPERATOR(pg_catalog.=) e.name AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
LEFT JOIN %[1]s.pgfence_leaders d
    ON d.name OPERATOR(pg_catalog.=) e.name AND d.token OPERATOR(pg_catalog.=) l.fence
ORDER BY e.name`

// termsSQL reads the recorded terms of every election (%[1]s is the
// schema; the newest ten of each), newest first, and whether each is in
// force now. It takes no locks.
const termsSQL = `
SELECT d.name, d.token, d.owner, d.value, d.began_at,
       coalesce(l.fence OPERATOR(pg_catalog.=) d.token AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.now(), false),
       l.expires_at
FROM %[1]s.pgfence_leaders d
LEFT JOIN %[1]s.pgfence_leases l ON l.name OPERATOR(pg_catalog.=) d.name
ORDER BY d.name, d.token DESC`

// List returns every election of the install in schema (empty means
// [pgfence.DefaultSchema]) that has had a term proclaimed, in name order,
// each with its current term (Leading false when nobody leads now), for
// operators (pgfence ls). It reads through db in one statement bounded by
// ctx and needs SELECT on pgfence_leases and pgfence_leaders (granted by
// migrations.Grant).
func List(ctx context.Context, db pgfence.DB, schema string) ([]TermInfo, error) {
	quoted, err := quotedSchema(schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, fmt.Sprintf(listSQL, quoted))
	if err != nil {
		return nil, fmt.Errorf("pgfence: leader: list elections: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TermInfo, error) {
		var (
			i              TermInfo
			owner, value   *string
			token          *int64
			began, expires *time.Time
		)
		err := row.Scan(&i.Election, &owner, &token, &began, &expires, &value, &i.Proclaimed)
		if err == nil && token != nil {
			i.Leading, i.Token, i.Owner, i.BeganAt, i.ExpiresAt = true, *token, *owner, *began, *expires
			if value != nil {
				i.Value = *value
			}
		}
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgfence: leader: list elections: %w", err)
	}
	return out, nil
}

// Terms returns the terms recorded for every election of the install in
// schema (the newest ten of each), by election and newest first, for
// operators (pgfence ls --terms). Leading is true for a term in force now;
// ExpiresAt is set only for those. Like [List], one statement through db.
func Terms(ctx context.Context, db pgfence.DB, schema string) ([]TermInfo, error) {
	quoted, err := quotedSchema(schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, fmt.Sprintf(termsSQL, quoted))
	if err != nil {
		return nil, fmt.Errorf("pgfence: leader: list terms: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TermInfo, error) {
		var (
			i       TermInfo
			expires *time.Time
		)
		err := row.Scan(&i.Election, &i.Token, &i.Owner, &i.Value, &i.BeganAt, &i.Leading, &expires)
		i.Proclaimed = true
		if i.Leading && expires != nil {
			i.ExpiresAt = *expires
		}
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgfence: leader: list terms: %w", err)
	}
	return out, nil
}

func quotedSchema(schema string) (string, error) {
	_, quoted, err := install.Schema("pgfence: leader: schema", schema)
	return quoted, err
}
