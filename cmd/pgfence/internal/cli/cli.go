package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/supervise"
)

// App is one invocation of the pgfence command, with its standard streams.
type App struct {
	// Stdin is read for confirmations.
	Stdin io.Reader
	// Stdout receives results.
	Stdout io.Writer
	// Stderr receives diagnostics and prompts.
	Stderr io.Writer
	// StdinIsTerminal reports whether Stdin is an interactive terminal; a
	// destructive command asks for confirmation only on a terminal.
	StdinIsTerminal func() bool

	logFormat string       // --log-format: logText or logJSON
	command   string       // the running command's name, for the log
	log       *slog.Logger // see logger
}

// Main runs the pgfence command with the process's arguments and standard
// streams, and returns its exit code. The first SIGINT or SIGTERM cancels
// the command's database work; a second one ends the process.
func Main() int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			// After the first signal, the next one ends the process at once.
			signal.Stop(sigs)
			if sig, ok := s.(syscall.Signal); ok {
				cancel(&interruptedError{sig: sig})
			}
		case <-ctx.Done():
		}
	}()
	a := &App{
		Stdin:           os.Stdin,
		Stdout:          os.Stdout,
		Stderr:          os.Stderr,
		StdinIsTerminal: func() bool { return term.IsTerminal(int(os.Stdin.Fd())) },
	}
	return a.Run(ctx, os.Args[1:])
}

// interruptedError is the cause of Main's context when a signal ended it.
type interruptedError struct{ sig syscall.Signal }

func (e *interruptedError) Error() string { return "interrupted by " + signalName(e.sig) }

// interruptedStatus returns the exit status for a command that ctx's
// signal interrupted: 128+N for signal N, as a shell reports it; 130
// (SIGINT's) when the cause is not known.
func interruptedStatus(ctx context.Context) int {
	var ie *interruptedError
	if errors.As(context.Cause(ctx), &ie) {
		return 128 + int(ie.sig)
	}
	return 128 + int(syscall.SIGINT)
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(a *App, ctx context.Context, args []string) error
}

func commands() []command {
	return []command{
		{"demo", "watch a fenced write reject a paused lock holder (start here)", (*App).demo},
		{"run", "run a command while holding a lease (like flock, across machines)", (*App).run},
		{"ls", "list lease holders, advisory locks, or forced releases", (*App).ls},
		{"release", "force-release a lease, fencing out its holder (recorded)", (*App).release},
		{"prune", "delete lease rows that expired long ago", (*App).prune},
		{"migrate", "apply, revert or show pgfence's schema migrations", (*App).migrate},
		{"grant", "let a role use pgfence (as the owner)", (*App).grant},
		{"doctor", "check the database for what pgfence's guarantees need", (*App).doctor},
		{"version", "print pgfence's version", (*App).version},
	}
}

const mainHelp = `pgfence: distributed locks and fenced writes inside PostgreSQL.

Usage:
  pgfence <command> [flags] [arguments]
  pgfence help <command>

Commands:
%s
Database:
  Commands that use a database take --database URL, else $DATABASE_URL, else
  the standard libpq variables (PGHOST, PGPORT, PGDATABASE, PGUSER,
  PGPASSWORD, PGSSLMODE, PGSERVICE, ...). pgfence demo without --database
  or $DATABASE_URL starts a throwaway PostgreSQL of its own.

Schema:
  Every command takes --schema NAME (default pgfence), the schema pgfence is
  installed in; every statement names it.

Logging:
  --log-format text|json, before or after the command name, sets the format
  of every diagnostic on standard error, pgfence's own and the library's:
  "pgfence COMMAND: message" lines (text, the default) or one JSON object a
  line with time, level, msg, command and fields (json). Results on standard
  output keep their own format (see ls --json, prune --json).

%s
Run 'pgfence <command> --help' for a command's flags and examples.
`

func (a *App) mainHelp() string {
	var b strings.Builder
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(&b, "  %-9s %s\n", "help", "show help for a command")
	return fmt.Sprintf(mainHelp, b.String(), exitCodesHelp)
}

// Run runs the command line args (without the program name) and returns
// the exit code.
func (a *App) Run(ctx context.Context, args []string) int {
	format, args, err := splitLogFormat(args)
	if err != nil {
		a.logFormat = logText
		return a.exit("", err)
	}
	a.logFormat = format
	if len(args) == 0 {
		fmt.Fprint(a.Stderr, a.mainHelp())
		return ExitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help":
		fmt.Fprint(a.Stdout, a.mainHelp())
		return ExitOK
	case "--version":
		name = "version"
	case "help":
		if len(rest) == 0 {
			fmt.Fprint(a.Stdout, a.mainHelp())
			return ExitOK
		}
		name, rest = rest[0], []string{"--help"}
	}
	for _, c := range commands() {
		if c.name == name {
			a.command, a.log = name, nil
			return a.exit(name, c.run(a, ctx, rest))
		}
	}
	if name == runSupervisorCommand {
		return supervise.Serve(rest)
	}
	if name == demoWorkerCommand {
		a.command, a.log = name, nil
		return a.exit(name, a.demoWorker(ctx, rest))
	}
	a.sayUsage(ctx, fmt.Sprintf("unknown command %q", name), "Run 'pgfence --help' for the list of commands.")
	return ExitUsage
}

// errAborted is returned when the user declines a confirmation.
var errAborted = errors.New("aborted; nothing was changed")

// exit reports err on standard error, in the log format, and maps it to
// an exit code.
func (a *App) exit(name string, err error) int {
	var uerr *usageError
	var xerr *exitError
	ctx := context.Background()
	if a.command != name || a.log == nil {
		a.command, a.log = name, nil
	}
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.As(err, &xerr):
		if xerr.err != nil {
			a.say(ctx, slog.LevelError, xerr.err.Error(), slog.Int("exit_code", xerr.code))
		}
		return xerr.code
	case errors.As(err, &uerr):
		hint := "Run 'pgfence --help' for usage."
		if name != "" {
			hint = fmt.Sprintf("Run 'pgfence %s --help' for usage.", name)
		}
		a.sayUsage(ctx, err.Error(), hint)
		return ExitUsage
	default:
		a.say(ctx, slog.LevelError, err.Error(), slog.Int("exit_code", ExitFailure))
		return ExitFailure
	}
}

// sayUsage reports a usage error and the hint that follows it: on a line
// of its own in text, as the hint field in JSON.
func (a *App) sayUsage(ctx context.Context, msg, hint string) {
	if a.logFormat == logJSON {
		a.say(ctx, slog.LevelError, msg, slog.String("hint", hint), slog.Int("exit_code", ExitUsage))
		return
	}
	a.say(ctx, slog.LevelError, msg)
	fmt.Fprintln(a.Stderr, hint)
}

// parseOrHelp parses args with f; on --help it prints help (the command's
// text, then the flags and the exit codes) to standard output and returns
// flag.ErrHelp.
func (a *App) parseOrHelp(f *flags, help string, args []string) (positional, afterDash []string, err error) {
	positional, afterDash, err = f.parse(args)
	if errors.Is(err, flag.ErrHelp) {
		a.printHelp(f, help)
	}
	return positional, afterDash, err
}

// printHelp prints a command's help text, then its flags and the exit codes,
// to standard output.
func (a *App) printHelp(f *flags, help string) { a.printHelpCodes(f, help, exitCodesHelp) }

// printHelpCodes is printHelp with the exit codes given: empty for a
// command whose help text lists its own (one table, not two).
func (a *App) printHelpCodes(f *flags, help, codes string) {
	fmt.Fprintf(a.Stdout, "%s\n%s", strings.TrimSpace(help)+"\n", f.help())
	if codes != "" {
		fmt.Fprintf(a.Stdout, "\n%s", codes)
	}
}

const versionHelp = `
Usage:
  pgfence version

Prints the version of pgfence, and of Go, it was built with.
`

func (a *App) version(_ context.Context, args []string) error {
	f := newFlags("version")
	pos, _, err := a.parseOrHelp(f, versionHelp, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected argument %q", pos[0])
	}
	v, goVersion := "(unknown)", "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v, goVersion = bi.Main.Version, bi.GoVersion
	}
	fmt.Fprintf(a.Stdout, "pgfence %s (%s)\n", v, goVersion)
	return nil
}
