package leasetable_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// exampleTB lets example functions, which get no *testing.T, use the
// harness: failures panic, and cleanups run when the example calls done.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (e *exampleTB) Helper()                   {}
func (e *exampleTB) Name() string              { return "example" }
func (e *exampleTB) Failed() bool              { return false }
func (e *exampleTB) Logf(string, ...any)       {}
func (e *exampleTB) Cleanup(f func())          { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (e *exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (e *exampleTB) Errorf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

func (e *exampleTB) done() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

// exampleDB returns a pool on a fresh migrated database for an example, and
// a function that drops it.
func exampleDB() (*pgxpool.Pool, func()) {
	tb := &exampleTB{}
	db := pgtest.NewDB(tb)
	return db.Pool, tb.done
}
