package cli

// Exit codes of the pgfence command. They are printed by every --help (see
// exitCodesHelp) and documented in the README.
const (
	// ExitOK: the command did what was asked.
	ExitOK = 0
	// ExitFailure: the command failed: the database could not be reached
	// or returned an error, the lease does not exist, or a confirmation
	// was declined. Nothing was changed unless the message says otherwise.
	ExitFailure = 1
	// ExitUsage: the command line was wrong (unknown command or flag,
	// missing argument, no database given), or a destructive command needs
	// --yes because standard input is not a terminal. Nothing was changed.
	ExitUsage = 2
)

const exitCodesHelp = `Exit codes:
  0  success
  1  failure (database error, no such lease, confirmation declined); see the message
  2  usage error (bad flag or argument, no database given, --yes needed without a terminal)
`
