package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"github.com/pgfence/pgfence/internal/sysproc"
)

// Command is one instruction from the demo to a worker, sent as a JSON line
// on the worker's standard input.
type Command struct {
	// Op names what to do, e.g. "acquire", "write", "release"; the
	// worker's Handler defines the operations.
	Op string `json:"op"`
	// Lease is the lease's name, for lease operations.
	Lease string `json:"lease,omitempty"`
	// TTLMillis is the lease's time to live, for acquisition.
	TTLMillis int64 `json:"ttl_ms,omitempty"`
	// Fenced says whether a write is guarded with the worker's token.
	Fenced bool `json:"fenced,omitempty"`
	// Balance is the balance a write sets.
	Balance int64 `json:"balance,omitempty"`
}

// Event is a worker's answer to one Command, sent as a JSON line on its
// standard output.
type Event struct {
	// Op repeats the command's Op.
	Op string `json:"op"`
	// Token is the worker's fencing token, when it holds or held a lease.
	Token int64 `json:"token,omitempty"`
	// Balance is the account's balance the worker read or wrote.
	Balance int64 `json:"balance,omitempty"`
	// Error describes a failure; empty when the command succeeded.
	Error string `json:"error,omitempty"`
	// Fenced reports that a write was rejected because the row carries a
	// newer token (errors.Is(err, pgfence.ErrFenced)).
	Fenced bool `json:"fenced,omitempty"`
	// Current is the newer token on the row that rejected a fenced write.
	Current int64 `json:"current,omitempty"`
	// Lost reports that the worker's lease was lost.
	Lost bool `json:"lost,omitempty"`
}

// Handler performs one command in a worker and describes the outcome.
type Handler func(ctx context.Context, cmd Command) Event

// Serve runs a worker: it reads commands from r, one JSON object per line,
// calls h for each in turn and writes its event to w as one JSON line. It
// returns nil when r ends, or ctx's error when ctx ends first.
func Serve(ctx context.Context, r io.Reader, w io.Writer, h Handler) error {
	sc := bufio.NewScanner(r)
	enc := json.NewEncoder(w)
	for sc.Scan() {
		if err := ctx.Err(); err != nil {
			return err
		}
		var cmd Command
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
			ev = Event{Error: fmt.Sprintf("bad command %q: %v", sc.Text(), err)}
		} else {
			ev = h(ctx, cmd)
			ev.Op = cmd.Op
		}
		if err := enc.Encode(ev); err != nil {
			return fmt.Errorf("demo worker: write event: %w", err)
		}
	}
	return sc.Err()
}

// Worker is a worker process, driven by the demo.
type Worker struct {
	// Name is the worker's name on the timeline.
	Name string

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events *json.Decoder
	mu     sync.Mutex
}

// StartWorker starts path with args as a worker process named name. The
// process must run [Serve] on its standard input and output; its standard
// error goes to stderr. env is added to this process's environment.
func StartWorker(name, path string, args, env []string, stderr io.Writer) (*Worker, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// The worker dies with the demo, even if the demo is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	sysproc.SetParentDeathSignal(cmd.SysProcAttr, syscall.SIGKILL)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %s: %w", name, err)
	}
	return &Worker{Name: name, cmd: cmd, stdin: stdin, events: json.NewDecoder(stdout)}, nil
}

// Pid returns the worker's process id.
func (w *Worker) Pid() int { return w.cmd.Process.Pid }

// Do sends cmd to the worker and waits for its event. ctx bounds the wait:
// when it ends, the worker is killed (a command cannot be taken back) and
// ctx's error is returned.
func (w *Worker) Do(ctx context.Context, cmd Command) (Event, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, err := json.Marshal(cmd)
	if err != nil {
		return Event{}, err
	}
	if _, err := w.stdin.Write(append(b, '\n')); err != nil {
		return Event{}, fmt.Errorf("worker %s: send %s: %w", w.Name, cmd.Op, err)
	}
	type answer struct {
		ev  Event
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		var ev Event
		err := w.events.Decode(&ev)
		ch <- answer{ev, err}
	}()
	select {
	case a := <-ch:
		if a.err != nil {
			return Event{}, fmt.Errorf("worker %s: read the answer to %s: %w", w.Name, cmd.Op, a.err)
		}
		return a.ev, nil
	case <-ctx.Done():
		_ = w.cmd.Process.Kill()
		<-ch
		return Event{}, fmt.Errorf("worker %s: %s: %w", w.Name, cmd.Op, ctx.Err())
	}
}

// Pause stops the worker's process (SIGSTOP): every thread of it stops at
// once, as in a long GC pause or a frozen VM, renewals included.
func (w *Worker) Pause() error { return w.signal(syscall.SIGSTOP) }

// Resume continues the worker's process after Pause (SIGCONT).
func (w *Worker) Resume() error { return w.signal(syscall.SIGCONT) }

func (w *Worker) signal(sig syscall.Signal) error {
	if err := w.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("worker %s: %v: %w", w.Name, sig, err)
	}
	return nil
}

// Close ends the worker: its standard input is closed so Serve returns, and
// a worker still stopped is resumed so it can. It waits for the worker to
// exit and returns an error if it failed.
func (w *Worker) Close() error {
	err := w.stdin.Close()
	_ = w.cmd.Process.Signal(syscall.SIGCONT)
	if werr := w.cmd.Wait(); werr != nil {
		err = errors.Join(err, fmt.Errorf("worker %s: %w", w.Name, werr))
	}
	return err
}
