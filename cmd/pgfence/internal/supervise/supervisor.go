package supervise

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfence/pgfence/internal/sysproc"
)

// The supervisor is a second process between the caller of [Run] and the
// command (see the package doc, "Supervisor"). The caller talks to it over
// two pipes, passed as the supervisor's file descriptors 3 and 4:
//
//   - control (3, caller -> supervisor): one byte per request. A signal
//     number (1-64) forwards that signal to the command's process group;
//     ctlTerminate ends every descendant (SIGTERM, SIGKILL after the grace
//     period). End of file means the caller is gone: every descendant gets
//     SIGKILL at once.
//   - status (4, supervisor -> caller): one line when the supervisor is done,
//     "exit CODE SIGNAL", or "notfound|notexec|error MESSAGE" when the
//     command could not be started.
const (
	ctlFD    = 3
	statusFD = 4

	ctlTerminate = 0
)

// killAllTimeout bounds the supervisor's SIGKILL sweep; it ends sooner as
// soon as no descendant is left, normally within a few milliseconds.
const killAllTimeout = 5 * time.Second

// runWithSupervisor is [Run] through a supervisor process started as
// o.Supervisor (see Serve).
func runWithSupervisor(cfg *Config, o RunOpts) (Result, error) {
	if cfg == nil || cfg.Path == "" {
		return Result{}, errors.New("supervise: no command given")
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return Result{}, fmt.Errorf("supervise: control pipe: %w", err)
	}
	defer ctlW.Close()
	stR, stW, err := os.Pipe()
	if err != nil {
		_ = ctlR.Close()
		return Result{}, fmt.Errorf("supervise: status pipe: %w", err)
	}
	defer stR.Close()

	args := append(append([]string{}, o.Supervisor[1:]...), o.Grace.String(), "--", cfg.Path)
	cmd := exec.Command(o.Supervisor[0], append(args, cfg.Args...)...)
	cmd.Env = cfg.Env
	cmd.Dir = cfg.Dir
	attachStdio(cmd, cfg)
	cmd.ExtraFiles = []*os.File{ctlR, stW} // fds 3 and 4
	err = cmd.Start()
	_ = ctlR.Close()
	_ = stW.Close()
	if err != nil {
		return Result{}, fmt.Errorf("supervise: start the supervisor %s: %w", o.Supervisor[0], err)
	}

	status := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(stR)
		status <- strings.TrimSpace(string(b))
	}()
	done := make(chan error, 1)
	go func() {
		st := <-status
		err := cmd.Wait()
		if st == "" {
			done <- fmt.Errorf("supervise: the supervisor ended (%v) without reporting the command's exit", err)
			return
		}
		status <- st
		done <- nil
	}()

	var res Result
	lost := o.Lost
	for {
		select {
		case err := <-done:
			if err != nil {
				return res, err
			}
			exit, err := parseStatus(cfg.Path, <-status)
			res.Exit = exit
			return res, err
		case sig := <-o.Signals:
			if s, ok := sig.(syscall.Signal); ok && s > 0 && s < 256 {
				_, _ = ctlW.Write([]byte{byte(s)})
			}
		case <-lost:
			res.Lost = true
			lost = nil
			_, _ = ctlW.Write([]byte{ctlTerminate})
		}
	}
}

// parseStatus decodes the supervisor's status line.
func parseStatus(path, line string) (Exit, error) {
	kind, rest, _ := strings.Cut(line, " ")
	switch kind {
	case "exit":
		var e Exit
		var sig int
		if _, err := fmt.Sscanf(rest, "%d %d", &e.Code, &sig); err != nil {
			return Exit{}, fmt.Errorf("supervise: bad status from the supervisor: %q", line)
		}
		e.Signal = syscall.Signal(sig)
		return e, nil
	case "notfound":
		return Exit{}, fmt.Errorf("%w: %s", ErrNotFound, rest)
	case "notexec":
		return Exit{}, fmt.Errorf("%w: %s", ErrNotExecutable, rest)
	default:
		return Exit{}, fmt.Errorf("supervise: %s: %s", path, rest)
	}
}

// Serve is the supervisor's main: the program named by
// [RunOpts].Supervisor calls it with the arguments that follow, which [Run]
// appends: GRACE -- COMMAND [ARGS...]. It returns the supervisor's exit
// status, which [Run] does not use (the command's is sent on the status
// pipe).
//
// Serve makes this process a child subreaper, starts the command in a new
// process group, and serves the control pipe until the command has exited
// and no descendant is left. When the control pipe reaches end of file (the
// caller died, even by SIGKILL), every descendant is killed with SIGKILL,
// wherever it moved: in the command's group, in another group, or in a
// session of its own.
func Serve(args []string) int {
	// These descriptors are ours only: the command must not inherit them
	// (a descendant holding the status pipe would delay the caller).
	syscall.CloseOnExec(ctlFD)
	syscall.CloseOnExec(statusFD)
	ctl := os.NewFile(ctlFD, "supervise-control")
	st := os.NewFile(statusFD, "supervise-status")
	if ctl == nil || st == nil {
		fmt.Fprintln(os.Stderr, "supervise: not started by supervise.Run")
		return 2
	}
	report := func(format string, a ...any) {
		_, _ = fmt.Fprintf(st, format+"\n", a...)
		_ = st.Close()
	}
	if len(args) < 3 || args[1] != "--" {
		report("error usage: GRACE -- COMMAND [ARGS...]")
		return 2
	}
	grace, err := time.ParseDuration(args[0])
	if err != nil || grace <= 0 {
		report("error bad grace period %q", args[0])
		return 2
	}
	// The caller forwards the signals it means for the command; the
	// terminal's SIGINT reaches this process too (it stays in the caller's
	// process group) and must not end it. Caught, not ignored: an ignored
	// signal would stay ignored in the command.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if err := sysproc.SetChildSubreaper(); err != nil {
		report("error cannot become a child subreaper: %v", err)
		return 1
	}

	requests := make(chan byte)
	go func() {
		defer close(requests)
		r := bufio.NewReader(ctl)
		for {
			b, err := r.ReadByte()
			if err != nil {
				return
			}
			requests <- b
		}
	}()

	p, err := Start(&Config{Path: args[2], Args: args[3:], Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr})
	switch {
	case errors.Is(err, ErrNotFound):
		report("notfound %v", strings.TrimPrefix(err.Error(), ErrNotFound.Error()+": "))
		return 1
	case errors.Is(err, ErrNotExecutable):
		report("notexec %v", strings.TrimPrefix(err.Error(), ErrNotExecutable.Error()+": "))
		return 1
	case err != nil:
		report("error %v", err)
		return 1
	}

	s := &supervisor{leader: p, requests: requests}
loop:
	for {
		select {
		case <-p.Done():
			break loop
		case <-sigs:
		case b, ok := <-requests:
			switch {
			case !ok:
				s.killAll()
				return 1
			case b == ctlTerminate:
				s.terminateAll(grace)
				break loop
			default:
				_ = p.Signal(syscall.Signal(b))
			}
		}
	}
	// Whatever the command left behind, in its group or not, ends now.
	if s.gone || !s.terminateAll(grace) {
		return 1
	}
	exit, err := p.Wait()
	if err != nil {
		report("error %v", err)
		return 1
	}
	report("exit %d %d", exit.Code, int(exit.Signal))
	return 0
}

// supervisor ends the descendants of this process.
type supervisor struct {
	leader   *Process
	requests <-chan byte
	gone     bool // the control pipe reached end of file
}

// terminateAll sends SIGTERM to every descendant, waits up to grace for
// them to exit, then kills what is left. It returns early, after a SIGKILL
// sweep, when the control pipe ends meanwhile, and then returns false.
func (s *supervisor) terminateAll(grace time.Duration) bool {
	live := s.descendants()
	if len(live) == 0 {
		return true
	}
	_ = s.leader.Signal(syscall.SIGTERM)
	for _, pid := range live {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-deadline.C:
			s.killAll()
			return !s.gone
		case b, ok := <-s.requests:
			if !ok {
				s.gone = true
				s.killAll()
				return false
			}
			if b != ctlTerminate {
				_ = s.leader.Signal(syscall.Signal(b))
			}
		case <-tick.C:
			if len(s.descendants()) == 0 {
				return true
			}
		}
	}
}

// killAll sends SIGKILL to every descendant until none is left (or
// killAllTimeout passes), reaping the orphans reparented to this process.
// A process that has been sent SIGKILL cannot fork any more, so each sweep
// finds at most the children forked just before it.
func (s *supervisor) killAll() {
	deadline := time.Now().Add(killAllTimeout)
	for time.Now().Before(deadline) {
		_ = s.leader.Signal(syscall.SIGKILL)
		live := s.descendants()
		if len(live) == 0 {
			return
		}
		for _, pid := range live {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(time.Millisecond)
	}
}

// descendants returns the pids of this process's descendants that have
// not exited, reaping (wait4) those of its own children that have, except
// the leader, whose status Process.wait collects.
func (s *supervisor) descendants() []int {
	procs := readProcs()
	children := make(map[int][]int, len(procs))
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	self := os.Getpid()
	var live []int
	queue := children[self]
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		queue = append(queue, children[pid]...)
		p := procs[pid]
		if !p.exited() {
			live = append(live, pid)
			continue
		}
		if p.ppid == self && pid != s.leader.Pid() {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
	}
	return live
}

// proc is one process as /proc/PID/stat shows it.
type proc struct {
	state      string
	ppid, pgrp int
}

func (p proc) exited() bool { return p.state == "Z" || p.state == "X" }

// readProcs reads every process's state, parent and process group from
// /proc; processes that exit meanwhile are left out.
func readProcs() map[int]proc {
	out := make(map[int]proc)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
		str := string(b)
		i := strings.LastIndexByte(str, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(str[i+1:])
		if len(f) < 3 {
			continue
		}
		ppid, err1 := strconv.Atoi(f[1])
		pgrp, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			continue
		}
		out[pid] = proc{state: f[0], ppid: ppid, pgrp: pgrp}
	}
	return out
}
