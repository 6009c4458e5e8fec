// Command pgfence inspects and releases pgfence locks and manages pgfence's
// schema. Run 'pgfence --help' for the commands.
package main

import (
	"os"

	"github.com/pgfence/pgfence/internal/cli"
)

func main() { os.Exit(cli.Main()) }
