package rewrite

import "bytes"

// Which items a sync touched (contract §7): per section it changed, the ids added,
// changed and removed, compared as §8.1 compares content — an item's top-level
// modifiedIndex is not content, and an id's position does not matter. Only sections that
// change are compared, so a settled, raised or thin section costs nothing here.

// maxListedIDs bounds each list of ids; ids are cut at 64 bytes (§5.7).
const maxListedIDs = 20

// IDList is a bounded list of ids with the count of all of them.
type IDList struct {
	IDs   []string `json:"ids,omitempty"`
	Count int      `json:"count"`
}

func (l *IDList) add(id string) {
	l.Count++
	if len(l.IDs) < maxListedIDs {
		l.IDs = append(l.IDs, clip(id))
	}
}

// Has reports whether id is listed.
func (l *IDList) Has(id string) bool {
	for _, x := range l.IDs {
		if x == id {
			return true
		}
	}
	return false
}

// ItemChanges is what one sync did to one section's items.
type ItemChanges struct {
	Section string `json:"section"`
	Added   IDList `json:"added"`
	Changed IDList `json:"changed"`
	Removed IDList `json:"removed"`
	Held    IDList `json:"held_back"`
	// Unknown: the section changed but the items it held before are not known (no kept
	// configuration describes them), so no lists.
	Unknown bool `json:"unknown,omitempty"`
}

// Empty: nothing listed.
func (c *ItemChanges) Empty() bool {
	return c.Added.Count+c.Changed.Count+c.Removed.Count+c.Held.Count == 0 && !c.Unknown
}

// Touches reports whether id is in one of the lists.
func (c *ItemChanges) Touches(id string) bool {
	return c.Added.Has(id) || c.Changed.Has(id) || c.Removed.Has(id) || c.Held.Has(id)
}

// DiffItems compares a section's items before and after a sync by id. The items both
// sides hold byte for byte at the same place — the common head and tail, which is all
// but the changed items when a client keeps the bytes of what it did not touch, as ADC
// does — are passed over without reading them; only the items between are read for
// their ids, and those whose bytes differ fingerprinted. Items without an id cannot be
// told apart and are not listed.
func (rw *Rewriter) DiffItems(section string, before, after []byte) ItemChanges {
	out := ItemChanges{Section: clip(section)}
	if bytes.Equal(before, after) {
		return out
	}
	old, err1 := rawItems(section, before)
	cur, err2 := rawItems(section, after)
	if err1 != nil || err2 != nil {
		out.Unknown = true
		return out
	}
	old, cur = trimCommon(old, cur)
	byID := make(map[string][]byte, len(old))
	oldIDs := make([]string, len(old))
	for i, raw := range old {
		if oldIDs[i] = itemID(section, raw); oldIDs[i] != "" {
			byID[oldIDs[i]] = raw
		}
	}
	seen := make(map[string]bool, len(cur))
	for _, raw := range cur {
		id := itemID(section, raw)
		if id == "" || seen[id] {
			continue
		}
		seen[id] = true
		prev, had := byID[id]
		switch {
		case !had:
			out.Added.add(id)
		case bytes.Equal(prev, raw):
		case rw.ItemFingerprint(prev) != rw.ItemFingerprint(raw):
			out.Changed.add(id)
		}
	}
	for _, id := range oldIDs {
		if id != "" && !seen[id] {
			seen[id] = true
			out.Removed.add(id)
		}
	}
	return out
}

// trimCommon drops the items both lists start and end with, byte for byte.
func trimCommon(old, cur [][]byte) ([][]byte, [][]byte) {
	head := 0
	for head < len(old) && head < len(cur) && bytes.Equal(old[head], cur[head]) {
		head++
	}
	tail := 0
	for tail < len(old)-head && tail < len(cur)-head && bytes.Equal(old[len(old)-1-tail], cur[len(cur)-1-tail]) {
		tail++
	}
	return old[head : len(old)-tail], cur[head : len(cur)-tail]
}

// HeldItem adds an item held back (§8.5) to the section's lists.
func (c *ItemChanges) HeldItem(id string) { c.Held.add(id) }
