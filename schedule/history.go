package schedule

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Record is what the database holds of a slot.
type Record struct {
	Job, Slot string
	// State is "running", "done" or "failed".
	State string
	// Owner and Token are the last run's holder and lease token.
	Owner    string
	Token    int64
	Attempts int
	// StartedAt and FinishedAt are the last run's, on the database clock;
	// FinishedAt is zero while running.
	StartedAt  time.Time
	FinishedAt time.Time
	// Error is a failed run's error, at most 1024 bytes.
	Error string
}

// historySQL lists the newest $2 slots of each job, or, with job set, the
// newest $2 of job $1 alone: then a top-N read of the (job, started_at
// DESC) index instead of numbering every row of the table.
func historySQL(schema string, job bool) string {
	const cols = `s.job, s.slot, s.state, s.owner, s.token, s.attempts, s.started_at, s.finished_at, coalesce(s.error, '')`
	if job {
		return `SELECT ` + cols + ` FROM ` + schema + `.pgfence_slots s WHERE s.job OPERATOR(pg_catalog.=) $1
ORDER BY s.started_at DESC, s.slot DESC LIMIT $2`
	}
	return `SELECT ` + cols + `
FROM (SELECT p.*, pg_catalog.row_number() OVER (PARTITION BY p.job ORDER BY p.started_at DESC, p.slot DESC) AS n
      FROM ` + schema + `.pgfence_slots p) s
WHERE s.n OPERATOR(pg_catalog.<=) $1
ORDER BY s.job, s.started_at DESC, s.slot DESC`
}

// History returns the newest limit slots of job, or of every job when job
// is empty, by job and newest first.
func (r *Runner) History(ctx context.Context, job string, limit int) ([]Record, error) {
	return History(ctx, r.pool, r.locker.Schema(), job, limit)
}

// History is [Runner.History] for a reader without a Runner (pgfence ls):
// schema names pgfence's install.
func History(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, schema, job string, limit int) ([]Record, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("pgfence: schedule: history limit is %d; it must be positive", limit)
	}
	var (
		rows pgx.Rows
		err  error
	)
	if job != "" {
		rows, err = db.Query(ctx, historySQL(pgx.Identifier{schema}.Sanitize(), true), job, limit)
	} else {
		rows, err = db.Query(ctx, historySQL(pgx.Identifier{schema}.Sanitize(), false), limit)
	}
	if err != nil {
		return nil, fmt.Errorf("pgfence: schedule: history: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var rec Record
		var finished *time.Time
		err := row.Scan(&rec.Job, &rec.Slot, &rec.State, &rec.Owner, &rec.Token, &rec.Attempts, &rec.StartedAt, &finished, &rec.Error)
		if finished != nil {
			rec.FinishedAt = *finished
		}
		return rec, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgfence: schedule: history: %w", err)
	}
	return recs, nil
}

// Prune deletes the records of slots that finished more than olderThan
// (at least a day) ago, and returns how many. A slot asked for again after
// its record is gone runs again.
func (r *Runner) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	var n int64
	if err := r.pool.QueryRow(ctx, r.sql.prune, olderThan.Microseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgfence: schedule: prune: %w", err)
	}
	return n, nil
}
