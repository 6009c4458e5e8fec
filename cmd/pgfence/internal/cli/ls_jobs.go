package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/schedule"
)

// defaultJobsLimit is how many slots of each job ls --jobs shows.
const defaultJobsLimit = 10

// slotJSON is one slot of ls --jobs --json.
type slotJSON struct {
	Job             string     `json:"job"`
	Slot            string     `json:"slot"`
	State           string     `json:"state"`
	Owner           string     `json:"owner"`
	Token           int64      `json:"token"`
	Attempts        int        `json:"attempts"`
	StartedAt       time.Time  `json:"started_at"`
	FinishedAt      *time.Time `json:"finished_at"`
	DurationSeconds *float64   `json:"duration_seconds"`
	Error           string     `json:"error,omitempty"`
}

// lsJobs is ls --jobs: the newest limit slots of each job.
func (a *App) lsJobs(ctx context.Context, pool *pgxpool.Pool, schema string, limit int, asJSON bool) error {
	recs, err := schedule.History(ctx, pool, schema, "", limit)
	if err != nil {
		return fmt.Errorf("list job slots: %w", explainSchemaError(err, schema))
	}
	out := struct {
		Slots []slotJSON `json:"slots"`
	}{Slots: []slotJSON{}}
	for _, r := range recs {
		s := slotJSON{Job: r.Job, Slot: r.Slot, State: r.State, Owner: r.Owner, Token: r.Token, Attempts: r.Attempts,
			StartedAt: jsonTime(r.StartedAt), Error: r.Error}
		if !r.FinishedAt.IsZero() {
			f, d := jsonTime(r.FinishedAt), r.FinishedAt.Sub(r.StartedAt).Seconds()
			s.FinishedAt, s.DurationSeconds = &f, &d
		}
		out.Slots = append(out.Slots, s)
	}
	if asJSON {
		enc := json.NewEncoder(a.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
	if len(out.Slots) == 0 {
		fmt.Fprintln(tw, "No job slot was run.")
		return tw.Flush()
	}
	fmt.Fprintln(tw, "JOB\tSLOT\tSTATE\tOWNER\tTOKEN\tATTEMPTS\tSTARTED AT\tDURATION\tERROR")
	for _, s := range out.Slots {
		took := "-"
		if s.DurationSeconds != nil {
			took = seconds(*s.DurationSeconds)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", display(s.Job), display(s.Slot), s.State, display(s.Owner),
			s.Token, s.Attempts, s.StartedAt.Local().Format(time.RFC3339), took, display(s.Error))
	}
	return tw.Flush()
}
