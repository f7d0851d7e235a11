package proxy

import (
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/rewrite"
)

// Which item a sync touched, and which controller sync it was (contract §7): the ids
// each section it changed added, changed, removed and held back, and the client's
// correlation (W3C traceparent or X-Request-Id, forwarded to APISIX unchanged as every
// other header) or confshim's own sync id. Never a value.

// touchedItems is what an accepted sync needs to list the items it touched, taken under
// the lock (immutable values and the forwarded body) and compared after it.
type touchedItems struct {
	before    *rewrite.State    // the data plane's items before the PUT: the kept configuration's
	decidedOn *rewrite.State    // else the state the sync was decided on, when it had items
	res       *rewrite.Result   // which sections took their items from the body
	after     *rewrite.Prepared // what APISIX took
	held      []dataplane.Held
}

// diff lists, per section whose items APISIX took from the body (bumped, applied,
// merged, backfilled), what changed by id; settled, raised and thin sections cost
// nothing. Held items are listed with their section.
func (t touchedItems) diff(rw *rewrite.Rewriter) []rewrite.ItemChanges {
	if t.res == nil && len(t.held) == 0 {
		return nil
	}
	out, index := t.fromBody(rw)
	for _, h := range t.held {
		i, ok := index[h.Section]
		if !ok {
			if len(out) == maxDebugSections {
				continue
			}
			i = len(out)
			index[h.Section] = i
			out = append(out, rewrite.ItemChanges{Section: rewrite.Clip(h.Section)})
		}
		out[i].HeldItem(h.ID)
	}
	kept := out[:0]
	for _, c := range out {
		if !c.Empty() {
			kept = append(kept, c)
		}
	}
	return kept
}

// fromBody diffs each section whose items APISIX took from the body against the items
// before the PUT (unknown when confshim did not know them), and indexes them by section.
func (t touchedItems) fromBody(rw *rewrite.Rewriter) ([]rewrite.ItemChanges, map[string]int) {
	index := map[string]int{}
	if t.res == nil || t.after == nil || !t.after.IsJSON() {
		return nil, index
	}
	before := t.before
	if before == nil && t.decidedOn != nil && t.decidedOn.ItemsKnown {
		before = t.decidedOn
	}
	var out []rewrite.ItemChanges
	for _, o := range t.res.Outcomes() {
		if !o.FromBody || len(out) == maxDebugSections {
			continue
		}
		c := rewrite.ItemChanges{Section: rewrite.Clip(o.Section), Unknown: true}
		if before != nil {
			items, _ := t.after.JSONItems(o.Section)
			c = rw.DiffItems(o.Section, before.Items[o.Section], items)
		}
		index[o.Section] = len(out)
		out = append(out, c)
	}
	return out, index
}
