package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server CPU of scenario 11: the CPU time of the cluster's postmaster and
// of every process it forked (backends and background workers), read from
// /proc before and after a point. The postmaster's cutime and cstime hold
// the CPU of the children it reaped, so a backend that exits within the
// point is counted too.

// clockTicks is USER_HZ, the unit of the times in /proc/<pid>/stat: 100 on
// every Linux architecture Go supports (the kernel converts its own tick
// rate to it for user space).
const clockTicks = 100

// procStat is the part of /proc/<pid>/stat that scenario 11 reads.
type procStat struct {
	PID, PPID      int
	Comm           string
	UTime, STime   int64 // clock ticks used by the process itself
	CUTime, CSTime int64 // clock ticks of its reaped children
}

// parseProcStat parses one /proc/<pid>/stat line. The command name is in
// parentheses and may itself contain spaces and parentheses, so the fields
// are counted from the last ')'.
func parseProcStat(line string) (procStat, error) {
	var s procStat
	open, closing := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 1 || closing < open {
		return s, fmt.Errorf("/proc stat: no (comm) in %q", line)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line[:open]))
	if err != nil {
		return s, fmt.Errorf("/proc stat: pid: %w", err)
	}
	s.PID, s.Comm = pid, line[open+1:closing]
	// After ')': state(3) ppid(4) ... utime(14) stime(15) cutime(16)
	// cstime(17), numbered as in proc(5); f[0] is field 3.
	f := strings.Fields(line[closing+1:])
	if len(f) < 15 {
		return s, fmt.Errorf("/proc stat: %d fields after comm in %q", len(f), line)
	}
	nums := make([]int64, 0, 5)
	for _, i := range []int{1, 11, 12, 13, 14} {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return s, fmt.Errorf("/proc stat: field %d: %w", i+3, err)
		}
		nums = append(nums, n)
	}
	s.PPID = int(nums[0])
	s.UTime, s.STime, s.CUTime, s.CSTime = nums[1], nums[2], nums[3], nums[4]
	return s, nil
}

func readProcStat(root string, pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(string(bytes.TrimSpace(b)))
}

// treeCPU returns the CPU time of process pid, its reaped children, and
// its live children, from the proc file system at root ("/proc").
func treeCPU(root string, pid int) (time.Duration, error) {
	pm, err := readProcStat(root, pid)
	if err != nil {
		return 0, err
	}
	ticks := pm.UTime + pm.STime + pm.CUTime + pm.CSTime
	ents, err := os.ReadDir(root)
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n == pid {
			continue
		}
		s, err := readProcStat(root, n)
		if err != nil || s.PPID != pid {
			continue // gone meanwhile, or not a child
		}
		ticks += s.UTime + s.STime
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// parsePostmasterPID returns the pid on the first line of postmaster.pid.
func parsePostmasterPID(data string) (int, error) {
	line, _, _ := strings.Cut(data, "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid < 1 {
		return 0, fmt.Errorf("postmaster.pid: first line %q is not a pid", line)
	}
	return pid, nil
}

// serverCPU reads the CPU time of a PostgreSQL cluster running on this
// machine; ok is false when it cannot (another machine, a container, no
// /proc), and why says why.
type serverCPU struct {
	root       string
	postmaster int
	why        string
}

// findServerCPU locates the postmaster of the server at url: from
// postmaster.pid in its data directory when readable, else as the parent
// of this connection's backend. Either way the backend of a connection of
// ours must be its child in this machine's /proc, which proves the server
// is local.
func findServerCPU(ctx context.Context, url string) *serverCPU {
	s := &serverCPU{root: "/proc"}
	err := withConn(ctx, url, func(c *pgx.Conn) error {
		var backend int
		if err := c.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&backend); err != nil {
			return err
		}
		// Needs superuser or pg_read_all_settings; without it, the
		// backend's parent is used.
		var dataDir string
		_ = c.QueryRow(ctx, `SELECT pg_catalog.current_setting('data_directory')`).Scan(&dataDir)
		// The backend is looked up while the connection is open.
		s.locate(backend, dataDir)
		return nil
	})
	if err != nil {
		s.why, s.postmaster = err.Error(), 0
	}
	return s
}

// locate finds the postmaster from a live backend's pid and the data
// directory ("" when unknown).
func (s *serverCPU) locate(backend int, dataDir string) {
	bs, err := readProcStat(s.root, backend)
	if err != nil {
		s.why = fmt.Sprintf("backend %d not in this machine's /proc (server not local?)", backend)
		return
	}
	if dataDir != "" {
		if b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid")); err == nil {
			if pid, err := parsePostmasterPID(string(b)); err == nil {
				s.postmaster = pid
			}
		}
	}
	if s.postmaster == 0 {
		ps, err := readProcStat(s.root, bs.PPID)
		if err != nil || !strings.HasPrefix(ps.Comm, "postgres") {
			s.why = fmt.Sprintf("the parent of backend %d is not a postgres process here", backend)
			return
		}
		s.postmaster = bs.PPID
	}
	if bs.PPID != s.postmaster {
		s.why = fmt.Sprintf("process %d here is not a child of postmaster %d (server not local?)", backend, s.postmaster)
		s.postmaster = 0
	}
}

// ok says whether the server's CPU can be read.
func (s *serverCPU) ok() bool { return s != nil && s.postmaster != 0 }

// read returns the server's CPU time so far.
func (s *serverCPU) read() (time.Duration, error) {
	if !s.ok() {
		return 0, errors.New(s.why)
	}
	return treeCPU(s.root, s.postmaster)
}
