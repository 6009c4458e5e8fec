package supervise

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfence/pgfence/internal/sysproc"
)

// DefaultGrace is the time [Run] leaves a process group between SIGTERM and
// SIGKILL when RunOpts.Grace is zero.
const DefaultGrace = 5 * time.Second

// pollInterval is how often a terminating process group is checked for
// members: processes that are not our children cannot be waited for.
const pollInterval = 10 * time.Millisecond

// ErrNotFound is matched (errors.Is) by the error from [Start] and [Run] when
// the command does not exist; a shell reports it with status 127.
var ErrNotFound = errors.New("supervise: command not found")

// ErrNotExecutable is matched (errors.Is) by the error from [Start] and [Run]
// when the command exists but cannot be executed (no permission, not an
// executable format); a shell reports it with status 126.
var ErrNotExecutable = errors.New("supervise: command cannot be executed")

// Config describes the command to run.
type Config struct {
	// Path is the program: a path, or a name looked up in PATH. Required.
	Path string
	// Args are the arguments after the program name.
	Args []string
	// Env is the command's whole environment; nil means this process's.
	Env []string
	// Dir is the working directory; empty means this process's.
	Dir string
	// Stdin, Stdout and Stderr are passed to the command as they are (no
	// copying goroutines, so a process left behind holding one open never
	// delays Run). Nil means the null device.
	Stdin, Stdout, Stderr *os.File
}

// Exit is how a command ended.
type Exit struct {
	// Code is the exit code, or -1 when a signal ended the command.
	Code int
	// Signal is the signal that ended the command, or 0 when it exited.
	Signal syscall.Signal
}

// Status returns the command's exit status as a shell reports it: the exit
// code, or 128 plus the signal number when a signal ended the command.
func (e Exit) Status() int {
	if e.Signal != 0 {
		return 128 + int(e.Signal)
	}
	return e.Code
}

// String describes the exit, e.g. "exit status 3" or "killed by signal
// SIGTERM (terminated)".
func (e Exit) String() string {
	if e.Signal != 0 {
		return fmt.Sprintf("killed by signal %d (%v)", int(e.Signal), e.Signal)
	}
	return fmt.Sprintf("exit status %d", e.Code)
}

// Process is a started command, leader of its own process group.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	exit Exit
	err  error
}

// Start starts the command described by cfg in a new process group. The
// returned error matches [ErrNotFound] or [ErrNotExecutable] when the
// command could not be started for those reasons.
func Start(cfg *Config) (*Process, error) {
	if cfg == nil || cfg.Path == "" {
		return nil, errors.New("supervise: no command given")
	}
	cmd := exec.Command(cfg.Path, cfg.Args...)
	cmd.Env = cfg.Env
	cmd.Dir = cfg.Dir
	attachStdio(cmd, cfg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// If this process is killed, nothing forwards signals or ends the
	// group any more: the command should not run on unsupervised.
	sysproc.SetParentDeathSignal(cmd.SysProcAttr, syscall.SIGKILL)
	if err := cmd.Start(); err != nil {
		return nil, classifyStartError(cfg.Path, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go p.wait()
	return p, nil
}

func classifyStartError(path string, err error) error {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s: %v", ErrNotFound, path, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%w: %s: %v", ErrNotExecutable, path, err)
	default:
		return fmt.Errorf("supervise: start %s: %w", path, err)
	}
}

func (p *Process) wait() {
	defer close(p.done)
	err := p.cmd.Wait()
	st := p.cmd.ProcessState
	if st == nil {
		p.err = fmt.Errorf("supervise: wait: %w", err)
		return
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		p.exit = Exit{Code: -1, Signal: ws.Signal()}
		return
	}
	p.exit = Exit{Code: st.ExitCode()}
}

// Pid returns the command's process id, which is also its process group id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done returns a channel that is closed when the command (the group's
// leader) has exited. Other members of its group may still be running.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the command (the group's leader) to exit and returns how it
// ended.
func (p *Process) Wait() (Exit, error) {
	<-p.done
	return p.exit, p.err
}

// Signal sends sig to every process in the command's process group. It
// returns nil when the group has no members left.
func (p *Process) Signal(sig syscall.Signal) error {
	err := syscall.Kill(-p.Pid(), sig)
	if err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("supervise: signal process group %d: %w", p.Pid(), err)
	}
	return nil
}

// GroupAlive reports whether any process that has not exited is left in the
// command's process group. Exited processes waiting to be reaped by their
// parent (zombies) do not count. Where /proc is not available, zombies count.
func (p *Process) GroupAlive() bool {
	if syscall.Kill(-p.Pid(), 0) != nil {
		return false
	}
	alive, ok := procGroupAlive(p.Pid())
	return alive || !ok
}

// procGroupAlive scans /proc for a process of process group pgid that is
// not a zombie. ok is false when /proc cannot be read.
func procGroupAlive(pgid int) (alive, ok bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false, false
	}
	want := strconv.Itoa(pgid)
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || f[2] != want {
			continue
		}
		if f[0] != "Z" && f[0] != "X" {
			return true, true
		}
	}
	return false, true
}

// Terminate ends the whole process group: SIGTERM now, then SIGKILL once
// grace has passed if any member is left. It returns when the leader has
// exited and the group is empty or has been sent SIGKILL. A zero or
// negative grace sends SIGKILL at once.
func (p *Process) Terminate(grace time.Duration) {
	if grace > 0 {
		_ = p.Signal(syscall.SIGTERM)
		deadline := time.NewTimer(grace)
		defer deadline.Stop()
		tick := time.NewTicker(pollInterval)
		defer tick.Stop()
	wait:
		for {
			select {
			case <-deadline.C:
				break wait
			case <-tick.C:
				if p.exited() && !p.GroupAlive() {
					return
				}
			}
		}
	}
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *Process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// RunOpts are the choices of one [Run]. The zero value forwards no signal,
// is never lost and uses [DefaultGrace].
type RunOpts struct {
	// Signals, when not nil, delivers signals to forward to the command's
	// process group, typically from signal.Notify.
	Signals <-chan os.Signal
	// Lost, when closed, ends the command: the process group gets SIGTERM,
	// then SIGKILL after Grace.
	Lost <-chan struct{}
	// Grace is the time between SIGTERM and SIGKILL; zero means
	// DefaultGrace.
	Grace time.Duration
	// Supervisor, when not empty, is the command line (program and first
	// arguments) that starts a supervisor process: a program that calls
	// [Serve] with the arguments Run appends. The supervisor starts the
	// command and ends every process it started when this process dies
	// (see the package doc). Empty: this process starts the command itself.
	Supervisor []string
}

// Result is how a [Run] ended.
type Result struct {
	// Exit is how the command ended.
	Exit Exit
	// Lost reports that the command was ended because Lost was closed.
	Lost bool
}

// Run starts the command described by cfg in its own process group and
// waits for it, forwarding signals from opts.Signals to the group and ending
// the group when opts.Lost is closed. When the command exits, processes it
// left in its group get SIGTERM, then SIGKILL after the grace period, so
// nothing of it runs once Run returns. The error matches [ErrNotFound] or
// [ErrNotExecutable] when the command could not be started.
func Run(cfg *Config, opts *RunOpts) (Result, error) {
	var o RunOpts
	if opts != nil {
		o = *opts
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if len(o.Supervisor) > 0 {
		return runWithSupervisor(cfg, o)
	}
	p, err := Start(cfg)
	if err != nil {
		return Result{}, err
	}
	var res Result
loop:
	for {
		select {
		case <-p.Done():
			break loop
		case sig := <-o.Signals:
			if s, ok := sig.(syscall.Signal); ok {
				_ = p.Signal(s)
			}
		case <-o.Lost:
			res.Lost = true
			p.Terminate(o.Grace)
			break loop
		}
	}
	if p.GroupAlive() {
		p.Terminate(o.Grace)
	}
	res.Exit, err = p.Wait()
	return res, err
}

// attachStdio gives cmd cfg's standard files. Assigning a nil *os.File to
// an io.Reader/io.Writer field would make it non-nil; only real files are
// assigned.
func attachStdio(cmd *exec.Cmd, cfg *Config) {
	if cfg.Stdin != nil {
		cmd.Stdin = cfg.Stdin
	}
	if cfg.Stdout != nil {
		cmd.Stdout = cfg.Stdout
	}
	if cfg.Stderr != nil {
		cmd.Stderr = cfg.Stderr
	}
}
