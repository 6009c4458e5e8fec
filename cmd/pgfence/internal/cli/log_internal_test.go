package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSplitLogFormat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args   []string
		format string
		rest   []string
		err    string
	}{
		{[]string{"ls"}, logText, []string{"ls"}, ""},
		{[]string{"--log-format", "json", "ls"}, logJSON, []string{"ls"}, ""},
		{[]string{"ls", "--log-format=json", "--json"}, logJSON, []string{"ls", "--json"}, ""},
		{[]string{"ls", "-log-format", "text"}, logText, []string{"ls"}, ""},
		// After "--" the arguments are the command's, untouched.
		{[]string{"run", "job", "--", "tool", "--log-format", "json"}, logText, []string{"run", "job", "--", "tool", "--log-format", "json"}, ""},
		{[]string{"run", "--log-format", "json", "job", "--", "x"}, logJSON, []string{"run", "job", "--", "x"}, ""},
		{[]string{"ls", "--log-format", "yaml"}, "", nil, `--log-format must be text or json, not "yaml"`},
		{[]string{"ls", "--log-format"}, "", nil, "flag needs an argument: --log-format"},
		{[]string{"ls", "--log-formats=json"}, logText, []string{"ls", "--log-formats=json"}, ""},
	}
	for _, tt := range tests {
		format, rest, err := splitLogFormat(tt.args)
		if tt.err != "" {
			var uerr *usageError
			require.ErrorAs(t, err, &uerr, "%q", tt.args)
			require.EqualError(t, err, tt.err)
			continue
		}
		require.NoError(t, err, "%q", tt.args)
		require.Equal(t, tt.format, format, "%q", tt.args)
		require.Equal(t, tt.rest, rest, "%q", tt.args)
	}
}

// jsonLines decodes one JSON object a line.
func jsonLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "line %q", line)
		out = append(out, m)
	}
	return out
}

func TestLogFormats(t *testing.T) {
	t.Parallel()
	// The library's lines and the CLI's own share one format.
	var text, js bytes.Buffer
	at := &App{Stderr: &text, logFormat: logText, command: "run"}
	aj := &App{Stderr: &js, logFormat: logJSON, command: "run"}
	for _, a := range []*App{at, aj} {
		a.logger().Warn("pgfence: leasetable: lease lost", "lease", "job", "token", 7)
		a.logger().Info("not shown: below Warn")
		a.say(context.Background(), slog.LevelInfo, "not shown either")
		a.say(context.Background(), slog.LevelError, `lease "job" (token 7) was lost`, slog.String("lease", "job"))
	}
	require.Equal(t, "pgfence run: pgfence: leasetable: lease lost (lease=job token=7)\npgfence run: lease \"job\" (token 7) was lost\n", text.String())
	lines := jsonLines(t, js.String())
	require.Len(t, lines, 2)
	require.Equal(t, "WARN", lines[0]["level"])
	require.Equal(t, "run", lines[0]["command"])
	require.Equal(t, "pgfence: leasetable: lease lost", lines[0]["msg"])
	require.Equal(t, "job", lines[0]["lease"])
	require.EqualValues(t, 7, lines[0]["token"])
	require.NotEmpty(t, lines[0]["time"])
	require.Equal(t, "ERROR", lines[1]["level"])
	require.Equal(t, `lease "job" (token 7) was lost`, lines[1]["msg"])
	require.Equal(t, "job", lines[1]["lease"], "the CLI's fields are kept in JSON")
}

func TestRunLogFormatErrors(t *testing.T) {
	t.Parallel()
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		a := &App{Stdout: &out, Stderr: &errb, StdinIsTerminal: func() bool { return false }}
		return a.Run(context.Background(), args), errb.String()
	}
	// Text: as it always was.
	code, s := run("nope")
	require.Equal(t, ExitUsage, code)
	require.Equal(t, "pgfence: unknown command \"nope\"\nRun 'pgfence --help' for the list of commands.\n", s)
	code, s = run("run", "--ttl", "-1s", "job", "--", "true")
	require.Equal(t, ExitUsage, code)
	require.Equal(t, "pgfence run: --ttl must not be negative, not -1s\nRun 'pgfence run --help' for usage.\n", s)

	// JSON: one object for the error and its hint, before or after the
	// command name.
	for _, args := range [][]string{
		{"--log-format", "json", "run", "--ttl", "-1s", "job", "--", "true"},
		{"run", "--ttl", "-1s", "--log-format=json", "job", "--", "true"},
	} {
		code, s = run(args...)
		require.Equal(t, ExitUsage, code)
		lines := jsonLines(t, s)
		require.Len(t, lines, 1, s)
		require.Equal(t, "ERROR", lines[0]["level"])
		require.Equal(t, "run", lines[0]["command"])
		require.Equal(t, "--ttl must not be negative, not -1s", lines[0]["msg"])
		require.Equal(t, "Run 'pgfence run --help' for usage.", lines[0]["hint"])
		require.EqualValues(t, ExitUsage, lines[0]["exit_code"])
	}
	code, s = run("--log-format", "json", "nope")
	require.Equal(t, ExitUsage, code)
	require.Equal(t, `unknown command "nope"`, jsonLines(t, s)[0]["msg"])

	// A bad format is a usage error, in text.
	code, s = run("--log-format", "xml", "ls")
	require.Equal(t, ExitUsage, code)
	require.Equal(t, "pgfence: --log-format must be text or json, not \"xml\"\nRun 'pgfence --help' for usage.\n", s)
}
