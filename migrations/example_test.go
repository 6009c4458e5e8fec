package migrations_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/pgfence/pgfence/migrations"
)

// Install pgfence's schema (into schema "pgfence"; a no-op when it is
// installed), give the application's role what it needs, and read the
// version back. Run it as the role that owns pgfence's objects.
func ExampleUp() {
	ctx := context.Background()
	target := migrations.Target{URL: os.Getenv("DATABASE_URL")}
	if err := migrations.Up(ctx, target, nil); err != nil {
		panic(err)
	}
	for _, stmt := range migrations.GrantSQL("pgfence", "app", nil) {
		fmt.Println(strings.Join(strings.Fields(stmt)[:2], " "), "...") // apply them as the owner: migrations.Grant
	}
	version, dirty, err := migrations.Version(ctx, target, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("latest:", version == migrations.Latest(), "dirty:", dirty)
	// Output:
	// GRANT USAGE ...
	// GRANT SELECT ...
	// GRANT EXECUTE ...
	// latest: true dirty: false
}
