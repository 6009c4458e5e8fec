-- The service's tables, for a database migrated by pgfence (schema version
-- 13 or later). Each account row carries the fencing token of the holder
-- that last wrote it. pgfence_protect attaches the guard in strict mode:
-- whatever query sends it, an UPDATE or DELETE must present a token at
-- least the row's (a stale one is SQLSTATE PF001) and must present one at
-- all (none is PF004). pgfence_stub.sql declares pgfence_present for sqlc
-- alone; the tests build their database from this file only.
CREATE TABLE accounts (
    id          int    PRIMARY KEY,
    balance     bigint NOT NULL DEFAULT 0,
    fence_token bigint NOT NULL DEFAULT 0
);

SELECT pgfence.pgfence_protect('accounts', 'fence_token', true);

-- The audit trail: one row per deposit, written in the deposit's
-- transaction.
CREATE TABLE deposits (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id int    NOT NULL REFERENCES accounts (id),
    amount     bigint NOT NULL,
    token      bigint NOT NULL
);
