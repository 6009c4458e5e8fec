-- Drops everything 000001_baseline.up.sql creates, with the grants on it
-- (the sequences go with the tables that own them). The schema stays:
-- migrations.Down cannot know whether Up created it. Dropping pgfence_guard
-- fails while a table's trigger still uses it: drop those triggers first.
DROP FUNCTION IF EXISTS
    pgfence_protect(regclass, name, boolean),
    pgfence_maintenance(regclass),
    pgfence_present(bigint),
    pgfence_guard_truncate(),
    pgfence_guard_strict(),
    pgfence_guard(),
    pgfence_leader_proclaim(text, bigint, text, text),
    pgfence_force_release(text, text),
    pgfence_prune_delete(text[], bigint[], interval),
    pgfence_prune_scan(text, integer, interval),
    pgfence_lease_held(text, bigint, text),
    pgfence_release(text[], bigint[], text[], bigint[]),
    pgfence_renew(text[], bigint[], text[], bigint[]),
    pgfence_acquire(text[], text, bigint[]),
    pgfence_notify_payload(text, bigint),
    pgfence_check_us(bigint[], bigint, text),
    pgfence_schema_version(),
    pgfence_last_token(),
    pgfence_next_tokens(boolean[]),
    pgfence_next_token();
DROP TABLE IF EXISTS pgfence_notify_key, pgfence_leaders, pgfence_forced_releases, pgfence_leases;
DROP SEQUENCE IF EXISTS pgfence_token_flush_seq;
