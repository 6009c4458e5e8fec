package main

import (
	"os"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
)

func main() { os.Exit(cli.Main()) }
