package supervise

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseStatus(t *testing.T) {
	t.Parallel()
	e, err := parseStatus("job", "exit 3 0")
	require.NoError(t, err)
	require.Equal(t, Exit{Code: 3}, e)
	e, err = parseStatus("job", "exit -1 9")
	require.NoError(t, err)
	require.Equal(t, Exit{Code: -1, Signal: syscall.SIGKILL}, e)
	_, err = parseStatus("job", "notfound job: no such file")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = parseStatus("job", "notexec job: permission denied")
	require.ErrorIs(t, err, ErrNotExecutable)
	_, err = parseStatus("job", "exit x")
	require.Error(t, err)
	_, err = parseStatus("job", "error cannot become a child subreaper")
	require.ErrorContains(t, err, "cannot become a child subreaper")
}
