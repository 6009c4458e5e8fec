package cli

import (
	"errors"
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFlagsParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args      []string
		pos, dash []string
		yes       bool
		db        string
		wait      time.Duration
	}{
		{args: nil},
		{args: []string{"name"}, pos: []string{"name"}},
		{args: []string{"-y", "name"}, pos: []string{"name"}, yes: true},
		{args: []string{"name", "--yes"}, pos: []string{"name"}, yes: true},
		{args: []string{"a", "-d", "postgres://h/db", "b"}, pos: []string{"a", "b"}, db: "postgres://h/db"},
		{args: []string{"--database=x", "name", "-w", "2s"}, pos: []string{"name"}, db: "x", wait: 2 * time.Second},
		{args: []string{"name", "--", "sh", "-c", "exit 3", "-y"}, pos: []string{"name"}, dash: []string{"sh", "-c", "exit 3", "-y"}},
		{args: []string{"-y", "--", "-name"}, yes: true, dash: []string{"-name"}},
	}
	for _, tt := range tests {
		var yes bool
		var db string
		var wait time.Duration
		f := newFlags("test")
		f.Bool(&yes, "y", "yes", "")
		f.String(&db, "d", "database", "URL", "")
		f.Duration(&wait, "w", "wait", "")
		pos, dash, err := f.parse(tt.args)
		require.NoError(t, err, tt.args)
		require.Equal(t, tt.pos, pos, tt.args)
		require.Equal(t, tt.dash, dash, tt.args)
		require.Equal(t, tt.yes, yes, tt.args)
		require.Equal(t, tt.db, db, tt.args)
		require.Equal(t, tt.wait, wait, tt.args)
	}
}

func TestFlagsParseErrors(t *testing.T) {
	t.Parallel()
	var wait time.Duration
	f := newFlags("test")
	f.Duration(&wait, "w", "wait", "")
	_, _, err := f.parse([]string{"--help"})
	require.ErrorIs(t, err, flag.ErrHelp)
	_, _, err = f.parse([]string{"name", "-h"})
	require.ErrorIs(t, err, flag.ErrHelp)
	_, _, err = f.parse([]string{"-w", "soon"})
	var uerr *usageError
	require.True(t, errors.As(err, &uerr))
	_, _, err = f.parse([]string{"--nope"})
	require.True(t, errors.As(err, &uerr))
}

func TestFlagsHelp(t *testing.T) {
	t.Parallel()
	var yes bool
	var db string
	wait := 5 * time.Second
	f := newFlags("test")
	f.Bool(&yes, "y", "yes", "do not ask")
	f.String(&db, "", "database", "URL", "where")
	f.Duration(&wait, "w", "wait", "how long")
	require.Equal(t, `Flags:
  -y, --yes                do not ask
      --database URL       where
  -w, --wait DURATION      how long (default 5s)
      --log-format FORMAT  `+logFormatUsage+` (default text)
  -h, --help               show this help
`, f.help())
}

func TestSeconds(t *testing.T) {
	t.Parallel()
	tests := map[float64]string{
		0:       "0s",
		4.24:    "4.2s",
		59.94:   "59.9s",
		192.4:   "3m12s",
		7205.49: "2h0m5s",
	}
	for in, want := range tests {
		require.Equal(t, want, seconds(in), in)
	}
}

func TestQuoteKV(t *testing.T) {
	t.Parallel()
	require.Equal(t, `'pgfence'`, quoteKV("pgfence"))
	require.Equal(t, `'it\'s a \\ path'`, quoteKV(`it's a \ path`))
}

// TestConnConfig: connConfig and poolConfig fill in connectTimeout and the
// application name only where the connection string sets neither, and a bad
// string is a usage error. Not parallel: pgx reads the PG* variables, which
// it clears.
func TestConnConfig(t *testing.T) {
	t.Setenv("PGAPPNAME", "")
	t.Setenv("PGCONNECT_TIMEOUT", "")
	cc, err := connConfig("postgres://u@h/db", "pgfence-doctor")
	require.NoError(t, err)
	require.Equal(t, connectTimeout, cc.ConnectTimeout)
	require.Equal(t, "pgfence-doctor", cc.RuntimeParams["application_name"])

	cc, err = connConfig("postgres://u@h/db?connect_timeout=3&application_name=mine", "pgfence-doctor")
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, cc.ConnectTimeout)
	require.Equal(t, "mine", cc.RuntimeParams["application_name"])

	cc, err = connConfig("postgres://u@h/db", "")
	require.NoError(t, err)
	_, named := cc.RuntimeParams["application_name"]
	require.False(t, named, "no app: no application_name")

	pc, err := poolConfig("postgres://u@h/db", "pgfence ls", 3)
	require.NoError(t, err)
	require.Equal(t, connectTimeout, pc.ConnConfig.ConnectTimeout)
	require.Equal(t, "pgfence ls", pc.ConnConfig.RuntimeParams["application_name"])
	require.EqualValues(t, 3, pc.MaxConns)

	var uerr *usageError
	_, err = connConfig("postgres://x:notaport/db", "")
	require.True(t, errors.As(err, &uerr), err)
	require.ErrorContains(t, err, "invalid database: ")
	_, err = poolConfig("postgres://x:notaport/db", "pgfence ls", 3)
	require.True(t, errors.As(err, &uerr), err)
}
