package systems

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/fence"
)

// FenceBeforeWriters measure, next to FenceWriters, what fence.Update's
// Exec sent before issue 16: the full statement (UpdateStmt.SQL) alone,
// which tells every outcome apart in one round trip; Exec now sends the
// guarded UPDATE first and the full statement only when that wrote
// nothing. And the DELETE paths: a plain DELETE and fence.Delete, each
// followed by the INSERT that puts the row back, in one transaction.
var FenceBeforeWriters = []harness.WriterSpec{
	fullStatementWriter("fence.Update full statement (before)", "UpdateStmt.SQL(2) sent alone: the statement fence.Update's Exec sent on every call before issue 16",
		modeGuarded),
	fullStatementWriter("fence.Update.UnderLease full statement (before)", "the same with UnderLease: UpdateStmt.UnderLease(name, secret).SQL(2) sent alone",
		modeLeaseChecked),
	deleteWriter("plain DELETE + INSERT", "BEGIN; DELETE FROM bench_accounts WHERE id = $1; INSERT the row again; COMMIT", false),
	deleteWriter("fence.Delete + INSERT", "BEGIN; fence.Delete(\"bench_accounts\").Where(\"id = $1\").Exec; INSERT the row again; COMMIT", true),
}

func fullStatementWriter(name, note string, mode writeMode) harness.WriterSpec {
	stmt := fence.Update("bench_accounts").Set("balance = balance + $1").Where("id = $2")
	return harness.WriterSpec{
		Name: name,
		Kind: harness.Pgfence,
		Note: note,
		Open: func(ctx context.Context, env *harness.Env, clients int) (harness.Writer, error) {
			pool, err := openPool(ctx, env, env.DatabaseURL, clients)
			if err != nil {
				return nil, err
			}
			w, err := setupRawWriter(ctx, pool, clients, "bench_accounts", mode)
			if err != nil {
				pool.Close()
				return nil, err
			}
			s := stmt
			if mode == modeLeaseChecked {
				s = s.UnderLease("lease", pgfence.NewSecret("unused")) // SQL only: the secret is an argument
			}
			if w.sql, err = s.SQL(2); err != nil {
				pool.Close()
				return nil, err
			}
			return &fullWrite{w}, nil
		},
	}
}

type fullWrite struct{ *rawWrite }

func (w *fullWrite) Write(ctx context.Context, worker int) error {
	var written, matched, nulls int64
	var current *int64
	var held bool
	if err := w.pool.QueryRow(ctx, w.sql, w.args(worker)...).Scan(&written, &matched, &current, &nulls, &held); err != nil {
		return err
	}
	if written != 1 {
		return fmt.Errorf("write to row %d wrote %d rows", worker, written)
	}
	return nil
}

const (
	deletePlain   = `DELETE FROM bench_accounts WHERE id = $1`
	restoreRow    = `INSERT INTO bench_accounts (id) VALUES ($1)`
	deleteBuilder = "id = $1"
)

func deleteWriter(name, note string, fenced bool) harness.WriterSpec {
	del := fence.Delete("bench_accounts").Where(deleteBuilder)
	return harness.WriterSpec{
		Name: name,
		Kind: harness.Ceiling,
		Note: note,
		Open: func(ctx context.Context, env *harness.Env, clients int) (harness.Writer, error) {
			pool, err := openPool(ctx, env, env.DatabaseURL, clients)
			if err != nil {
				return nil, err
			}
			w, err := setupRawWriter(ctx, pool, clients, "bench_accounts", modeGuarded)
			if err != nil {
				pool.Close()
				return nil, err
			}
			if fenced {
				return &deleteWrite{rawWrite: w, del: del}, nil
			}
			return &deleteWrite{rawWrite: w}, nil
		},
	}
}

type deleteWrite struct {
	*rawWrite
	del *fence.DeleteStmt // nil: the plain DELETE
}

func (w *deleteWrite) Write(ctx context.Context, worker int) error {
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if w.del != nil {
			if _, err := w.del.Exec(ctx, tx, w.tokens[worker], worker); err != nil {
				return err
			}
		} else if tag, err := tx.Exec(ctx, deletePlain, worker); err != nil {
			return err
		} else if tag.RowsAffected() != 1 {
			return fmt.Errorf("delete of row %d deleted %d rows", worker, tag.RowsAffected())
		}
		_, err := tx.Exec(ctx, restoreRow, worker)
		return err
	})
}

// Explain is not offered: the DELETE paths are two statements.
func (w *deleteWrite) Explain(context.Context, int) (string, error) {
	return "", fmt.Errorf("not explained: two statements per write")
}
