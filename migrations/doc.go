// Package migrations installs, upgrades and removes pgfence's objects in a
// PostgreSQL database, and grants application roles what they need to use
// them.
//
// The migrations are plain SQL files in golang-migrate's format ([FS]),
// applied either from Go with [Up] or with the migrate CLI. Both record the
// version in the same table ([Table]) and take the same advisory lock, so
// either can continue what the other started.
//
// # Installing
//
// Everything pgfence installs lives in one schema of its own, "pgfence"
// unless [Config] names another. The object names keep their pgfence_
// prefix: pgfence_leases (the lease table), pgfence_leases_fence_seq (the
// one source of fencing tokens), the functions pgfence_next_token,
// pgfence_acquire and the others below, and golang-migrate's
// pgfence_schema_migrations. One database holds one install: a second one,
// in another schema, would draw tokens from a second sequence, so that
// tokens of one lock name could come from two unrelated counters. [Up]
// refuses it before changing anything, and migration 000003 refuses it too.
//
// From Go, as the owner role (see Roles):
//
//	err := migrations.Up(ctx, migrations.Target{URL: "postgres://owner@db.internal/app"}, nil)
//
// [Up] creates the schema when it is missing (which needs the CREATE
// privilege on the database; a schema that exists, for example one a DBA
// created with AUTHORIZATION owner, is used when the owner owns it) and
// applies the pending migrations on a connection whose search_path is
// exactly that schema. To
// use another schema, pass the same &migrations.Config{Schema: "..."} to Up,
// [Down], [Version] and [Grant], and the same schema to the lockers' and the
// command's configuration. The name is an identifier, used quoted.
//
// With the migrate CLI, create the schema once and put it on the URL as the
// search_path, together with pgfence's migrations table:
//
//	psql -c 'CREATE SCHEMA pgfence'
//	migrate -path migrations \
//	    -database 'pgx5://owner@db.internal/app?search_path=pgfence&x-migrations-table=pgfence_schema_migrations' up
//
// The files install into the first schema of the search_path
// (current_schema()), so a URL without search_path installs into public.
//
// # Ownership
//
// The owner of a schema, and of any object in it, can drop and replace
// pgfence's functions, or shadow them with overloads. So before changing
// anything Up refuses a schema that is not owned by current_user (the role
// whose objects Up creates: SET ROLE counts, session_user does not), or
// that holds a function, table, sequence, view, type, operator or other
// object owned by another role. It also refuses to migrate an install owned
// by another role, and names that role. Schema public, owned by
// pg_database_owner since PostgreSQL 15, counts as owned by the database's
// owner. At the latest version Up changes nothing and checks that the
// install's owner owns the schema and everything in it; it cannot tell
// whether that is the role meant to own it (a role that installed pgfence
// before the owner did would pass), so check the schema's owner once.
//
// golang-migrate's CLI cannot make these checks. Run `pgfence migrate up`
// (which uses Up) as the owner, or have the owner create the schema first
// with CREATE SCHEMA, without IF NOT EXISTS, so that it fails when another
// role made the schema before, and only then run the CLI.
//
// Upgrading the release candidate, which installed migrations 000001 and
// 000002 into public: run Up with Schema "public" (or the CLI with
// search_path=public), and keep using "public" as the schema. The install
// is upgraded in place, keeping its token sequence. Moving it to another
// schema is a manual job (ALTER ... SET SCHEMA for the table, the functions
// and the migrations table) done while no locker runs.
//
// Each migration runs in its own transaction together with the update of
// the recorded version, so a migration that fails or is stopped leaves
// nothing behind and the version where it was. A schema left dirty by a
// failed run of the CLI is refused by Up and Down: repair it, then use the
// CLI's force command.
//
// # Roles
//
// Use three kinds of role:
//
//   - An owner, which runs Up, Down and Grant and owns every object pgfence
//     installs. The functions below are SECURITY DEFINER: they run with the
//     owner's privileges, so the owner should not be a superuser, and no
//     application should log in as it.
//   - Application roles, which take and release locks: each gets exactly
//     what [Grant] gives it (the statements are [GrantSQL]'s), below.
//   - Operators, for `pgfence release --force`: Grant with
//     [GrantOpts].Operator adds EXECUTE on pgfence_force_release and SELECT
//     on the audit table pgfence_forced_releases.
//
// Migration 000003 revokes every privilege on pgfence's objects from PUBLIC,
// so a role that was not granted can do nothing with them. Triggers created
// before keep firing (PostgreSQL checks EXECUTE on a trigger function only
// when the trigger is created), but the role that creates new ones, often
// the application's migration role rather than the application itself,
// needs the grant too.
//
// # Grants
//
// What [Grant] gives an application role, and why each is enough:
//
//	USAGE on the schema                      to name the objects in it
//	SELECT on pgfence_leases                 to list leases (pgfence ls)
//	SELECT on pgfence_schema_migrations      Version, and Up at start-up
//	EXECUTE on pgfence_next_token()          tokens for advisory locks
//	EXECUTE on pgfence_schema_version()      lockers check the install
//	EXECUTE on pgfence_acquire(...)          take leases
//	EXECUTE on pgfence_release(...)          give them back
//	EXECUTE on pgfence_renew(...)            keep them
//	EXECUTE on pgfence_lease_held(...)       lease-checked writes (fence)
//	EXECUTE on pgfence_prune_scan(...)       Prune: find long-expired rows
//	EXECUTE on pgfence_prune_delete(...)     Prune: delete them
//	EXECUTE on pgfence_guard()               CREATE TRIGGER checks it
//	from migration 4: EXECUTE on pgfence_guard_strict(), pgfence_guard_truncate()
//	(CREATE TRIGGER) and pgfence_last_token() (called by the strict trigger
//	as the writing role)
//	from migration 9: EXECUTE on pgfence_next_tokens(boolean[]) (an advisory
//	Locker's tokens, all of a combined statement's in one call; migration 9
//	itself grants it to every role that may execute pgfence_next_token())
//	from migration 5: SELECT on pgfence_leaders and EXECUTE on
//	pgfence_leader_proclaim(...) (package leader)
//	from migration 12: pgfence_renew, pgfence_release and pgfence_lease_held
//	take the lease's secret (the older signatures are gone); SELECT on
//	pgfence_notify_key, the key that authenticates notifications
//
// With Operator, also:
//
//	EXECUTE on pgfence_force_release(name, reason)   end any lease, recorded
//	SELECT on pgfence_forced_releases                read the record
//
// Nothing on the sequence, and no INSERT, UPDATE, DELETE or TRUNCATE on
// pgfence_leases (nor SELECT ... FOR UPDATE, which needs UPDATE): every write
// goes through the functions, which run as the owner and check what they
// write.
//
// Grant checks, before it commits, that the role holds each of these
// (PostgreSQL grants nothing, and only warns, when the granting role may
// not grant), and fails naming each one missing.
//
// # Start-up
//
// An application may call [Up] at start-up as its own role: at the latest
// version Up only reads the version (USAGE on the schema and SELECT on
// pgfence_schema_migrations, which Grant gives) and returns nil. When a
// migration is pending it fails, naming the owner as whom to run
// migrations. A permission error (SQLSTATE 42501) from [Up], [Version] or
// [Grant] stays a *pgconn.PgError and its message names the grant missing.
//
// # What the functions protect, and what they do not
//
// Every function pgfence installs runs with search_path pinned to
// pg_catalog, the install's schema, pg_temp, and calls the built-ins it uses
// under that path: a role that may create objects in a schema on a caller's
// search_path (public, typically) cannot substitute its own nextval, now,
// unnest, operator or look-alike table, which is the attack of
// CVE-2018-1058. Because the application role writes pgfence_leases and
// draws from the sequence only through the SECURITY DEFINER functions, such
// a role, or an application role that is compromised or buggy, cannot:
//
//   - rewind, reissue or forge a token: the sequence is owned by the owner,
//     and pgfence_next_token refuses (SQLSTATE PF002) to draw from it unless
//     it is INCREMENT 1024 CACHE 1 NO CYCLE (INCREMENT 1 before migration
//     000010), so tokens only grow;
//   - take over a lease that has not expired on the database clock, or
//     revive one that has expired: acquire only takes free rows; renew and
//     release (whose at_least can keep a lease) only touch rows still held
//     with the same token on clock_timestamp(), so a transaction kept open
//     past the expiry cannot use its older now(); prune refuses a negative
//     age, which would delete a held row;
//   - force-release a lease without the operator grant, or erase the record
//     of a forced release.
//
// It does not stop an application role from doing what the functions allow:
// drawing fresh tokens with pgfence_next_token (which is how advisory locks
// get theirs, and which only ever moves tokens forward), and acquiring any
// free lease name under any owner string for a TTL of up to 7 days. Acting
// on a held lease (renewing, releasing, a lease-checked write, proclaiming
// a leader) needs the secret its acquisition returned, which no role can
// read back (from migration 12), so reading a lease's name, owner and token
// from pgfence_leases is not enough to end or extend it. Nor does any of
// this protect against the owner, a superuser, or anyone who can change the
// functions.
//
// # Contexts
//
// [Up], [Down], [Version] and [Grant] take a ctx that bounds everything,
// connecting included. When it ends, the statement in progress is cancelled
// on the server, the connection is closed, the migration in progress is
// rolled back, and the error wraps ctx.Err().
package migrations
