package cli

// Exit codes of the pgfence command, all in this file. The general ones are
// printed by every --help (see exitCodesHelp) but run's, which prints its
// own table instead (see runHelp). Both lists are in the README.
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

// Exit codes of `pgfence doctor` beyond the general ones (ExitFailure: the
// checks could not run).
const (
	// ExitDoctorWarn: warnings, no failure.
	ExitDoctorWarn = 3
	// ExitDoctorFail: at least one check failed.
	ExitDoctorFail = 4
)

const exitCodesHelp = `Exit codes:
  0  success
  1  failure (database error, no such lease, confirmation declined); see the message
  2  usage error (bad flag or argument, no database given, --yes needed without a terminal)
`

// Exit codes of `pgfence run`. Any other status is the command's own: its
// exit code, or 128 plus the signal that ended it. The conflict code (lease
// held by another owner, with --no-wait or after --wait) is set with
// -E/--conflict-exit-code and defaults to ExitFailure, as flock(1)'s does.
const (
	// ExitLeaseLost: the lease was lost while the command ran (it expired
	// before it could be renewed, or an operator force-released it); the
	// command's process group was sent SIGTERM, then SIGKILL after a grace
	// period.
	ExitLeaseLost = 124
	// ExitRunFailure: pgfence run itself failed around the command: the
	// database was unreachable, or the lease could not be released.
	ExitRunFailure = 125
	// ExitCannotExecute: the command was found but could not be executed.
	ExitCannotExecute = 126
	// ExitNotFound: the command was not found.
	ExitNotFound = 127
)
