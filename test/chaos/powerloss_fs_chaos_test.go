//go:build chaos && linux

package chaos_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pgfence/pgfence/test/chaos"
)

func mountPowerLoss(t *testing.T) (*chaos.PowerLossFS, string) {
	t.Helper()
	require.NoError(t, chaos.CheckPowerLoss())
	mnt := t.TempDir()
	p, err := chaos.MountPowerLoss(t.TempDir(), mnt)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Unmount()) })
	return p, mnt
}

func writeAt(t *testing.T, f *os.File, s string, off int64) {
	t.Helper()
	_, err := f.WriteAt([]byte(s), off)
	require.NoError(t, err)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// The filesystem keeps what was fsynced and drops the rest on a cut: file
// data written since the file's last fsync (or fdatasync, through any of its
// descriptors), growth, truncation (O_TRUNC too) and punched holes; O_DSYNC
// writes are durable at once.
// Before the cut every write is visible, so the cut alone loses them.
func TestPowerLossFSDropsUnsyncedWrites(t *testing.T) {
	p, mnt := mountPowerLoss(t)
	path := func(n string) string { return filepath.Join(mnt, n) }
	open := func(n string, flag int) *os.File {
		f, err := os.OpenFile(path(n), os.O_RDWR|os.O_CREATE|flag, 0o600)
		require.NoError(t, err)
		t.Cleanup(func() { _ = f.Close() })
		return f
	}

	a := open("a", 0) // synced, then overwritten and grown
	writeAt(t, a, "durable", 0)
	require.NoError(t, a.Sync())
	writeAt(t, a, "XX", 2)
	writeAt(t, a, "-tail", 7)

	b := open("b", 0) // never synced
	writeAt(t, b, "lost", 0)

	c := open("c", 0) // synced, then truncated
	writeAt(t, c, "keep me", 0)
	require.NoError(t, c.Sync())
	require.NoError(t, c.Truncate(2))

	d := open("d", syscall.O_DSYNC) // every write durable
	writeAt(t, d, "dsync", 0)

	e1 := open("e", 0) // written through two descriptors, synced through one
	e2 := open("e", 0)
	writeAt(t, e1, "one", 0)
	writeAt(t, e2, "two", 3)
	require.NoError(t, syscall.Fdatasync(int(e1.Fd())))

	f := open("f", 0) // synced, renamed, written again
	writeAt(t, f, "renamed", 0)
	require.NoError(t, f.Sync())
	require.NoError(t, os.Rename(path("f"), path("g")))
	writeAt(t, f, "!", 7)

	h := open("h", 0) // synced, then reopened with O_TRUNC and rewritten
	writeAt(t, h, "before", 0)
	require.NoError(t, h.Sync())
	h2 := open("h", os.O_TRUNC)
	writeAt(t, h2, "x", 0)

	k := open("k", 0) // synced, then a hole punched in it
	writeAt(t, k, "punch me", 0)
	require.NoError(t, k.Sync())
	require.NoError(t, unix.Fallocate(int(k.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 5))

	require.Equal(t, "x", readFile(t, path("h")))
	require.Equal(t, "\x00\x00\x00\x00\x00 me", readFile(t, path("k")))
	require.Equal(t, "duXXble-tail", readFile(t, path("a")))
	require.Equal(t, "lost", readFile(t, path("b")))
	require.Equal(t, "ke", readFile(t, path("c")))
	require.Equal(t, "renamed!", readFile(t, path("g")))

	for _, f := range []*os.File{a, b, c, d, e1, e2, f, h, h2, k} {
		require.NoError(t, f.Close())
	}
	st, err := p.PowerCut()
	require.NoError(t, err)
	t.Logf("power cut: %d files, %d bytes dropped", st.Files, st.Bytes)

	require.Equal(t, "durable", readFile(t, path("a")))
	require.Equal(t, "", readFile(t, path("b")), "a file never synced keeps its name but not its data")
	require.Equal(t, "keep me", readFile(t, path("c")))
	require.Equal(t, "dsync", readFile(t, path("d")))
	require.Equal(t, "onetwo", readFile(t, path("e")))
	require.Equal(t, "renamed", readFile(t, path("g")))
	require.Equal(t, "before", readFile(t, path("h")))
	require.Equal(t, "punch me", readFile(t, path("k")))
	require.Equal(t, 6, st.Files)
}
