package chaos

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// CheckTokensUnique reports every fencing token granted by more than one
// successful Acquire, across all lock names: tokens come from one sequence
// and must never be issued twice. Token 0 means a grant without a token and
// is ignored.
func CheckTokensUnique(h History) []string {
	seen := map[int64]Op{}
	var out []string
	for _, op := range h {
		if op.Kind != Acquire || op.Outcome != Ok || op.Token == 0 {
			continue
		}
		if prev, ok := seen[op.Token]; ok {
			out = append(out, fmt.Sprintf("token %d granted twice: #%d (p%d %q) and #%d (p%d %q)",
				op.Token, prev.Index, prev.Process, prev.Name, op.Index, op.Process, op.Name))
			continue
		}
		seen[op.Token] = op
	}
	return out
}

// WithoutUncommittedGrants returns h without the successful Acquire
// operations whose holder's transaction is not known to have committed: the
// next Release of the same process and token failed, had an unknown
// outcome, or never came. It is for transaction-scoped locks, whose token is
// durable only with the transaction's commit (see [CheckOpts].TxScoped).
func WithoutUncommittedGrants(h History) History {
	open := map[int]Op{} // process -> its grant awaiting a Release
	drop := map[int]bool{}
	for _, op := range h {
		switch op.Kind {
		case Acquire:
			if op.Outcome == Ok {
				if prev, ok := open[op.Process]; ok {
					drop[prev.Index] = true
				}
				open[op.Process] = op
			}
		case Release:
			if g, ok := open[op.Process]; ok && g.Token == op.Token {
				if op.Outcome != Ok {
					drop[g.Index] = true
				}
				delete(open, op.Process)
			}
		}
	}
	for _, g := range open {
		drop[g.Index] = true
	}
	out := make(History, 0, len(h))
	for _, op := range h {
		if !drop[op.Index] {
			out = append(out, op)
		}
	}
	return out
}

// CheckTokensIncreasing reports, per lock name, every pair of successful
// grants A and B where A completed before B was invoked and B's token is not
// greater than A's: tokens must increase in grant order. Grants without a
// token (0) are ignored.
func CheckTokensIncreasing(h History) []string {
	byName := map[string][]Op{}
	for _, op := range h {
		if op.Kind == Acquire && op.Outcome == Ok && op.Token != 0 {
			byName[op.Name] = append(byName[op.Name], op)
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []string
	for _, name := range names {
		out = append(out, checkFloors(byName[name], func(op Op) (int64, bool) { return op.Token, true },
			func(op Op) (int64, bool) { return op.Token, true }, true,
			func(b, a Op) string {
				return fmt.Sprintf("lock %q: grant #%d (token %d) follows grant #%d (token %d) but its token is not greater",
					name, b.Index, b.Token, a.Index, a.Token)
			})...)
	}
	return out
}

// CheckMutualExclusion reports every pair of processes that certainly held
// the same lock at the same time: a process certainly holds a lock from the
// return of its successful Acquire to the invocation of its next Release of
// that name (or the end of the history). It applies to locks that never
// expire (advisory locks); leases may overlap once expired, which is what
// fencing is for.
func CheckMutualExclusion(h History) []string {
	type hold struct {
		op       Op
		from, to int64
	}
	holds := map[string][]hold{}
	open := map[string]int{} // name/process -> index in holds[name]
	for _, op := range h {
		key := fmt.Sprintf("%s\x00%d", op.Name, op.Process)
		switch {
		case op.Kind == Acquire && op.Outcome == Ok:
			open[key] = len(holds[op.Name])
			holds[op.Name] = append(holds[op.Name], hold{op: op, from: op.Return, to: math.MaxInt64})
		case op.Kind == Release:
			if i, ok := open[key]; ok {
				holds[op.Name][i].to = op.Call
				delete(open, key)
			}
		}
	}
	names := make([]string, 0, len(holds))
	for n := range holds {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []string
	for _, name := range names {
		hs := holds[name]
		for i := range hs {
			for j := i + 1; j < len(hs); j++ {
				a, b := hs[i], hs[j]
				if a.op.Process != b.op.Process && a.from < b.to && b.from < a.to {
					out = append(out, fmt.Sprintf("lock %q held by p%d (#%d) and p%d (#%d) at the same time",
						name, a.op.Process, a.op.Index, b.op.Process, b.op.Index))
				}
			}
		}
	}
	return out
}

// CheckRowTokenMonotonic reports every successful Read that saw the
// register's fencing token lower than one already established before the
// read was invoked, by a successful Write (its Token) or a successful Read
// (the RowToken it saw): the row's token must never move backwards.
func CheckRowTokenMonotonic(h History) []string {
	var ops []Op
	for _, op := range h {
		if (op.Kind == Read || op.Kind == Write) && op.Outcome == Ok {
			ops = append(ops, op)
		}
	}
	floor := func(op Op) (int64, bool) {
		if op.Kind == Write {
			return op.Token, true
		}
		return op.RowToken, true
	}
	observe := func(op Op) (int64, bool) { return op.RowToken, op.Kind == Read }
	return checkFloors(ops, floor, observe, false, func(b, a Op) string {
		return fmt.Sprintf("row token moved backwards: read #%d (p%d) saw row token %d after #%d (p%d %s) had established %d",
			b.Index, b.Process, b.RowToken, a.Index, a.Process, a.Kind, mustFloor(floor, a))
	})
}

// checkFloors checks, for every op B for which observe returns a value, that
// the value is >= (or > when strict) the floor of every op A that returned
// before B was invoked.
func checkFloors(ops []Op, floor, observe func(Op) (int64, bool), strict bool, msg func(b, a Op) string) []string {
	byRet := sortedByReturn(ops)
	// prefix maximum of floors in return order, with the op holding it.
	maxOp := make([]int, len(byRet))
	best := -1
	for i, op := range byRet {
		if v, ok := floor(op); ok && (best < 0 || v > mustFloor(floor, byRet[best])) {
			best = i
		}
		maxOp[i] = best
	}
	var out []string
	for _, b := range ops {
		v, ok := observe(b)
		if !ok {
			continue
		}
		// Ops that returned strictly before b was invoked.
		n := sort.Search(len(byRet), func(i int) bool { return byRet[i].returnOrInf() >= b.Call })
		if n == 0 || maxOp[n-1] < 0 {
			continue
		}
		a := byRet[maxOp[n-1]]
		f := mustFloor(floor, a)
		if v < f || (strict && v == f) {
			out = append(out, msg(b, a))
		}
	}
	return out
}

func mustFloor(floor func(Op) (int64, bool), op Op) int64 {
	v, _ := floor(op)
	return v
}

// CheckNoLostUpdate checks a counter workload, in which every Write stores
// the value its Read returned plus one: the final value must equal initial
// plus the number of acknowledged (Ok) writes, plus at most the number of
// writes whose outcome is unknown.
func CheckNoLostUpdate(h History, initial, final int64) []string {
	acked := int64(h.Count(Write, Ok))
	unknown := int64(h.Count(Write, Unknown) + h.Count(Write, Pending))
	lo, hi := initial+acked, initial+acked+unknown
	if final < lo {
		return []string{fmt.Sprintf("lost update: final value %d, but %d writes were acknowledged from %d (expected %d..%d)",
			final, acked, initial, lo, hi)}
	}
	if final > hi {
		return []string{fmt.Sprintf("phantom update: final value %d exceeds %d acknowledged + %d unknown writes from %d",
			final, acked, unknown, initial)}
	}
	return nil
}

// RegisterInput is a porcupine operation's input for [FencedRegisterModel].
type RegisterInput struct {
	Kind  Kind
	Token int64
	Value int64 // the value written
	Claim bool  // a Read that also claims the row for Token
}

// RegisterOutput is a porcupine operation's output for [FencedRegisterModel].
type RegisterOutput struct {
	Outcome  Outcome
	Fenced   bool
	Value    int64 // the value read
	RowToken int64 // the row token a Read saw
}

// RegisterState is the state of the fenced register: its value and fencing
// token.
type RegisterState struct {
	Value int64
	Token int64
}

// FencedRegisterModel returns the porcupine model of one row holding a value
// and a fencing token, starting at initial. A Write with a token lower than
// the row's is rejected (fenced); otherwise it stores its value and token. A
// claiming Read is rejected the same way, or else sets the row's token and
// returns the value. An operation whose outcome is Unknown may have taken
// effect or not.
func FencedRegisterModel(initial RegisterState) porcupine.Model {
	return registerModel(initial, false)
}

// NaiveRegisterModel is [FencedRegisterModel] for a checker that ignores
// faults: it assumes an operation whose outcome is Unknown did not take
// effect. It is wrong on purpose, the negative control showing that a history
// with a write that landed despite a broken connection is flagged.
func NaiveRegisterModel(initial RegisterState) porcupine.Model {
	return registerModel(initial, true)
}

func registerModel(initial RegisterState, unknownFailed bool) porcupine.Model {
	return porcupine.Model{
		Init: func() interface{} { return initial },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			s := state.(RegisterState)
			in := input.(RegisterInput)
			out := output.(RegisterOutput)
			outcome := out.Outcome
			if outcome == Pending {
				outcome = Unknown
			}
			if outcome == Unknown && unknownFailed {
				return true, s
			}
			allowed := s.Token <= in.Token
			switch in.Kind {
			case Read:
				switch outcome {
				case Ok:
					if in.Claim {
						if !allowed || s.Value != out.Value {
							return false, s
						}
						return true, RegisterState{Value: s.Value, Token: in.Token}
					}
					return s.Value == out.Value && s.Token == out.RowToken, s
				case Fail:
					if out.Fenced {
						return !allowed, s
					}
					return true, s
				default: // Unknown
					if in.Claim && allowed {
						return true, RegisterState{Value: s.Value, Token: in.Token}
					}
					return true, s
				}
			case Write:
				switch outcome {
				case Ok:
					if !allowed {
						return false, s
					}
					return true, RegisterState{Value: in.Value, Token: in.Token}
				case Fail:
					if out.Fenced {
						return !allowed, s
					}
					return true, s
				default: // Unknown
					if allowed {
						return true, RegisterState{Value: in.Value, Token: in.Token}
					}
					return true, s
				}
			}
			return true, s
		},
		DescribeOperation: func(input, output interface{}) string {
			in := input.(RegisterInput)
			out := output.(RegisterOutput)
			switch in.Kind {
			case Read:
				verb := "read"
				if in.Claim {
					verb = "claim"
				}
				if out.Outcome == Ok {
					return fmt.Sprintf("%s(t%d) -> %d/t%d", verb, in.Token, out.Value, out.RowToken)
				}
				return fmt.Sprintf("%s(t%d) -> %s%s", verb, in.Token, out.Outcome, fencedMark(out.Fenced))
			default:
				return fmt.Sprintf("write(%d, t%d) -> %s%s", in.Value, in.Token, out.Outcome, fencedMark(out.Fenced))
			}
		},
		DescribeState: func(state interface{}) string {
			s := state.(RegisterState)
			return fmt.Sprintf("value=%d token=%d", s.Value, s.Token)
		},
	}
}

func fencedMark(f bool) string {
	if f {
		return " (fenced)"
	}
	return ""
}

// RegisterOperations converts the Read and Write operations of h to
// porcupine operations for [FencedRegisterModel]. claim says whether Reads
// claim the row (the guarded workload). Operations without an Ok or Fail
// outcome get an infinite return time; a non-claiming Read of unknown
// outcome observed nothing and changed nothing, and is left out.
func RegisterOperations(h History, claim bool) []porcupine.Operation {
	var ops []porcupine.Operation
	for _, op := range h {
		if op.Kind != Read && op.Kind != Write {
			continue
		}
		if op.Kind == Read && !claim && op.Outcome != Ok && op.Outcome != Fail {
			continue
		}
		ops = append(ops, porcupine.Operation{
			ClientId: op.Process,
			Input:    RegisterInput{Kind: op.Kind, Token: op.Token, Value: op.Value, Claim: claim && op.Kind == Read},
			Call:     op.Call,
			Output:   RegisterOutput{Outcome: op.Outcome, Fenced: op.Fenced, Value: op.Value, RowToken: op.RowToken},
			Return:   op.returnOrInf(),
		})
	}
	return ops
}

// CheckOpts configures [Check].
type CheckOpts struct {
	// Name names the scenario in the report.
	Name string
	// Initial is the register's value and token before the workload.
	Initial RegisterState
	// Final is the register's value read after the workload, for the lost
	// update check; nil skips that check.
	Final *int64
	// Claim says the workload's Reads claim the row (guarded mode).
	Claim bool
	// Exclusive adds [CheckMutualExclusion], for locks that never expire.
	Exclusive bool
	// TxScoped says the tokens are drawn inside the holder's transaction
	// (transaction-scoped advisory locks), so a token is durable only once
	// that transaction commits. A grant whose Release (the commit) did not
	// end Ok is left out of the token checks: after a crash its token may
	// be drawn again, harmlessly, since everything done under it rolled
	// back. This hides no real reissue: a committed transaction flushed its
	// token with its commit record, so only an uncommitted grant's token can
	// come back.
	TxScoped bool
	// Model overrides the porcupine model; nil means
	// FencedRegisterModel(Initial).
	Model *porcupine.Model
	// Timeout bounds the linearizability check; zero means DefaultCheckTimeout.
	Timeout time.Duration
	// Dir is where the visualisation is written on a violation; empty means
	// the system's temporary directory.
	Dir string
}

// DefaultCheckTimeout bounds porcupine's search when CheckOpts.Timeout is zero.
const DefaultCheckTimeout = time.Minute

// Report is the verdict on one history.
type Report struct {
	// Name names the scenario.
	Name string
	// Ops is the number of operations in the history.
	Ops int
	// Violations lists every invariant violation found.
	Violations []string
	// Linearizability is porcupine's result on the register operations.
	Linearizability porcupine.CheckResult
	// Visualization is the path of porcupine's HTML visualisation, written
	// when a violation was found.
	Visualization string
	// History is the checked history.
	History History
}

// OK reports whether no violation was found and porcupine proved the
// history linearizable.
func (r *Report) OK() bool {
	return len(r.Violations) == 0 && r.Linearizability == porcupine.Ok
}

// Verdict is "linearizable" when OK, else "violation detected" (or
// "inconclusive" when the only problem is porcupine timing out).
func (r *Report) Verdict() string {
	switch {
	case r.OK():
		return "linearizable"
	case len(r.Violations) == 0 && r.Linearizability == porcupine.Unknown:
		return "inconclusive (checker timed out)"
	default:
		return "violation detected"
	}
}

// Summary is a one-line summary: scenario, operation count and verdict.
func (r *Report) Summary() string {
	return fmt.Sprintf("chaos: scenario=%s ops=%d verdict=%s", r.Name, r.Ops, r.Verdict())
}

// String is the summary, then on failure the violations, the visualisation
// path and the full history.
func (r *Report) String() string {
	var b strings.Builder
	b.WriteString(r.Summary())
	b.WriteByte('\n')
	if r.OK() {
		return b.String()
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  violation: %s\n", v)
	}
	fmt.Fprintf(&b, "  porcupine: %s\n", r.Linearizability)
	if r.Visualization != "" {
		fmt.Fprintf(&b, "  visualisation: %s\n", r.Visualization)
	}
	b.WriteString("  history:\n")
	for _, op := range r.History {
		fmt.Fprintf(&b, "    %s\n", op)
	}
	return b.String()
}

// Check runs every invariant and the linearizability check on h.
func Check(h History, opts *CheckOpts) (*Report, error) {
	var o CheckOpts
	if opts != nil {
		o = *opts
	}
	if o.Name == "" {
		return nil, errors.New("chaos: CheckOpts.Name is required")
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultCheckTimeout
	}
	model := FencedRegisterModel(o.Initial)
	if o.Model != nil {
		model = *o.Model
	}
	r := &Report{Name: o.Name, Ops: len(h), History: h}
	grants := h
	if o.TxScoped {
		grants = WithoutUncommittedGrants(h)
	}
	r.Violations = append(r.Violations, CheckTokensUnique(grants)...)
	r.Violations = append(r.Violations, CheckTokensIncreasing(grants)...)
	r.Violations = append(r.Violations, CheckRowTokenMonotonic(h)...)
	if o.Exclusive {
		r.Violations = append(r.Violations, CheckMutualExclusion(h)...)
	}
	if o.Final != nil {
		r.Violations = append(r.Violations, CheckNoLostUpdate(h, o.Initial.Value, *o.Final)...)
	}
	res, info := porcupine.CheckOperationsVerbose(model, RegisterOperations(h, o.Claim), o.Timeout)
	r.Linearizability = res
	if !r.OK() {
		dir := o.Dir
		if dir == "" {
			dir = os.TempDir()
		}
		f, err := os.CreateTemp(dir, "pgfence-chaos-"+sanitizeFileName(o.Name)+"-*.html")
		if err != nil {
			return r, fmt.Errorf("chaos: create visualisation file: %w", err)
		}
		path := f.Name()
		verr := porcupine.Visualize(model, info, f)
		if cerr := f.Close(); verr == nil {
			verr = cerr
		}
		if verr != nil {
			return r, fmt.Errorf("chaos: write visualisation: %w", verr)
		}
		r.Visualization, _ = filepath.Abs(path)
	}
	return r, nil
}

func sanitizeFileName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}
