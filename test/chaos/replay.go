package chaos

import (
	"fmt"
	"sort"
)

// ReplayModel replays h through the transition rules of the protocol model
// (model/pgfence.pml, model/README.md) and reports every step the model
// forbids, named after the property the model asserts at that step:
//
//   - P2_tokens_grow (the model's acknowledge and drawn): no token is
//     acknowledged in two grants, and a grant's token is greater than every
//     token acknowledged in a grant before the grant was invoked, whatever
//     the names: the model's one sequence;
//   - P1_guard_sound (lands): a write that landed, or with opts.Claim a
//     claiming read, presented a token granted to its own process before it
//     was invoked (issued, and not forged), not below the row's token as
//     established before it was invoked (by acknowledged writes and claims,
//     and the row tokens reads saw);
//   - P3_register_monotonic (lands, for a holder): a write that landed
//     presented a token not below that of every write to the row
//     acknowledged before it was invoked;
//   - release (drop): a release that took effect presented a token granted
//     to its process.
//
// Rows are told apart by the operations' Name (the chaos workloads' one
// register has none; the Patroni suite names a row after its lock). An
// operation whose outcome is unknown neither counts as acknowledged nor is
// checked. With opts.TxScoped the grants whose transaction is not known to
// have committed are left out, as in [Check]. Times are compared as
// [CheckRowTokenMonotonic] does: what returned strictly before an
// operation's invocation came before it.
func ReplayModel(h History, opts *CheckOpts) []string {
	var o CheckOpts
	if opts != nil {
		o = *opts
	}
	if o.TxScoped {
		h = WithoutUncommittedGrants(h)
	}
	type event struct {
		at       int64
		complete bool
		op       Op
	}
	evs := make([]event, 0, 2*len(h))
	for _, op := range h {
		evs = append(evs, event{at: op.Call, op: op})
		if op.Outcome == Ok {
			evs = append(evs, event{at: op.Return, complete: true, op: op})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return !evs[i].complete && evs[j].complete
	})

	type floor struct {
		tok int64
		by  Op
	}
	var (
		out      []string
		maxAcked floor
		ackedBy  = map[int64]Op{}
		granted  = map[int]map[int64]bool{}
		wfloor   = map[string]floor{} // largest token of an acknowledged write, per row
		rfloor   = map[string]floor{} // the row's token as established, per row
		// what held at each operation's invocation
		atCall = map[int]struct {
			acked, w, r floor
			issued      bool
		}{}
	)
	raise := func(m map[string]floor, row string, tok int64, by Op) {
		if tok > m[row].tok {
			m[row] = floor{tok, by}
		}
	}
	lands := func(op Op) bool { return op.Kind == Write || (op.Kind == Read && o.Claim) }
	for _, e := range evs {
		op := e.op
		if !e.complete {
			s := atCall[op.Index]
			s.acked, s.w, s.r = maxAcked, wfloor[op.Name], rfloor[op.Name]
			s.issued = granted[op.Process][op.Token]
			atCall[op.Index] = s
			continue
		}
		s := atCall[op.Index]
		switch {
		case op.Kind == Acquire && op.Token != 0:
			if prev, ok := ackedBy[op.Token]; ok {
				out = append(out, fmt.Sprintf("P2_tokens_grow: token %d acknowledged in two grants: #%d (p%d %q) and #%d (p%d %q)",
					op.Token, prev.Index, prev.Process, prev.Name, op.Index, op.Process, op.Name))
			} else if op.Token <= s.acked.tok {
				out = append(out, fmt.Sprintf("P2_tokens_grow: grant #%d (p%d %q) drew token %d, not above token %d acknowledged before it by #%d (p%d %q)",
					op.Index, op.Process, op.Name, op.Token, s.acked.tok, s.acked.by.Index, s.acked.by.Process, s.acked.by.Name))
			}
			ackedBy[op.Token] = op
			if op.Token > maxAcked.tok {
				maxAcked = floor{op.Token, op}
			}
			if granted[op.Process] == nil {
				granted[op.Process] = map[int64]bool{}
			}
			granted[op.Process][op.Token] = true
		case lands(op):
			switch {
			case op.Token == 0 || !s.issued:
				out = append(out, fmt.Sprintf("P1_guard_sound: %s #%d (p%d) landed with token %d, not granted to p%d before it",
					op.Kind, op.Index, op.Process, op.Token, op.Process))
			case op.Token < s.r.tok:
				out = append(out, fmt.Sprintf("P1_guard_sound: %s #%d (p%d) landed with token %d below the row's token %d (established by #%d)",
					op.Kind, op.Index, op.Process, op.Token, s.r.tok, s.r.by.Index))
			}
			if op.Kind == Write && op.Token < s.w.tok {
				out = append(out, fmt.Sprintf("P3_register_monotonic: write #%d (p%d) landed with token %d after write #%d (p%d) with token %d was acknowledged",
					op.Index, op.Process, op.Token, s.w.by.Index, s.w.by.Process, s.w.tok))
			}
			if op.Kind == Write {
				raise(wfloor, op.Name, op.Token, op)
			}
			raise(rfloor, op.Name, op.Token, op)
		case op.Kind == Read:
			raise(rfloor, op.Name, op.RowToken, op)
		case op.Kind == Release && op.Token != 0 && !granted[op.Process][op.Token]:
			out = append(out, fmt.Sprintf("release: #%d (p%d %q) released with token %d, never granted to p%d",
				op.Index, op.Process, op.Name, op.Token, op.Process))
		}
	}
	return out
}
