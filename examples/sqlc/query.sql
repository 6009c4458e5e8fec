-- name: Present :exec
-- Presents the token to the guard for the rest of the transaction: every
-- later UPDATE and DELETE in it presents this token.
SELECT pgfence.pgfence_present(@token);

-- name: ClaimAccount :one
-- Claims the account for the token before reading it, and reads it, in one
-- statement: the trigger rejects the claim (PF001) when a newer holder has
-- written the row, and no row comes back when there is no such account.
UPDATE accounts SET fence_token = @token WHERE id = @id
RETURNING balance;

-- name: ClaimAccounts :many
-- Claims a set of accounts, all or nothing: one stale row makes the trigger
-- fail the whole statement.
UPDATE accounts SET fence_token = @token WHERE id = ANY(@ids::int[])
RETURNING id, balance;

-- name: ReadBalance :one
-- A plain read, as code that does not claim first would do.
SELECT balance FROM accounts WHERE id = @id;

-- name: SetBalance :execresult
-- A guarded write, after Present: it sets the guard column to the token.
UPDATE accounts SET balance = @balance, fence_token = @token WHERE id = @id;

-- name: AddDeposit :exec
INSERT INTO deposits (account_id, amount, token) VALUES (@account_id, @amount, @token);

-- name: AuditAccounts :many
-- Each account's balance next to the sum of its recorded deposits.
SELECT a.id, a.balance, COALESCE(SUM(d.amount), 0)::bigint AS deposited
FROM accounts a LEFT JOIN deposits d ON d.account_id = a.id
GROUP BY a.id, a.balance
ORDER BY a.id;
