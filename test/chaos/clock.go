package chaos

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// libfaketimePaths are where Debian's libfaketime package puts the library.
var libfaketimePaths = []string{
	"/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
	"/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
	"/usr/lib/faketime/libfaketime.so.1",
}

// FindLibfaketime returns the path of libfaketime.so.1, from
// PGFENCE_LIBFAKETIME or the usual install locations.
func FindLibfaketime() (string, error) {
	cands := libfaketimePaths
	if p := os.Getenv("PGFENCE_LIBFAKETIME"); p != "" {
		cands = []string{p}
	}
	for _, p := range cands {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", errors.New("chaos: libfaketime not found (apt-get install libfaketime, or set PGFENCE_LIBFAKETIME)")
}

// FakeClock moves the clock of processes started with its [FakeClock.Env]
// (a PostgreSQL server, through pgtest.ClusterOptions.Env) at run time:
// libfaketime reads the offset from a file on every clock call. Only the
// wall clock moves; the monotonic clock (which PostgreSQL uses for
// timeouts and durations) is left alone.
type FakeClock struct {
	lib  string
	dir  string
	path string
}

// NewFakeClock creates the offset file, at offset zero, in a new temporary
// directory readable by every user (the server runs as postgres). Close
// removes it.
func NewFakeClock() (*FakeClock, error) {
	lib, err := FindLibfaketime()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgfence-faketime-*")
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("chaos: %w", err)
	}
	f := &FakeClock{lib: lib, dir: dir, path: filepath.Join(dir, "offset")}
	if err := f.Set(0); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return f, nil
}

// Env returns the environment that puts a process under this clock.
func (f *FakeClock) Env() []string {
	return []string{
		"LD_PRELOAD=" + f.lib,
		"FAKETIME_TIMESTAMP_FILE=" + f.path,
		"FAKETIME_NO_CACHE=1",
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
	}
}

// Set moves the faked clock to real time plus offset (which may be
// negative), taking effect at the processes' next clock call.
func (f *FakeClock) Set(offset time.Duration) error {
	secs := offset.Seconds()
	spec := strconv.FormatFloat(secs, 'f', 3, 64)
	if secs >= 0 {
		spec = "+" + spec
	}
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(spec+"\n"), 0o644); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	return nil
}

// Close removes the offset file and its directory.
func (f *FakeClock) Close() error { return os.RemoveAll(f.dir) }
