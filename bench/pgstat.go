package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// tableStat is the size and update statistics of a lock table.
type tableStat struct {
	Table      string
	HeapBytes  int64
	IndexBytes int64
	Inserts    int64
	Updates    int64
	HotUpdates int64
	Deletes    int64
	LiveTuples int64
	DeadTuples int64
	Vacuums    int64 // manual + auto vacuums since the counters were reset
}

// readTableStat reads the size and pg_stat_user_tables counters of table.
const readTableStat = `SELECT pg_relation_size(s.relid), pg_indexes_size(s.relid),
       s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del, s.n_live_tup, s.n_dead_tup,
       s.vacuum_count + s.autovacuum_count
FROM pg_stat_user_tables s WHERE s.relid = $1::regclass`

// resetTableStat zeroes the table's statistics counters.
const resetTableStat = `SELECT pg_stat_reset_single_table_counters($1::regclass)`

// otherBackends counts client sessions on this database other than ours.
const otherBackends = `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`

func withConn(ctx context.Context, url string, f func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
}

func resetStats(ctx context.Context, url, table string) error {
	return withConn(ctx, url, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, resetTableStat, table)
		return err
	})
}

// statsAfterClose waits until the system's sessions have exited (a backend
// flushes its statistics when it exits), then reads the table's figures.
func statsAfterClose(ctx context.Context, url, table string) (tableStat, error) {
	st := tableStat{Table: table}
	err := withConn(ctx, url, func(c *pgx.Conn) error {
		deadline := time.Now().Add(10 * time.Second)
		for {
			var n int
			if err := c.QueryRow(ctx, otherBackends).Scan(&n); err != nil {
				return err
			}
			if n == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		// A fresh transaction sees the flushed counters.
		return c.QueryRow(ctx, readTableStat, table).Scan(&st.HeapBytes, &st.IndexBytes, &st.Inserts,
			&st.Updates, &st.HotUpdates, &st.Deletes, &st.LiveTuples, &st.DeadTuples, &st.Vacuums)
	})
	if err != nil {
		return st, fmt.Errorf("read statistics of %s: %w", table, err)
	}
	return st, nil
}

// analyze refreshes the planner statistics of table (an SQL name, as
// harness.Storage.Tables gives it) after a bulk fill.
func analyze(ctx context.Context, url, table string) error {
	return withConn(ctx, url, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, "ANALYZE "+table)
		return err
	})
}
