package cli

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Log formats of --log-format: the diagnostics pgfence writes to standard
// error, its own and the library's, are all in one of them.
const (
	// logText is "pgfence COMMAND: MESSAGE" lines; the library's lines add
	// their attributes in slog's text form in parentheses.
	logText = "text"
	// logJSON is one JSON object a line (slog's JSON handler): time, level,
	// msg, command and the attributes.
	logJSON = "json"
)

// logFormatFlag is the global flag that chooses the log format.
const logFormatFlag = "log-format"

const logFormatUsage = "diagnostics on standard error as text lines or JSON objects, pgfence's and the library's alike: text|json"

// splitLogFormat takes --log-format FORMAT (or --log-format=FORMAT, or
// one dash) out of args, before a "--" only, wherever it is: it is a
// global flag, given before or after the command name. It returns the
// format ("text" when not given) and the other arguments.
func splitLogFormat(args []string) (format string, rest []string, err error) {
	format = logText
	rest = make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") || name != logFormatFlag {
			rest = append(rest, arg)
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return "", nil, usageErrorf("flag needs an argument: --%s", logFormatFlag)
			}
			i++
			value = args[i]
		}
		if value != logText && value != logJSON {
			return "", nil, usageErrorf("--%s must be text or json, not %q", logFormatFlag, value)
		}
		format = value
	}
	return format, rest, nil
}

// newLogger returns the logger of command: Warn and above, in format, to
// w. The library's Lockers log to it, and so does [App.say].
func newLogger(w io.Writer, format, command string) *slog.Logger {
	if format == logJSON {
		h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})
		if command == "" {
			return slog.New(h)
		}
		return slog.New(h).With("command", command)
	}
	prefix := "pgfence: "
	if command != "" {
		prefix = "pgfence " + command + ": "
	}
	return slog.New(&lineHandler{w: w, prefix: prefix, mu: &sync.Mutex{}})
}

// logger returns the logger of the running command.
func (a *App) logger() *slog.Logger {
	if a.log == nil {
		a.log = newLogger(a.Stderr, a.logFormat, a.command)
	}
	return a.log
}

// say writes one of pgfence's own diagnostics. In text, the message is
// the line (it says everything in words) and attrs are left out; in JSON
// they are fields, for machines.
func (a *App) say(ctx context.Context, level slog.Level, msg string, attrs ...slog.Attr) {
	if a.logFormat != logJSON {
		attrs = nil
	}
	a.logger().LogAttrs(ctx, level, msg, attrs...)
}

// lineHandler is a slog.Handler writing "PREFIX MESSAGE (ATTRS)" lines for
// warnings and errors; ATTRS are in slog's text form.
type lineHandler struct {
	w      io.Writer
	prefix string
	attrs  []slog.Attr
	group  string
	mu     *sync.Mutex
}

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	var attrs strings.Builder
	th := slog.NewTextHandler(&attrs, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey || a.Key == slog.MessageKey) {
			return slog.Attr{}
		}
		return a
	}})
	var hh slog.Handler = th.WithAttrs(h.attrs)
	if h.group != "" {
		hh = hh.WithGroup(h.group)
	}
	rec := slog.NewRecord(time.Time{}, r.Level, "", 0)
	r.Attrs(func(a slog.Attr) bool { rec.AddAttrs(a); return true })
	if err := hh.Handle(context.Background(), rec); err != nil {
		return err
	}
	line := h.prefix + r.Message
	if a := strings.TrimSpace(attrs.String()); a != "" {
		line += " (" + a + ")"
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, line+"\n")
	return err
}

func (h *lineHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr{}, h.attrs...), attrs...)
	return &c
}

func (h *lineHandler) WithGroup(name string) slog.Handler {
	c := *h
	if c.group != "" {
		name = c.group + "." + name
	}
	c.group = name
	return &c
}
