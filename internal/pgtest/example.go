package pgtest

import (
	"fmt"
	"testing"
)

// exampleTB lets an Example function, which gets no *testing.T, use the
// harness: failures panic, and cleanups run when the example calls drop.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (e *exampleTB) Helper()                           {}
func (e *exampleTB) Name() string                      { return "example" }
func (e *exampleTB) Failed() bool                      { return false }
func (e *exampleTB) Cleanup(f func())                  { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Logf(format string, args ...any)   {}
func (e *exampleTB) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (e *exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// ExampleDB creates a migrated database for an Example function and returns
// it with a function that closes its pool and drops it. Failures panic.
func ExampleDB() (db *DB, drop func()) {
	tb := &exampleTB{}
	db = NewDB(tb)
	return db, func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	}
}
