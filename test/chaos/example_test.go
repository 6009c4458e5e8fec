package chaos_test

import (
	"fmt"

	"github.com/pgfence/pgfence/test/chaos"
)

// Two holders overlap (the first one's lease lapsed while it paused); the
// guarded register fences the stale write, and the history checks out.
func ExampleCheck() {
	rec := chaos.NewRecorder()
	record := func(op chaos.Op, outcome chaos.Outcome) {
		rec.Invoke(op).Complete(outcome, nil)
	}
	record(chaos.Op{Process: 0, Kind: chaos.Acquire, Name: "r", Token: 1}, chaos.Ok)
	record(chaos.Op{Process: 0, Kind: chaos.Read, Token: 1, Value: 0, RowToken: 1}, chaos.Ok)
	record(chaos.Op{Process: 1, Kind: chaos.Acquire, Name: "r", Token: 2}, chaos.Ok)
	record(chaos.Op{Process: 1, Kind: chaos.Read, Token: 2, Value: 0, RowToken: 2}, chaos.Ok)
	record(chaos.Op{Process: 1, Kind: chaos.Write, Token: 2, Value: 1}, chaos.Ok)
	record(chaos.Op{Process: 0, Kind: chaos.Write, Token: 1, Value: 1, Fenced: true}, chaos.Fail)

	final := int64(1)
	r, err := chaos.Check(rec.History(), &chaos.CheckOpts{Name: "example", Final: &final, Claim: true})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Summary())
	// Output: chaos: scenario=example ops=6 verdict=linearizable
}
