package main

import (
	"os"

	"github.com/pgfence/pgfence/internal/cli"
)

func main() { os.Exit(cli.Main()) }
