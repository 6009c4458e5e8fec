package chaos

import (
	"fmt"
	"math"
	"sort"
)

// CheckPermitCap reports every moment at which more than n permits were
// validly held at once. Each successful Acquire's Name is a permit's lease
// name; a holder's permit is valid from the grant's return to its next
// Release's invocation, or until the next grant of the same permit (whose
// newer token fences it out), whichever comes first; a grant never released
// stays valid until then. Permits of one semaphore only: name the history's
// grants of one semaphore.
func CheckPermitCap(h History, n int) []string {
	byName := map[string][]Op{}
	for _, op := range h {
		if op.Kind == Acquire && op.Outcome == Ok {
			byName[op.Name] = append(byName[op.Name], op)
		}
	}
	type edge struct {
		at    int64
		delta int
		op    Op
	}
	var edges []edge
	for _, grants := range byName {
		sort.Slice(grants, func(i, j int) bool { return grants[i].Return < grants[j].Return })
		for i, g := range grants {
			end := int64(math.MaxInt64)
			for _, op := range h {
				if op.Kind == Release && op.Process == g.Process && op.Name == g.Name && op.Token == g.Token && op.Call >= g.Return {
					end = op.Call
					break
				}
			}
			if i+1 < len(grants) {
				end = min(end, grants[i+1].Return)
			}
			if end > g.Return {
				edges = append(edges, edge{g.Return, 1, g}, edge{end, -1, g})
			}
		}
	}
	// Ends before starts at one instant: a hand-over is not an overlap.
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].delta < edges[j].delta
	})
	var out []string
	held := 0
	for _, e := range edges {
		held += e.delta
		if e.delta > 0 && held > n {
			out = append(out, fmt.Sprintf("%d permits valid at once (cap %d) when #%d (p%d %q, token %d) was granted",
				held, n, e.op.Index, e.op.Process, e.op.Name, e.op.Token))
		}
	}
	return out
}
