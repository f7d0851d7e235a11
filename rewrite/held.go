package rewrite

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"time"
)

// §8.5's choices about items held back, pure: which items a body carries again that
// APISIX is known to reject (held again at once, or validated alone first when the
// rejection depends on what the data plane holds), when the last correction serves
// again as it is, which accepted copies must be validated before they backfill, and
// how held items are named in a digest. The fallback (internal/syncmachine) asks, sends
// and waits; it decides nothing of this itself.

// HeldItem is one item held back: what the client's answer names, and what the next
// syncs need to hold it again.
type HeldItem struct {
	Section, ID string
	Error       string    // APISIX's, cut for the log and /debug/config
	Since       time.Time // when it was first held back (the same content since)
	Backfilled  bool      // replaced by its accepted copy; false: left out
	Sum         uint64    // the client's item's content (ItemFingerprint): the same content is held again
	Raw         []byte    // the client's item (state-dependent ones are validated again)
	Server      string    // APISIX's version when it rejected the item
	// DependsOnState: rejected for what the data plane holds (a plugin another global
	// rule uses, a key another consumer holds), not for what the item is
	DependsOnState bool
}

// HeldKey is the one spelling of an item's key among held items.
func HeldKey(section, id string) string { return section + "\x00" + id }

// Key is the item's HeldKey.
func (h HeldItem) Key() string { return HeldKey(h.Section, h.ID) }

// Correction is the last correction made before a PUT: per held section, the hash of
// the client's bytes and the corrected items, on APISIX version Server.
type Correction struct {
	Server   string
	Sections map[string]sectionCorrection
}

// Recheck is what a sync learnt by validating held items alone (HeldKey → passes now);
// an item it names is not validated again in the same sync.
type Recheck map[string]bool

// StillRejected matches the known held items to the plan's body, by id and content
// (§8.1's identity: a re-stamped modifiedIndex does not count), on the same APISIX: an
// item sent again unchanged and rejected for what it is is held again at once (hold);
// one rejected for what the data plane holds must first be validated alone (check),
// unless recheck already says whether it passes. A changed item, or one rejected by
// another APISIX version, goes as sent and APISIX judges it. Sections are visited in
// order, so the outcome does not depend on map order.
func (rw *Rewriter) StillRejected(pl *Plan, known map[string]HeldItem, server string, recheck Recheck) (hold, check []Rejection) {
	sections := make([]string, 0, len(known))
	for _, h := range known {
		sections = append(sections, h.Section)
	}
	slices.Sort(sections)
	for _, section := range slices.Compact(sections) {
		for i, it := range pl.Items(section) {
			h, ok := known[HeldKey(section, it.ID)]
			if !ok || it.ID == "" || h.Server != server || h.Sum != rw.ItemFingerprint(it.Raw) {
				continue
			}
			r := Rejection{Section: section, Index: i, Error: h.Error}
			passes, rechecked := recheck[h.Key()]
			switch {
			case !h.DependsOnState:
				hold = append(hold, r)
			case !rechecked:
				check = append(check, r)
			case !passes:
				hold = append(hold, r)
			}
		}
	}
	return hold, check
}

// ReuseCorrection is §8.5's steady state at its cheapest: the correction made before
// the last accepted PUT, applied again when every section with a known held item
// carries the very client bytes it was made for, on the same APISIX, and none waits
// for what the data plane holds (that one is validated again instead). false when it
// does not serve.
func (p *Prepared) ReuseCorrection(c *Correction, server string, known map[string]HeldItem) ([]byte, bool) {
	if c == nil || c.Server != server || len(known) == 0 {
		return nil, false
	}
	corrections := make(map[string]sectionCorrection, len(c.Sections))
	for _, h := range known {
		if h.DependsOnState {
			return nil, false
		}
		sc, ok := c.Sections[h.Section]
		if !ok {
			return nil, false
		}
		corrections[h.Section] = sc
	}
	return p.Reapply(corrections)
}

// CorrectionOf is the correction of a body corrected before its PUT, kept for the same
// client bytes next time (nil when a held section cannot be kept so).
func CorrectionOf(client, corrected *Prepared, held []HeldItem, server string) *Correction {
	c := &Correction{Server: server, Sections: map[string]sectionCorrection{}}
	for _, section := range HeldSections(held) {
		sum, ok := client.SectionSum(section)
		items, _ := corrected.JSONItems(section)
		if !ok || items == nil {
			return nil
		}
		c.Sections[section] = sectionCorrection{ClientSum: sum, Items: slices.Clone(items)}
	}
	return c
}

// SectionCopies are the accepted copies of one section that rejected items would be
// backfilled with, in the order the rejections named them.
type SectionCopies struct {
	Section string
	IDs     []string
	Raws    [][]byte
}

// CopiesToCheck are the accepted copies the rejected items would be backfilled with,
// by section in order: a copy the data plane refuses too (a key another consumer now
// holds, on 3.18) would fail the corrected PUT the same way, so it is validated first.
func (pl *Plan) CopiesToCheck(found []Rejection, accepted *Accepted) []SectionCopies {
	var out []SectionCopies
	at := map[string]int{}
	for _, r := range found {
		items := pl.Items(r.Section)
		if r.Index < 0 || r.Index >= len(items) || items[r.Index].ID == "" {
			continue
		}
		raw, ok := accepted.Lookup(r.Section, items[r.Index].ID)
		if !ok {
			continue
		}
		i, seen := at[r.Section]
		if !seen {
			i = len(out)
			at[r.Section] = i
			out = append(out, SectionCopies{Section: r.Section})
		}
		out[i].IDs = append(out[i].IDs, items[r.Index].ID)
		out[i].Raws = append(out[i].Raws, raw)
	}
	slices.SortFunc(out, func(a, b SectionCopies) int { return strings.Compare(a.Section, b.Section) })
	return out
}

// RefuseCopies marks the copies validate rejected (errs index copies' items) as ones the
// data plane refuses: their items are left out instead of backfilled.
func (a *Accepted) RefuseCopies(copies SectionCopies, errs []Rejection) {
	for _, e := range errs {
		if e.Index >= 0 && e.Index < len(copies.IDs) {
			a.Refuse(copies.Section, copies.IDs[e.Index])
		}
	}
}

// MergeHeld adds the newly held items to held, an item held again (its copy refused:
// now left out) replacing its earlier entry.
func MergeHeld(held, more []HeldItem) []HeldItem {
	for _, h := range more {
		i := slices.IndexFunc(held, func(o HeldItem) bool { return o.Section == h.Section && o.ID == h.ID })
		if i >= 0 {
			held[i] = h
			continue
		}
		held = append(held, h)
	}
	return held
}

// CorrectionHash makes a corrected PUT's digest differ from the client's body's, and
// one correction's from another's.
func CorrectionHash(held []HeldItem) string {
	keys := make([]string, len(held))
	for i, h := range held {
		keys[i] = h.Key() + "\x00" + strconv.FormatBool(h.Backfilled)
	}
	slices.Sort(keys)
	sum := sha256.Sum256([]byte(strings.Join(keys, "\n")))
	return hex.EncodeToString(sum[:8])
}

// HeldSections are the sections with a held item, sorted, each once.
func HeldSections(held []HeldItem) []string {
	out := make([]string, 0, len(held))
	for _, h := range held {
		out = append(out, h.Section)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
