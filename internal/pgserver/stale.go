package pgserver

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// DirPrefix starts the name of every cluster directory, in os.TempDir().
const DirPrefix = "pgfence-pgserver-"

// markerFile is written into every cluster directory, as this process's
// user, before the directory is handed to the server's user. It says who
// created the directory:
//
//	pgfence-pgserver 1
//	id 5f0c...      (random)
//	owner 1234      (the creating process)
const markerFile = "pgfence-pgserver.marker"

const markerMagic = "pgfence-pgserver 1"

// makeDir creates a cluster directory in parent: mode 0700, with the
// marker, then owned by the server's user.
func makeDir(parent string, cred *syscall.Credential) (string, error) {
	dir, err := os.MkdirTemp(parent, DirPrefix+"*")
	if err != nil {
		return "", fmt.Errorf("pgserver: %w", err)
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("pgserver: %w", err)
	}
	marker := fmt.Sprintf("%s\nid %s\nowner %d\n", markerMagic, hex.EncodeToString(id[:]), os.Getpid())
	if err := os.WriteFile(filepath.Join(dir, markerFile), []byte(marker), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("pgserver: %w", err)
	}
	// MkdirTemp creates 0700 already; umask cannot widen it, but be exact.
	if err := os.Chmod(dir, 0o700); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("pgserver: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("pgserver: chown %s: %w", dir, err)
		}
	}
	return dir, nil
}

// removeStaleDirs removes, from tmpDir, the cluster directories that
// earlier processes left behind (killed before they could clean up; their
// servers died with them through the parent-death signal). It signals no
// process. It removes a directory only when staleDir says it may.
func removeStaleDirs(tmpDir string) {
	cred, err := serverCredential()
	if err != nil {
		return
	}
	dirs, _ := filepath.Glob(filepath.Join(tmpDir, DirPrefix+"*"))
	for _, d := range dirs {
		if staleDir(d, serverUID(cred)) == nil {
			_ = os.RemoveAll(d)
		}
	}
}

// staleDir returns nil when dir is a cluster directory this package made
// that may be removed, else why not. It may be removed only when all hold:
//
//   - dir is a directory, not a symbolic link, with mode 0700, owned by
//     serverUID (the user the server runs as);
//   - it holds the marker file: a regular file with one link, mode 0600,
//     owned by this process's user, in the marker's format;
//   - the process that created it (named in the marker) has exited;
//   - no live process is named in data/postmaster.pid (a server still
//     running there is left alone, whoever's it is).
func staleDir(dir string, serverUID int) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return errors.New("not a directory")
	}
	if st.Mode().Perm() != 0o700 {
		return fmt.Errorf("mode %v, not 0700", st.Mode().Perm())
	}
	if uid := int(st.Sys().(*syscall.Stat_t).Uid); uid != serverUID {
		return fmt.Errorf("owned by uid %d, not %d", uid, serverUID)
	}
	owner, err := readMarker(filepath.Join(dir, markerFile))
	if err != nil {
		return err
	}
	if alive(owner) {
		return fmt.Errorf("its creator, pid %d, is still running", owner)
	}
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return fmt.Errorf("unreadable postmaster.pid %q", first)
	}
	if alive(pid) {
		return fmt.Errorf("postmaster.pid names pid %d, which is running", pid)
	}
	return nil
}

// readMarker checks the marker file and returns the creator's pid.
func readMarker(path string) (int, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return 0, err
	}
	sys := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.Mode().IsRegular():
		return 0, errors.New("marker is not a regular file")
	case st.Mode().Perm() != 0o600:
		return 0, fmt.Errorf("marker has mode %v, not 0600", st.Mode().Perm())
	case int(sys.Uid) != os.Geteuid():
		return 0, fmt.Errorf("marker owned by uid %d, not %d", sys.Uid, os.Geteuid())
	case sys.Nlink != 1:
		return 0, errors.New("marker has more than one link")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) != 3 || lines[0] != markerMagic || !strings.HasPrefix(lines[1], "id ") || !strings.HasPrefix(lines[2], "owner ") {
		return 0, errors.New("marker not in pgserver's format")
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(lines[2], "owner "))
	if err != nil || pid <= 0 {
		return 0, errors.New("marker names no owner pid")
	}
	return pid, nil
}

// alive reports whether a process with this pid exists (signal 0 sends
// nothing; EPERM means it exists under another user).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
