package chaos

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"
)

// Kind says what an [Op] did.
type Kind int

// The kinds of operation a workload records.
const (
	// Acquire is a lock grant; Token is the fencing token granted.
	Acquire Kind = iota + 1
	// Read reads the register (in guarded mode it also claims the row for
	// Token); Value and RowToken are what it saw.
	Read
	// Write writes Value with Token into the register.
	Write
	// Release releases a lock.
	Release
)

func (k Kind) String() string {
	switch k {
	case Acquire:
		return "acquire"
	case Read:
		return "read"
	case Write:
		return "write"
	case Release:
		return "release"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Outcome is how an operation ended, as far as the client can tell.
type Outcome int

// The outcomes of an operation.
const (
	// Pending is an operation invoked and not yet completed.
	Pending Outcome = iota
	// Ok means the operation took effect.
	Ok
	// Fail means the operation certainly did not take effect.
	Fail
	// Unknown means the operation may or may not have taken effect.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case Pending:
		return "pending"
	case Ok:
		return "ok"
	case Fail:
		return "fail"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Op is one operation in a history. Times are nanoseconds since the
// recorder started, on the monotonic clock; an operation whose outcome is
// Unknown or Pending is treated as concurrent with everything after its
// call.
type Op struct {
	// Index is the operation's position in the history.
	Index int
	// Process is the worker that ran the operation.
	Process int
	// Kind is what the operation did.
	Kind Kind
	// Name is the lock name, for Acquire and Release.
	Name string
	// Token is the fencing token granted (Acquire) or presented (Read,
	// Write, Release).
	Token int64
	// Value is the value read (Read) or written (Write).
	Value int64
	// RowToken is the register's fencing token that a Read saw.
	RowToken int64
	// Outcome is how the operation ended.
	Outcome Outcome
	// Fenced is set on a failed Read or Write that the register rejected
	// because of a newer token.
	Fenced bool
	// Lost is set on a Read, Write or Release invoked by a holder that had
	// already been told its lock was lost (see [Watched]).
	Lost bool
	// Call and Return are the invocation and completion times.
	Call, Return int64
	// Err is the error text of a failed or unknown operation.
	Err string
}

// returnOrInf is the time after which the operation certainly had its
// effect, if any: its Return when it completed, +inf otherwise.
func (o Op) returnOrInf() int64 {
	if o.Outcome == Ok || o.Outcome == Fail {
		return o.Return
	}
	return math.MaxInt64
}

func (o Op) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d p%d %s", o.Index, o.Process, o.Kind)
	if o.Name != "" {
		fmt.Fprintf(&b, " %q", o.Name)
	}
	fmt.Fprintf(&b, " token=%d", o.Token)
	switch o.Kind {
	case Read:
		fmt.Fprintf(&b, " value=%d row_token=%d", o.Value, o.RowToken)
	case Write:
		fmt.Fprintf(&b, " value=%d", o.Value)
	}
	fmt.Fprintf(&b, " -> %s", o.Outcome)
	if o.Fenced {
		b.WriteString(" (fenced)")
	}
	if o.Lost {
		b.WriteString(" (lock known lost)")
	}
	fmt.Fprintf(&b, " [%d, ", o.Call)
	if o.Outcome == Ok || o.Outcome == Fail {
		fmt.Fprintf(&b, "%d]", o.Return)
	} else {
		b.WriteString("inf)")
	}
	if o.Err != "" {
		fmt.Fprintf(&b, " err=%s", o.Err)
	}
	return b.String()
}

// History is a recorded sequence of operations.
type History []Op

// String prints one operation per line.
func (h History) String() string {
	var b strings.Builder
	for _, o := range h {
		b.WriteString(o.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Recorder records a history. It is safe for concurrent use.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewRecorder returns an empty recorder whose clock starts now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

func (r *Recorder) now() int64 { return int64(time.Since(r.start)) }

// Invoke records the start of op and returns its handle. The fields Index,
// Call, Return and Outcome of op are set by the recorder.
func (r *Recorder) Invoke(op Op) *Pend {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.Index = len(r.ops)
	op.Call = r.now()
	op.Outcome = Pending
	r.ops = append(r.ops, op)
	return &Pend{r: r, i: op.Index}
}

// Pend is an invoked operation awaiting its outcome.
type Pend struct {
	r *Recorder
	i int
}

// Complete records the outcome of the operation. edit, when not nil, may
// fill in what the operation observed (Token, Value, RowToken, Fenced,
// Err). Completing an operation twice keeps the first outcome.
func (p *Pend) Complete(outcome Outcome, edit func(*Op)) {
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	op := &p.r.ops[p.i]
	if op.Outcome != Pending {
		return
	}
	op.Return = p.r.now()
	op.Outcome = outcome
	if edit != nil {
		edit(op)
	}
}

// History returns a copy of the operations recorded so far, in invocation
// order.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append(History(nil), r.ops...)
}

// Count returns the number of operations of kind k with outcome o.
func (h History) Count(k Kind, o Outcome) int {
	n := 0
	for _, op := range h {
		if op.Kind == k && op.Outcome == o {
			n++
		}
	}
	return n
}

// sortedByReturn returns a copy of ops sorted by returnOrInf.
func sortedByReturn(ops []Op) []Op {
	s := append([]Op(nil), ops...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].returnOrInf() < s[j].returnOrInf() })
	return s
}
