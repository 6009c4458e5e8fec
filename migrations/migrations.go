// Package migrations holds pgfence's SQL migrations in golang-migrate format.
//
// The files are plain SQL, named NNNNNN_name.up.sql and NNNNNN_name.down.sql,
// and can be applied with the migrate CLI using pgfence's own migrations table:
//
//	migrate -path migrations \
//	    -database 'pgx5://user@host:5432/db?sslmode=disable&x-migrations-table=pgfence_schema_migrations' up
//
// or from Go with [github.com/pgfence/pgfence.Migrate], which uses [FS].
package migrations

import "embed"

// FS holds the migration files, for golang-migrate's iofs source driver.
//
//go:embed *.sql
var FS embed.FS

// Table is the name of the table in which golang-migrate records which of
// pgfence's migrations have been applied. It is deliberately not
// golang-migrate's default schema_migrations, so pgfence's migrations never
// collide with the application's own.
const Table = "pgfence_schema_migrations"
