package patroni

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/pgfence/pgfence/test/chaos"
)

// Violations are the invariant violations found in one run, by kind.
type Violations struct {
	// TokensTwice: a fencing token granted more than once (any names).
	TokensTwice []string
	// TokensNotIncreasing: per name, a later grant with a token not greater.
	TokensNotIncreasing []string
	// OverlappingHolds: two holders of one name that both believed they
	// held it at the same time.
	OverlappingHolds []string
	// AcceptedBelowAcked: an accepted write (in the audit trail) whose
	// token is older than that of a write of the same resource
	// acknowledged before it was invoked. Zombie writes are counted in
	// ZombiesAccepted instead.
	AcceptedBelowAcked []string
	// ZombiesAccepted: a write by a holder that knew it had lost its lock,
	// accepted although a write of the same resource had been acknowledged
	// before it was invoked with a newer token, or by a holder granted the
	// lock after the zombie's grant (a later holder whose token, reissued,
	// is not greater).
	ZombiesAccepted []string
	// AckedLost: an acknowledged write missing from the final audit trail.
	AckedLost []string
	// FailedPresent: a write recorded as certainly failed that is in the
	// audit trail (the suite's classification would be wrong).
	FailedPresent []string
	// RowMismatch: a row whose value is not the number of its audit rows.
	RowMismatch []string
	// AdvisoryToldLate: an advisory holder still believing it held its
	// lock when the new primary was seen writable.
	AdvisoryToldLate []string

	// AdvisoryBeliefLag lists, not as violations, the advisory holders
	// that a fault cut off and that still believed they held their lock
	// when another holder was granted it (see [CheckOverlappingHolds]).
	AdvisoryBeliefLag []string
}

// kinds lists the violation kinds with their names, in report order.
func (v *Violations) kinds() []struct {
	name string
	list *[]string
} {
	return []struct {
		name string
		list *[]string
	}{
		{"tokens granted twice", &v.TokensTwice},
		{"tokens not increasing", &v.TokensNotIncreasing},
		{"overlapping holds", &v.OverlappingHolds},
		{"accepted writes below an acknowledged token", &v.AcceptedBelowAcked},
		{"zombie writes accepted", &v.ZombiesAccepted},
		{"acknowledged writes lost", &v.AckedLost},
		{"failed writes present", &v.FailedPresent},
		{"rows disagreeing with their audit trail", &v.RowMismatch},
		{"advisory holders told after the new primary was writable", &v.AdvisoryToldLate},
	}
}

// Total is the number of violations of every kind.
func (v *Violations) Total() int {
	n := 0
	for _, k := range v.kinds() {
		n += len(*k.list)
	}
	return n
}

// Counts is a one-line count per kind.
func (v *Violations) Counts() string {
	var parts []string
	for _, k := range v.kinds() {
		parts = append(parts, fmt.Sprintf("%s=%d", strings.ReplaceAll(k.name, " ", "_"), len(*k.list)))
	}
	return strings.Join(parts, " ")
}

// String lists the violations, at most max per kind.
func (v *Violations) String() string {
	const max = 10
	var b strings.Builder
	for _, k := range v.kinds() {
		l := *k.list
		if len(l) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s: %d\n", k.name, len(l))
		for i, s := range l {
			if i == max {
				fmt.Fprintf(&b, "  ... %d more\n", len(l)-max)
				break
			}
			fmt.Fprintf(&b, "  %s\n", s)
		}
	}
	return b.String()
}

// Check runs the invariants on a run's history, holds and final state.
// resources maps lock names to their resource ids; faults are the times
// the faults struck (see [CheckOverlappingHolds]).
func Check(h chaos.History, holds []Hold, final *Final, resources map[string]int, faults []time.Duration) *Violations {
	v := &Violations{}
	v.TokensTwice = chaos.CheckTokensUnique(h)
	v.TokensNotIncreasing = chaos.CheckTokensIncreasing(h)
	v.OverlappingHolds, v.AdvisoryBeliefLag = CheckOverlappingHolds(holds, faults)
	checkWrites(v, h, final, resources)
	return v
}

// CheckOverlappingHolds reports every pair of holds of one name by
// different holders that overlap: each holder believed it held the lock
// from its Acquire's return until it learned of a loss or started to
// release it.
//
// One exception: an advisory lock lives in its database session, and a
// holder whose session a fault ended (the server shut down or died) learns
// of it only at its next session check. Such a hold (advisory, lost at or
// after a fault struck, held when it struck) counts until the fault struck:
// the server may have ended the session, and so released the lock, any time
// after that. The overlaps that this forgives, where another holder was
// granted the lock (on the same server, as it shut down) before the first
// learned of its loss, are returned as lag, not as violations; the suite
// checks separately that every such holder learned of its loss before the
// new primary was writable ([CheckToldBefore]).
func CheckOverlappingHolds(holds []Hold, faults []time.Duration) (violations []string, lag []string) {
	byName := map[string][]Hold{}
	for _, h := range holds {
		byName[h.Name] = append(byName[h.Name], h)
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		hs := byName[name]
		sort.Slice(hs, func(i, j int) bool { return hs[i].From < hs[j].From })
		for i := range hs {
			end := hs[i].To
			if hs[i].Strategy == "advisory" && hs[i].LostAt != 0 {
				for _, f := range faults {
					if hs[i].From <= f && f <= hs[i].LostAt {
						end = f
						break
					}
				}
			}
			for j := i + 1; j < len(hs) && hs[j].From < hs[i].To; j++ {
				if hs[i].Process == hs[j].Process {
					continue
				}
				msg := fmt.Sprintf("lock %q: p%d (token %d, from %v) and p%d (token %d, from %v) held it at once; the first held until %s",
					name, hs[i].Process, hs[i].Token, ms(hs[i].From), hs[j].Process, hs[j].Token, ms(hs[j].From), until(hs[i].To))
				if hs[j].From < end {
					violations = append(violations, msg)
				} else {
					lag = append(lag, msg+" (its session ended by a fault)")
				}
			}
		}
	}
	return violations, lag
}

// checkWrites compares the recorded writes with the audit trail.
func checkWrites(v *Violations, h chaos.History, final *Final, resources map[string]int) {
	writes := map[int64]chaos.Op{}
	var acked []chaos.Op
	type grantKey struct {
		process int
		token   int64
	}
	grants := map[grantKey]chaos.Op{}
	for _, op := range h {
		if op.Kind == chaos.Acquire && op.Outcome == chaos.Ok {
			grants[grantKey{op.Process, op.Token}] = op
		}
		if op.Kind != chaos.Write {
			continue
		}
		writes[op.Value] = op
		if op.Outcome == chaos.Ok {
			acked = append(acked, op)
		}
	}
	audited := map[int64]AuditRow{}
	count := map[int]int64{}
	for _, a := range final.Audit {
		audited[a.WriteID] = a
		count[a.Resource]++
	}
	for _, op := range acked {
		if _, ok := audited[op.Value]; !ok {
			v.AckedLost = append(v.AckedLost, fmt.Sprintf("write #%d (p%d, %q, token %d, acknowledged at %v) is not in the audit trail",
				op.Value, op.Process, op.Name, op.Token, ms(time.Duration(op.Return))))
		}
	}
	// For each resource, the acknowledged writes in the order of their
	// acknowledgement, with the newest token up to each.
	// ack is an acknowledged write (op), with the newest token (and its
	// write) among the acknowledged writes of its resource up to it.
	type ack struct {
		ret   int64
		op    chaos.Op
		token int64
		maxOp chaos.Op
	}
	acks := map[string][]ack{}
	for _, op := range acked {
		acks[op.Name] = append(acks[op.Name], ack{ret: op.Return, op: op, token: op.Token, maxOp: op})
	}
	for name, l := range acks {
		sort.Slice(l, func(i, j int) bool { return l[i].ret < l[j].ret })
		for i := 1; i < len(l); i++ {
			if l[i].token < l[i-1].token {
				l[i].token, l[i].maxOp = l[i-1].token, l[i-1].maxOp
			}
		}
		acks[name] = l
	}
	ids := make([]int64, 0, len(audited))
	for id := range audited {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		a := audited[id]
		op, ok := writes[id]
		if !ok {
			continue
		}
		if op.Outcome == chaos.Fail {
			v.FailedPresent = append(v.FailedPresent, fmt.Sprintf("write #%d (p%d, %q, token %d) failed (%s) but is in the audit trail",
				id, op.Process, op.Name, op.Token, op.Err))
		}
		l := acks[op.Name]
		n := sort.Search(len(l), func(i int) bool { return l[i].ret >= op.Call })
		if n == 0 || l[n-1].token <= a.Token {
			if !op.Lost {
				continue
			}
			// A zombie: was a later holder's write acknowledged first?
			gz, ok := grants[grantKey{op.Process, op.Token}]
			if !ok {
				continue
			}
			for _, b := range l[:n] {
				gb, ok := grants[grantKey{b.op.Process, b.op.Token}]
				if ok && b.op.Process != op.Process && gb.Call > gz.Return {
					v.ZombiesAccepted = append(v.ZombiesAccepted, fmt.Sprintf(
						"zombie write #%d (p%d, %q, token %d granted at %v, invoked at %v) accepted after write #%d (p%d, token %d granted later, at %v) had been acknowledged at %v",
						id, op.Process, op.Name, op.Token, ms(time.Duration(gz.Return)), ms(time.Duration(op.Call)),
						b.op.Value, b.op.Process, b.op.Token, ms(time.Duration(gb.Return)), ms(time.Duration(b.op.Return))))
					break
				}
			}
			continue
		}
		prev := l[n-1].maxOp
		msg := fmt.Sprintf("write #%d (p%d, %q, token %d, invoked at %v) accepted after write #%d (p%d, token %d) had been acknowledged at %v",
			id, op.Process, op.Name, a.Token, ms(time.Duration(op.Call)), prev.Value, prev.Process, prev.Token, ms(time.Duration(prev.Return)))
		if op.Lost {
			v.ZombiesAccepted = append(v.ZombiesAccepted, msg)
		} else {
			v.AcceptedBelowAcked = append(v.AcceptedBelowAcked, msg)
		}
	}
	for name, res := range resources {
		row, ok := final.Rows[res]
		if !ok {
			v.RowMismatch = append(v.RowMismatch, fmt.Sprintf("resource %d (%q) has no row", res, name))
			continue
		}
		if row[0] != count[res] {
			v.RowMismatch = append(v.RowMismatch, fmt.Sprintf("resource %d (%q) has value %d but %d audit rows", res, name, row[0], count[res]))
		}
	}
}

// Told is the verdict of [CheckToldBefore].
type Told struct {
	// Held is the number of holds open when the fault struck; Told the
	// number of them that ended before the new primary was writable.
	Held, Told int
	// MinMargin is the smallest time from a hold's end to the new primary
	// being writable; negative when no hold was open.
	MinMargin time.Duration
	// Late describes each hold that ended only later.
	Late []string
}

// CheckToldBefore checks that every hold of strategy open at the fault's
// time (granted before at, not ended by then) ended, with its holder
// learning of the loss or releasing, before writable: the new primary,
// where another holder can be granted the lock, was seen writable.
func CheckToldBefore(holds []Hold, strategy string, at, writable time.Duration) Told {
	r := Told{MinMargin: -1}
	for _, h := range holds {
		if h.Strategy != strategy || h.From > at || h.To <= at {
			continue
		}
		r.Held++
		if h.To < writable {
			r.Told++
			if m := writable - h.To; r.MinMargin < 0 || m < r.MinMargin {
				r.MinMargin = m
			}
			continue
		}
		r.Late = append(r.Late, fmt.Sprintf("p%d held %q (token %d) from %v until %s; the new primary was writable at %v",
			h.Process, h.Name, h.Token, ms(h.From), until(h.To), ms(writable)))
	}
	return r
}

// ZombieStats counts the zombies by the outcome of their last write
// attempt: fenced, accepted (a violation only when Check says so: with no
// later holder's write before it, a late write is what fencing allows), or
// unknown or failed.
type ZombieStats struct {
	Zombies, Fenced, Accepted, Other int
	// Last is each zombie's last write attempt, in invocation order.
	Last []chaos.Op
}

// Zombies counts the zombies in h.
func Zombies(h chaos.History) ZombieStats {
	var z ZombieStats
	last := map[[2]int64]chaos.Op{}
	for _, op := range h {
		if op.Kind == chaos.Write && op.Lost {
			last[[2]int64{int64(op.Process), op.Token}] = op
		}
	}
	for _, op := range last {
		z.Last = append(z.Last, op)
	}
	sort.Slice(z.Last, func(i, j int) bool { return z.Last[i].Index < z.Last[j].Index })
	for _, op := range z.Last {
		z.Zombies++
		switch {
		case op.Fenced:
			z.Fenced++
		case op.Outcome == chaos.Ok:
			z.Accepted++
		default:
			z.Other++
		}
	}
	return z
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

func until(d time.Duration) string {
	if d == 1<<63-1 {
		return "the end"
	}
	return ms(d)
}
