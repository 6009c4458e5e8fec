//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// PowerLossFS is a FUSE loopback filesystem over a backing directory that
// can lose, on a simulated power cut, every file write not yet made
// durable: it keeps, for each file written since its last fsync, the bytes
// each write overwrote and the file's size at that fsync, and
// [PowerLossFS.PowerCut] puts them back. Writes, reads and directory
// operations go through to the backing directory at once; fsync and
// fdatasync (on any descriptor of the file, as on Linux) make the file's
// data durable, as does a write through a descriptor opened with O_SYNC or
// O_DSYNC. Directory operations (create, rename, unlink, mkdir) are durable
// at once: only file data and file sizes are lost. It is mounted with
// allow_other by mount(2) directly, which needs root.
type PowerLossFS struct {
	backing, mountpoint string

	// cut is held shared by every recorded operation and exclusively by
	// PowerCut, which thus sees no operation half done.
	cut    sync.RWMutex
	mu     sync.Mutex // guards files and server
	files  map[uint64]*unsynced
	server *fuse.Server
}

// unsynced is what a file lost since its last fsync: undo holds the bytes
// each write or truncation replaced, oldest first.
type unsynced struct {
	mu   sync.Mutex
	size int64 // the file's size at its last fsync
	undo []undoRec
}

type undoRec struct {
	off int64
	old []byte
}

// CutStats says what a power cut dropped.
type CutStats struct {
	// Files is the number of files that had writes not yet durable.
	Files int
	// Bytes is the number of bytes put back or cut off.
	Bytes int64
}

// MountPowerLoss mounts a PowerLossFS at mountpoint over backing (both
// existing directories). Everything in backing when it is mounted counts
// as durable.
func MountPowerLoss(backing, mountpoint string) (*PowerLossFS, error) {
	p := &PowerLossFS{backing: backing, mountpoint: mountpoint, files: map[uint64]*unsynced{}}
	if err := p.mount(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *PowerLossFS) mount() error {
	var st syscall.Stat_t
	if err := syscall.Stat(p.backing, &st); err != nil {
		return fmt.Errorf("chaos: powerloss: %w", err)
	}
	root := &gofs.LoopbackRoot{Path: p.backing, Dev: uint64(st.Dev)}
	root.NewNode = func(r *gofs.LoopbackRoot, _ *gofs.Inode, _ string, _ *syscall.Stat_t) gofs.InodeEmbedder {
		return &plNode{LoopbackNode: gofs.LoopbackNode{RootData: r}, pl: p}
	}
	root.RootNode = root.NewNode(root, nil, "", &st)
	// Only this process changes the backing directory while it is mounted,
	// so the kernel may cache entries and attributes.
	sec := time.Second
	srv, err := gofs.Mount(p.mountpoint, root.RootNode, &gofs.Options{
		EntryTimeout: &sec, AttrTimeout: &sec,
		MountOptions: fuse.MountOptions{
			AllowOther: true, DirectMount: true, DirectMountStrict: true,
			FsName: p.backing, Name: "pgfence-powerloss", DisableXAttrs: true,
		},
	})
	if err != nil {
		return fmt.Errorf("chaos: powerloss: mount %s: %w", p.mountpoint, err)
	}
	p.mu.Lock()
	p.server = srv
	p.mu.Unlock()
	return nil
}

// Unmount unmounts the filesystem. The processes using it must have
// exited.
func (p *PowerLossFS) Unmount() error {
	p.mu.Lock()
	srv := p.server
	p.server = nil
	p.mu.Unlock()
	if srv == nil {
		return nil
	}
	var err error
	for i := 0; i < 50; i++ {
		if err = srv.Unmount(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Detach it rather than leave it behind; its server then exits when
	// the last file on it is closed.
	_ = syscall.Unmount(p.mountpoint, syscall.MNT_DETACH)
	return fmt.Errorf("chaos: powerloss: unmount %s: %w", p.mountpoint, err)
}

// PowerCut simulates a power cut: it unmounts the filesystem, puts back
// in the backing directory every file's data and size as of its last
// fsync, and mounts it again. Every process using the filesystem must have
// been killed first (a process that survived would see its files change
// under it).
func (p *PowerLossFS) PowerCut() (CutStats, error) {
	p.cut.Lock()
	defer p.cut.Unlock()
	if err := p.Unmount(); err != nil {
		return CutStats{}, err
	}
	stats, err := p.dropUnsynced()
	if err != nil {
		return stats, err
	}
	return stats, p.mount()
}

// dropUnsynced undoes the unsynced writes of every file still linked in
// the backing directory.
func (p *PowerLossFS) dropUnsynced() (CutStats, error) {
	p.mu.Lock()
	files := p.files
	p.files = map[uint64]*unsynced{}
	p.mu.Unlock()
	paths := map[uint64]string{}
	err := filepath.WalkDir(p.backing, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		paths[info.Sys().(*syscall.Stat_t).Ino] = path
		return nil
	})
	var stats CutStats
	if err != nil {
		return stats, fmt.Errorf("chaos: powerloss: %w", err)
	}
	for ino, u := range files {
		path, ok := paths[ino]
		if !ok {
			continue // unlinked since
		}
		n, err := u.revert(path)
		if err != nil {
			return stats, err
		}
		if n > 0 {
			stats.Files++
			stats.Bytes += n
		}
	}
	return stats, nil
}

// revert puts back the file at path as it was at its last fsync and
// returns the number of bytes changed.
func (u *unsynced) revert(path string) (int64, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("chaos: powerloss: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("chaos: powerloss: %w", err)
	}
	n := max(st.Size()-u.size, 0)
	for i := len(u.undo) - 1; i >= 0; i-- {
		r := u.undo[i]
		if _, err := f.WriteAt(r.old, r.off); err != nil {
			return 0, fmt.Errorf("chaos: powerloss: revert %s: %w", path, err)
		}
		n += int64(len(r.old))
	}
	if err := f.Truncate(u.size); err != nil {
		return 0, fmt.Errorf("chaos: powerloss: revert %s: %w", path, err)
	}
	return n, nil
}

// state returns the record of the file whose backing inode is st's,
// created with st's size as the durable one if the file had none.
func (p *PowerLossFS) state(st *unix.Stat_t) *unsynced {
	p.mu.Lock()
	defer p.mu.Unlock()
	u, ok := p.files[st.Ino]
	if !ok {
		u = &unsynced{size: st.Size}
		p.files[st.Ino] = u
	}
	return u
}

// change runs op, which changes [off, off+n) of the file open as fd (n < 0:
// from off to its end), after saving what it overwrites; durable makes the
// file's data durable after op.
func (p *PowerLossFS) change(fd int, off, n int64, durable bool, op func() syscall.Errno) syscall.Errno {
	p.cut.RLock()
	defer p.cut.RUnlock()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	u := p.state(&st)
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := unix.Fstat(fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	end := st.Size
	if n >= 0 {
		end = min(off+n, st.Size)
	}
	if end > off {
		old := make([]byte, end-off)
		if _, err := unix.Pread(fd, old, off); err != nil {
			return gofs.ToErrno(err)
		}
		u.undo = append(u.undo, undoRec{off: off, old: old})
	}
	if errno := op(); errno != 0 {
		return errno
	}
	if durable {
		return u.syncLocked(fd)
	}
	return 0
}

// fsync makes the data of the file open as fd durable.
func (p *PowerLossFS) fsync(fd int) syscall.Errno {
	p.cut.RLock()
	defer p.cut.RUnlock()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	p.mu.Lock()
	u := p.files[st.Ino]
	p.mu.Unlock()
	if u == nil {
		return 0 // not written since it was last durable
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.syncLocked(fd)
}

func (u *unsynced) syncLocked(fd int) syscall.Errno {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return gofs.ToErrno(err)
	}
	u.size = st.Size
	u.undo = nil
	return 0
}

// forget drops the record of a backing inode that is gone, so that a new
// file given its number starts afresh.
func (p *PowerLossFS) forget(ino uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.files, ino)
}

// plNode is a loopback node whose files record their unsynced writes.
type plNode struct {
	gofs.LoopbackNode
	pl *PowerLossFS
}

var (
	_ gofs.NodeOpener    = (*plNode)(nil)
	_ gofs.NodeCreater   = (*plNode)(nil)
	_ gofs.NodeSetattrer = (*plNode)(nil)
	_ gofs.NodeUnlinker  = (*plNode)(nil)
	_ gofs.NodeRenamer   = (*plNode)(nil)
)

func (n *plNode) backingPath(name string) string {
	return filepath.Join(n.RootData.Path, n.Path(nil), name)
}

// Open implements gofs.NodeOpener. O_TRUNC arrives as a Setattr first
// (the filesystem does not ask for atomic O_TRUNC), so Open only wraps the
// file.
func (n *plNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fh, ff, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return n.wrap(fh, flags), ff, 0
}

// Create implements gofs.NodeCreater.
func (n *plNode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	in, fh, ff, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return in, n.wrap(fh, flags), ff, 0
}

func (n *plNode) wrap(fh gofs.FileHandle, flags uint32) gofs.FileHandle {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		panic(fmt.Sprintf("chaos: powerloss: loopback file handle is a %T", fh))
	}
	return &plFile{LoopbackFile: lf, pl: n.pl, sync: flags&syscall.O_DSYNC != 0}
}

// Setattr implements gofs.NodeSetattrer: a truncation saves what it cuts
// off.
func (n *plNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	size, ok := in.GetSize()
	if !ok {
		return n.LoopbackNode.Setattr(ctx, f, in, out)
	}
	fd, err := unix.Open(n.backingPath(""), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return gofs.ToErrno(err)
	}
	defer unix.Close(fd)
	return n.pl.change(fd, int64(size), -1, false, func() syscall.Errno {
		return n.LoopbackNode.Setattr(ctx, f, in, out)
	})
}

// Unlink implements gofs.NodeUnlinker.
func (n *plNode) Unlink(ctx context.Context, name string) syscall.Errno {
	ino, last := n.lastLink(n.backingPath(name))
	if errno := n.LoopbackNode.Unlink(ctx, name); errno != 0 {
		return errno
	}
	if last {
		n.pl.forget(ino)
	}
	return 0
}

// Rename implements gofs.NodeRenamer.
func (n *plNode) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	target := filepath.Join(n.RootData.Path, newParent.EmbeddedInode().Path(nil), newName)
	ino, last := n.lastLink(target)
	if errno := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags); errno != 0 {
		return errno
	}
	if last && flags&unix.RENAME_EXCHANGE == 0 {
		n.pl.forget(ino)
	}
	return 0
}

// lastLink reports the inode of the regular file at path and whether path
// is its last link.
func (n *plNode) lastLink(path string) (uint64, bool) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, false
	}
	return st.Ino, st.Nlink == 1
}

// plFile is a loopback file whose writes are recorded until fsync.
type plFile struct {
	*gofs.LoopbackFile
	pl   *PowerLossFS
	sync bool // opened O_SYNC or O_DSYNC: every write is durable
}

var (
	_ gofs.FileWriter    = (*plFile)(nil)
	_ gofs.FileWritever  = (*plFile)(nil)
	_ gofs.FileFsyncer   = (*plFile)(nil)
	_ gofs.FileAllocater = (*plFile)(nil)
)

func (f *plFile) fd() int {
	fd, _ := f.LoopbackFile.PassthroughFd()
	return fd
}

// PassthroughFd refuses passthrough: the kernel would write to the backing
// file without this filesystem seeing it.
func (f *plFile) PassthroughFd() (int, bool) { return -1, false }

// Write implements gofs.FileWriter.
func (f *plFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	var written uint32
	errno := f.pl.change(f.fd(), off, int64(len(data)), f.sync, func() syscall.Errno {
		var errno syscall.Errno
		written, errno = f.LoopbackFile.Write(ctx, data, off)
		return errno
	})
	return written, errno
}

// Writev implements gofs.FileWritever.
func (f *plFile) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	var n int64
	for _, d := range data {
		n += int64(len(d))
	}
	var written uint32
	errno := f.pl.change(f.fd(), off, n, f.sync, func() syscall.Errno {
		var errno syscall.Errno
		written, errno = f.LoopbackFile.Writev(ctx, data, off)
		return errno
	})
	return written, errno
}

// Allocate implements gofs.FileAllocater: a punched or zeroed range saves
// what it replaces; a plain allocation only grows the file.
func (f *plFile) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	n := int64(0)
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_COLLAPSE_RANGE|unix.FALLOC_FL_INSERT_RANGE) != 0 {
		n = int64(size)
		if mode&(unix.FALLOC_FL_COLLAPSE_RANGE|unix.FALLOC_FL_INSERT_RANGE) != 0 {
			n = -1 // shifts everything after off
		}
	}
	return f.pl.change(f.fd(), int64(off), n, f.sync, func() syscall.Errno {
		return f.LoopbackFile.Allocate(ctx, off, size, mode)
	})
}

// Fsync implements gofs.FileFsyncer: the file's data becomes durable. The
// backing file is not synced: durability here is this filesystem's.
func (f *plFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return f.pl.fsync(f.fd())
}

// ErrPowerLossUnavailable is returned by [CheckPowerLoss] when FUSE cannot be
// mounted here.
var ErrPowerLossUnavailable = errors.New("chaos: powerloss: FUSE is not available")

// CheckPowerLoss reports whether a PowerLossFS can be mounted: /dev/fuse
// exists and this process is root.
func CheckPowerLoss() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("%w: %v", ErrPowerLossUnavailable, err)
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: mounting needs root", ErrPowerLossUnavailable)
	}
	return nil
}
