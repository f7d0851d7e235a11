package proxy

import (
	"github.com/confshim/confshim/internal/syncmachine"
	"github.com/confshim/confshim/rewrite"
)

// Which item a sync touched, and which controller sync it was (contract §7): the ids
// each section it changed added, changed, removed and held back, and the client's
// correlation (W3C traceparent or X-Request-Id, forwarded to APISIX unchanged as every
// other header) or confshim's own sync id. Never a value.

// touchedIDs lists, per section, what the accepted PUTs of a sync changed by id (a
// second step's PUT after the first: what each took from its body), and the items
// held back after the last; taken under the lock (immutable values and the forwarded
// bodies) and compared after it.
func touchedIDs(puts []syncmachine.Touched, rw *rewrite.Rewriter) []rewrite.ItemChanges {
	var out []rewrite.ItemChanges
	index := map[string]int{}
	for i, t := range puts {
		changes := fromBody(t, rw)
		if i == len(puts)-1 {
			changes = withHeld(changes, t.Held)
		}
		for _, c := range changes {
			at, seen := index[c.Section]
			switch {
			case !seen && len(out) == maxDebugSections:
				continue
			case !seen:
				index[c.Section] = len(out)
				out = append(out, c)
			default:
				out[at] = c // the later PUT's view of the section
			}
		}
	}
	kept := out[:0]
	for _, c := range out {
		if !c.Empty() {
			kept = append(kept, c)
		}
	}
	return kept
}

// withHeld adds the held items to their sections' changes.
func withHeld(out []rewrite.ItemChanges, held []syncmachine.HeldItem) []rewrite.ItemChanges {
	index := map[string]int{}
	for i, c := range out {
		index[c.Section] = i
	}
	for _, h := range held {
		i, ok := index[rewrite.Clip(h.Section)]
		if !ok {
			if len(out) == maxDebugSections {
				continue
			}
			i = len(out)
			index[rewrite.Clip(h.Section)] = i
			out = append(out, rewrite.ItemChanges{Section: rewrite.Clip(h.Section)})
		}
		out[i].HeldItem(h.ID)
	}
	return out
}

// fromBody diffs each section whose items APISIX took from the body (bumped, applied,
// merged, backfilled) against the items before the PUT (unknown when confshim did not
// know them); settled, raised and thin sections cost nothing.
func fromBody(t syncmachine.Touched, rw *rewrite.Rewriter) []rewrite.ItemChanges {
	if t.Res == nil || t.After == nil || !t.After.IsJSON() {
		return nil
	}
	before := t.Before
	if before == nil && t.DecidedOn != nil && t.DecidedOn.ItemsKnown {
		before = t.DecidedOn
	}
	var out []rewrite.ItemChanges
	for _, o := range t.Res.Outcomes() {
		if !o.FromBody || len(out) == maxDebugSections {
			continue
		}
		c := rewrite.ItemChanges{Section: rewrite.Clip(o.Section), Unknown: true}
		if before != nil {
			items, _ := t.After.JSONItems(o.Section)
			c = rw.DiffItems(o.Section, before.Items[o.Section], items)
		}
		out = append(out, c)
	}
	return out
}
