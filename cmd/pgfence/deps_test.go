package main_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// testOnly are the import paths (or path prefixes, ending in "/") that must
// not reach the pgfence binary.
var testOnly = []string{
	"testing",
	"github.com/stretchr/testify/",
	"go.uber.org/goleak",
	"github.com/testcontainers/",
	"github.com/pgfence/pgfence/internal/pgtest",
}

// linkedTestCode returns the test-only packages pkg links.
func linkedTestCode(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	require.NoError(t, err)
	var found []string
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range testOnly {
			if dep == bad || dep == strings.TrimSuffix(bad, "/") || (strings.HasSuffix(bad, "/") && strings.HasPrefix(dep, bad)) {
				found = append(found, dep)
			}
		}
	}
	return found
}

// The pgfence binary links no test code: not package testing, testify,
// goleak, testcontainers, nor the test harness internal/pgtest.
func TestBinaryLinksNoTestCode(t *testing.T) {
	t.Parallel()
	require.Empty(t, linkedTestCode(t, "github.com/pgfence/pgfence/cmd/pgfence"))
}

// Negative control: the check finds test code where there is some.
func TestLinkedTestCodeFindsTheHarness(t *testing.T) {
	t.Parallel()
	found := linkedTestCode(t, "github.com/pgfence/pgfence/internal/pgtest")
	require.Contains(t, found, "testing")
	require.Contains(t, found, "go.uber.org/goleak")
	require.Contains(t, found, "github.com/pgfence/pgfence/internal/pgtest")
}
