-- The service's tables. Each account row carries the fencing token of the
-- holder that last wrote it, and the pgfence_guard trigger rejects (SQLSTATE
-- PF001) a write that would move it backwards, whatever query sends it.
CREATE TABLE accounts (
    id          int    PRIMARY KEY,
    balance     bigint NOT NULL DEFAULT 0,
    fence_token bigint NOT NULL DEFAULT 0
);

CREATE TRIGGER accounts_fence
    BEFORE UPDATE OR DELETE ON accounts
    FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('fence_token');

-- The audit trail: one row per deposit, written in the deposit's
-- transaction.
CREATE TABLE deposits (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id int    NOT NULL REFERENCES accounts (id),
    amount     bigint NOT NULL,
    token      bigint NOT NULL
);
