package doctor_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/doctor"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// Check a database and act on its worst finding.
func Example() {
	db, drop := pgtest.ExampleDB()
	defer drop()
	cc, err := pgx.ParseConfig(db.URL)
	if err != nil {
		log.Fatal(err)
	}
	r, err := doctor.Check(context.Background(), cc, &doctor.Config{Schema: "pgfence"})
	if err != nil {
		log.Fatal(err) // could not connect
	}
	for _, f := range r.Findings {
		if f.Check == "standby" || f.Check == "schema" {
			fmt.Println(f.Check, f.Level)
		}
	}
	if r.Worst() == doctor.Fail {
		log.Fatal("pgfence's guarantees would not hold here")
	}
	// Output:
	// standby ok
	// schema ok
}
