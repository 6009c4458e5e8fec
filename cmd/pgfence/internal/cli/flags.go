package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// usageError is a mistake on the command line: it exits with ExitUsage and
// points at --help.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitError ends a command with a chosen exit code. A non-nil err is
// printed first; a nil err exits silently (what there was to say has been
// said, or the code is a supervised command's own status).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// exitWith returns an error that makes the command exit with code after
// printing err (if not nil).
func exitWith(code int, err error) error { return &exitError{code: code, err: err} }

// flagSpec describes one flag for the help text.
type flagSpec struct {
	short, long, arg, usage, def string
}

// flags is a flag.FlagSet whose flags have a long and an optional short
// name, and which can print them as a help section.
type flags struct {
	fs    *flag.FlagSet
	specs []flagSpec
}

func newFlags(name string) *flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flags{fs: fs}
}

func (f *flags) add(short, long, arg, usage, def string) {
	f.specs = append(f.specs, flagSpec{short: short, long: long, arg: arg, usage: usage, def: def})
}

// Bool defines a boolean flag.
func (f *flags) Bool(p *bool, short, long, usage string) {
	f.fs.BoolVar(p, long, false, usage)
	if short != "" {
		f.fs.BoolVar(p, short, false, usage)
	}
	f.add(short, long, "", usage, "")
}

// String defines a string flag; arg names its value in the help text.
func (f *flags) String(p *string, short, long, arg, usage string) {
	f.fs.StringVar(p, long, *p, usage)
	if short != "" {
		f.fs.StringVar(p, short, *p, usage)
	}
	f.add(short, long, arg, usage, *p)
}

// durationValue is a time.Duration flag whose parse error says what a
// duration looks like: "10" or "1d" are common mistakes.
type durationValue struct{ p *time.Duration }

func (d durationValue) String() string {
	if d.p == nil {
		return ""
	}
	return d.p.String()
}

func (d durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("not a duration: use a Go duration such as 10s, 90m or 24h (units ns, us, ms, s, m, h; no d)")
	}
	*d.p = v
	return nil
}

// Duration defines a duration flag.
func (f *flags) Duration(p *time.Duration, short, long, usage string) {
	f.fs.Var(durationValue{p}, long, usage)
	if short != "" {
		f.fs.Var(durationValue{p}, short, usage)
	}
	def := ""
	if *p != 0 {
		def = p.String()
	}
	f.add(short, long, "DURATION", usage, def)
}

// help returns the flags as a help section.
func (f *flags) help() string {
	var b strings.Builder
	b.WriteString("Flags:\n")
	names := make([]string, len(f.specs))
	width := 0
	for i, s := range f.specs {
		n := "    --" + s.long
		if s.short != "" {
			n = "-" + s.short + ", --" + s.long
		}
		if s.arg != "" {
			n += " " + s.arg
		}
		names[i] = n
		width = max(width, len(n))
	}
	// --log-format is global (splitLogFormat), listed with every command.
	logName := "    --" + logFormatFlag + " FORMAT"
	width = max(width, len(logName))
	for i, s := range f.specs {
		u := s.usage
		if s.def != "" {
			u += " (default " + s.def + ")"
		}
		fmt.Fprintf(&b, "  %-*s  %s\n", width, names[i], u)
	}
	fmt.Fprintf(&b, "  %-*s  %s (default %s)\n", width, logName, logFormatUsage, logText)
	fmt.Fprintf(&b, "  %-*s  %s\n", width, "-h, --help", "show this help")
	return b.String()
}

// set reports whether the flag named short or long was given.
func (f *flags) set(short, long string) bool {
	found := false
	f.fs.Visit(func(fl *flag.Flag) {
		if fl.Name == long || (short != "" && fl.Name == short) {
			found = true
		}
	})
	return found
}

// parse parses args, allowing flags after positional arguments. It returns
// the positional arguments before a "--" and those after it. flag.ErrHelp is
// returned as is; other errors are usage errors.
func (f *flags) parse(args []string) (positional, afterDash []string, err error) {
	for {
		if err := f.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, err
			}
			return nil, nil, &usageError{msg: err.Error()}
		}
		rest := f.fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return positional, rest, nil
		}
		if len(rest) == 0 {
			return positional, nil, nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
