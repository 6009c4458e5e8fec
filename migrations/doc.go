// Package migrations installs and removes pgfence's objects in a PostgreSQL
// database, and grants application roles what they need to use them.
//
// The schema is one SQL migration in golang-migrate's format ([FS]), applied
// either from Go with [Up] or with the migrate CLI. Both record the version
// in the same table ([Table]) and take the same advisory lock, so either can
// continue what the other started. docs/install.md walks through an install.
//
// # Installing
//
// Everything pgfence installs lives in one schema of its own, "pgfence"
// unless [Config] names another: the lease table pgfence_leases, the token
// sequence pgfence_leases_fence_seq, the pgfence_* functions and the version
// table. One database holds one install: a second one, in another schema,
// would draw tokens from a second sequence, so [Up] and the migration itself
// refuse it.
//
// From Go, as the owner role (see Roles):
//
//	err := migrations.Up(ctx, migrations.Target{URL: "postgres://owner@db.internal/app"}, nil)
//
// [Up] creates the schema when it is missing (which needs CREATE on the
// database; a schema the owner owns already is used as it is) and applies
// the pending migration on a connection whose search_path is exactly that
// schema. To use another schema, pass the same &migrations.Config{Schema:
// "..."} to Up, [Down], [Version] and [Grant], and the same schema to the
// lockers and the command. The name is an identifier, used quoted.
//
// With the migrate CLI, create the schema once and put it on the URL as the
// search_path, together with pgfence's migrations table:
//
//	psql -c 'CREATE SCHEMA pgfence'
//	migrate -path migrations \
//	    -database 'pgx5://owner@db.internal/app?search_path=pgfence&x-migrations-table=pgfence_schema_migrations' up
//
// The migration installs into current_schema(), so a URL without
// search_path installs into public.
//
// # Ownership
//
// The owner of a schema, or of any object in it, can replace pgfence's
// functions or shadow them with overloads, so Up refuses a schema or object
// another role owns (see [Up]); schema public counts as owned by the
// database's owner. Up cannot tell whether the owner it finds is the role
// meant to own the install: check that once.
//
// The migrate CLI makes none of these checks: run `pgfence migrate up`
// (which uses Up) as the owner, or have the owner CREATE SCHEMA first
// (without IF NOT EXISTS, so it fails when another role made it) and only
// then run the CLI.
//
// The migration runs in one transaction with the update of the recorded
// version. A schema a failed CLI run left dirty is refused by Up and Down:
// repair it, then use the CLI's force command.
//
// # Roles
//
//   - An owner runs Up, Down and Grant and owns every object. Most functions
//     are SECURITY DEFINER and run as the owner, so it should not be a
//     superuser, and no application should log in as it.
//   - Application roles take and release locks with what [Grant] gives them
//     ([GrantSQL] shows the statements).
//   - Operators, for `pgfence release --force`: [GrantOpts].Operator adds
//     EXECUTE on pgfence_force_release and SELECT on pgfence_forced_releases.
//
// PUBLIC gets nothing on pgfence's objects. The role that creates guard
// triggers needs the grant too: PostgreSQL checks EXECUTE on a trigger
// function when the trigger is created.
//
// An application may call [Up] at start-up as its own role: at the latest
// version Up only reads the version; with the migration pending it fails,
// naming the owner as whom to migrate.
//
// # Grants
//
// [Grant] gives an application role USAGE on the schema; SELECT on
// pgfence_leases, pgfence_leaders, pgfence_notify_key (the key that
// authenticates notifications), pgfence_schema_migrations, pgfence_slots
// (the schedule's record) and pgfence_semaphores; and EXECUTE on
// the functions it calls: pgfence_next_token, pgfence_next_tokens,
// pgfence_schema_version, pgfence_acquire, pgfence_release, pgfence_renew,
// pgfence_lease_held, pgfence_prune_scan, pgfence_prune_delete,
// pgfence_leader_proclaim, pgfence_present, pgfence_protect,
// pgfence_maintenance, pgfence_fence_check, pgfence_slot_begin,
// pgfence_slot_finish, pgfence_slots_prune, pgfence_acquire_permit,
// pgfence_acquire_set, pgfence_claim_permit and pgfence_unclaim_permit
// (the head of a semaphore's line claims the next permit released), the
// trigger functions, and pgfence_last_token, which the strict trigger calls
// as the writing role.
//
// With [GrantOpts].CheckOnly it gives a service that only checks tokens
// with the fence registry USAGE on the schema and EXECUTE on
// pgfence_fence_check and pgfence_schema_version: it can raise a resource's
// highest token to one it is shown, never lower it, and reads or writes no
// table.
//
// Nothing on the sequences, and no INSERT, UPDATE, DELETE or TRUNCATE on the
// tables: every write goes through the functions, which run as the owner
// and check what they write.
//
// # What the functions protect, and what they do not
//
// Every function runs with search_path pinned to pg_catalog, the install's
// schema, pg_temp, and calls built-ins under that path: a role that may
// create objects in a schema on a caller's search_path cannot substitute its
// own nextval, now, operator or look-alike table (CVE-2018-1058). Because
// application roles write only through the functions, such a role, or a
// compromised application role, cannot:
//
//   - rewind, reissue or forge a token: pgfence_next_token refuses (PF002) a
//     sequence that is not INCREMENT 1024 CACHE 1 NO CYCLE;
//   - take over a lease that has not expired on the database clock, revive
//     one that has, or prune a held one;
//   - renew, release, check or proclaim with a lease it did not acquire: that
//     needs the secret the acquisition returned, which no role can read back;
//   - force-release a lease without the operator grant, or erase its record.
//
// It does not stop a role from doing what the functions allow: drawing
// fresh tokens (which only moves them forward), and acquiring any free name
// under any owner string for up to 7 days. Nor does any of this protect
// against the owner, a superuser, or anyone who can change the functions.
package migrations
