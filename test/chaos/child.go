package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/leasetable"
)

// Environment of a child holder process started by [StartChild].
const (
	// EnvChild makes a test binary run as a child holder ([ChildMain]).
	EnvChild = "PGFENCE_CHAOS_CHILD"
	// EnvChildURL is the database URL the child connects to.
	EnvChildURL = "PGFENCE_CHAOS_CHILD_URL"
	// EnvChildTable is the register table the child works on.
	EnvChildTable = "PGFENCE_CHAOS_CHILD_TABLE"
	// EnvChildGuarded is "1" when the child uses the guarded register.
	EnvChildGuarded = "PGFENCE_CHAOS_CHILD_GUARDED"
	// EnvChildRegister selects the child's register: "sql" (the default,
	// guarded or not by EnvChildGuarded), "fence", "fence-lease" (fence
	// writes checked against the lease the child holds) or "fence-noclaim"
	// (fenced writes, plain reads).
	EnvChildRegister = "PGFENCE_CHAOS_CHILD_REGISTER"
	// EnvChildLeaseTTL, when set (a Go duration), makes the child take real
	// leasetable leases with this TTL ("acquire NAME").
	EnvChildLeaseTTL = "PGFENCE_CHAOS_CHILD_LEASE_TTL"
)

// ChildMain runs the child holder and exits the process when EnvChild is
// set; otherwise it returns at once. Call it first in TestMain of a package
// that uses [StartChild].
//
// The child connects to EnvChildURL, prints "ready", then answers each line
// on stdin with one line on stdout: "read TOKEN" with "ok VALUE ROWTOKEN";
// "write TOKEN VALUE" with "ok"; either with "fenced", "fail MSG" or
// "unknown MSG" on error. With EnvChildLeaseTTL set it also answers
// "acquire NAME" with "ok TOKEN" (a real leasetable lease, renewed in the
// background), "waitlost" with "lost ERR" once the lease's Done is closed
// (or "held" after 30s), and "release" with "ok" or "fail MSG". It exits
// at end of input.
func ChildMain() {
	if os.Getenv(EnvChild) == "" {
		return
	}
	os.Exit(childMain(os.Stdin, os.Stdout))
}

func childMain(in io.Reader, out io.Writer) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(EnvChildURL))
	if err != nil {
		fmt.Fprintf(out, "fail connect: %v\n", err)
		return 1
	}
	defer pool.Close()
	table := os.Getenv(EnvChildTable)
	var reg Register
	var lease pgfence.Lease
	switch kind := os.Getenv(EnvChildRegister); kind {
	case "", "sql":
		reg, err = NewSQLRegister(ctx, pool, table, os.Getenv(EnvChildGuarded) == "1")
	case "fence", "fence-lease":
		reg, err = NewFenceRegister(ctx, pool, table, "")
	case "fence-noclaim":
		var fr *FenceRegister
		if fr, err = NewFenceRegister(ctx, pool, table, ""); err == nil {
			reg = fr.WithoutClaim()
		}
	default:
		err = fmt.Errorf("chaos: unknown child register %q", kind)
	}
	if err != nil {
		fmt.Fprintf(out, "fail %v\n", err)
		return 1
	}
	var locker *leasetable.Locker
	if v := os.Getenv(EnvChildLeaseTTL); v != "" {
		ttl, err := time.ParseDuration(v)
		if err == nil {
			locker, err = leasetable.New(ctx, pool, &leasetable.Config{TTL: ttl, Owner: fmt.Sprintf("chaos-child/%d", os.Getpid())})
		}
		if err != nil {
			fmt.Fprintf(out, "fail %v\n", err)
			return 1
		}
		defer locker.Close()
	}
	fmt.Fprintln(out, "ready")
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var reply string
		switch {
		case len(f) == 2 && f[0] == "read":
			tok, _ := strconv.ParseInt(f[1], 10, 64)
			v, rt, err := reg.Read(ctx, tok)
			reply = childReply(err, fmt.Sprintf("ok %d %d", v, rt))
		case len(f) == 3 && f[0] == "write":
			tok, _ := strconv.ParseInt(f[1], 10, 64)
			v, _ := strconv.ParseInt(f[2], 10, 64)
			reply = childReply(reg.Write(ctx, tok, v), "ok")
		case len(f) == 2 && f[0] == "acquire" && locker != nil:
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			lease, err = locker.Acquire(actx, f[1], nil)
			cancel()
			if err == nil {
				if os.Getenv(EnvChildRegister) == "fence-lease" {
					var fr *FenceRegister
					if fr, err = NewFenceRegister(ctx, pool, table, f[1]); err == nil {
						reg = fr.ForHolder(lease)
					}
				}
			}
			if err == nil {
				reply = fmt.Sprintf("ok %d", lease.Token())
			} else {
				reply = "fail " + oneLine(err.Error())
			}
		case len(f) == 1 && f[0] == "waitlost" && lease != nil:
			select {
			case <-lease.Done():
				reply = "lost " + oneLine(errString(lease.Err()))
			case <-time.After(30 * time.Second):
				reply = "held"
			}
		case len(f) == 1 && f[0] == "release" && lease != nil:
			reply = childReply(lease.Release(ctx), "ok")
		default:
			reply = "fail bad command " + strconv.Quote(sc.Text())
		}
		fmt.Fprintln(out, reply)
	}
	return 0
}

func childReply(err error, ok string) string {
	switch {
	case err == nil:
		return ok
	case IsFenced(err):
		return "fenced"
	case errors.Is(err, pgfence.ErrLeaseLost):
		return "fail lease lost: " + oneLine(err.Error())
	case Classify(err) == Fail:
		return "fail " + oneLine(err.Error())
	default:
		return "unknown " + oneLine(err.Error())
	}
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// Child is a holder running in a child process (the test binary run
// again), which can be paused with SIGSTOP and resumed with SIGCONT.
type Child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
}

// ChildOpts configures [StartChild].
type ChildOpts struct {
	// URL is the database the child connects to. Required.
	URL string
	// Table is the register table. Required.
	Table string
	// Guarded selects the guarded register.
	Guarded bool
	// Register is the child's register kind (see EnvChildRegister); empty
	// means "sql".
	Register string
	// LeaseTTL, when positive, lets the child take real leasetable leases
	// with this TTL.
	LeaseTTL time.Duration
}

// StartChild runs the current executable (a test binary whose TestMain
// calls [ChildMain]) as a child holder and waits for it to be ready. The
// child is killed if this process dies. Close it when done.
func StartChild(ctx context.Context, opts ChildOpts) (*Child, error) {
	if opts.URL == "" || opts.Table == "" {
		return nil, errors.New("chaos: StartChild needs a URL and a Table")
	}
	guarded := "0"
	if opts.Guarded {
		guarded = "1"
	}
	env := []string{EnvChild + "=holder", EnvChildURL + "=" + opts.URL,
		EnvChildTable + "=" + opts.Table, EnvChildGuarded + "=" + guarded, EnvChildRegister + "=" + opts.Register}
	if opts.LeaseTTL > 0 {
		env = append(env, EnvChildLeaseTTL+"="+opts.LeaseTTL.String())
	}
	return StartChildEnv(ctx, env)
}

// StartChildEnv runs the current executable as a child with env added to
// this process's environment (the test binary's own child mode picks its
// role from it), and waits for its "ready" line. The child is killed if
// this process dies. Close it when done.
func StartChildEnv(ctx context.Context, env []string) (*Child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	c := &Child{cmd: cmd, stdin: stdin, lines: make(chan string, 16), done: make(chan struct{})}
	// Pdeathsig is tied to the creating thread: start from a locked
	// goroutine that keeps its thread until the child exits.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(c.done)
			return
		}
		started <- nil
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		_ = cmd.Wait()
		close(c.lines)
		close(c.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("chaos: start child: %w", err)
	}
	line, err := c.Recv(ctx)
	if err != nil || line != "ready" {
		c.Close()
		return nil, fmt.Errorf("chaos: child not ready: %q %v", line, err)
	}
	return c, nil
}

// Pid returns the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Send writes one command line to the child.
func (c *Child) Send(line string) error {
	_, err := io.WriteString(c.stdin, line+"\n")
	return err
}

// Recv returns the child's next reply line, waiting until ctx ends.
func (c *Child) Recv(ctx context.Context) (string, error) {
	select {
	case l, ok := <-c.lines:
		if !ok {
			return "", errors.New("chaos: child exited")
		}
		return l, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Stop pauses the child with SIGSTOP and waits until the kernel reports it
// stopped.
func (c *Child) Stop(ctx context.Context) error {
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("chaos: SIGSTOP child: %w", err)
	}
	for {
		if st, err := ProcessState(c.Pid()); err == nil && st == 'T' {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Cont resumes the child with SIGCONT.
func (c *Child) Cont() error {
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("chaos: SIGCONT child: %w", err)
	}
	return nil
}

// Close ends the child: it resumes it, closes its input and kills it if it
// has not exited within 5s.
func (c *Child) Close() {
	_ = c.cmd.Process.Signal(syscall.SIGCONT)
	_ = c.stdin.Close()
	kill := time.NewTimer(5 * time.Second)
	defer kill.Stop()
	for {
		select {
		case _, ok := <-c.lines:
			if !ok {
				<-c.done
				return
			}
		case <-kill.C:
			_ = c.cmd.Process.Kill()
		}
	}
}

// ProcessState returns the state letter of process pid from /proc (R, S,
// T for stopped, Z, ...).
func ProcessState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("chaos: unexpected /proc/%d/stat", pid)
	}
	return b[i+2], nil
}
