package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestQuickstartRuns runs the program on a fresh database, twice: the
// second run finds pgfence installed and the table there.
func TestQuickstartRuns(t *testing.T) {
	db := pgtest.NewDB(t)
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), db.URL, &out))
	require.Regexp(t, `^stale write rejected \(pgfence.ErrFenced: true\): presented token (\d+), row has (\d+)\nbalance: 130\n$`, out.String())
	require.Equal(t, readmeOutput(t), out.String(), "README shows what a first run prints")
	out.Reset()
	require.NoError(t, run(t.Context(), db.URL, &out))
	require.Contains(t, out.String(), "balance: 160")
}

// TestReadmeQuickStartIsThisProgram: README's Quick start is this file,
// verbatim, so the README's first program compiles and runs as written.
func TestReadmeQuickStartIsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)## Quick start\n.*?```go\n(.*?)```").FindSubmatch(readme)
	require.NotNil(t, m, "README has a Quick start with a go block")
	require.Equal(t, strings.TrimSpace(string(src)), strings.TrimSpace(string(m[1])),
		"README's Quick start must be examples/quickstart/main.go verbatim")
}

// readmeOutput is the output README.md shows under the quick start's run
// command (its "# " lines).
func readmeOutput(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("go run ./examples/quickstart\n((?:# .*\n)+)").FindSubmatch(readme)
	require.NotNil(t, m, "README shows the quick start's output")
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(string(m[1])), "\n") {
		b.WriteString(strings.TrimPrefix(l, "# ") + "\n")
	}
	return b.String()
}
