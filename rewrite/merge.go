package rewrite

import (
	"bytes"
	"fmt"
	"github.com/confshim/confshim/internal/sections"
	"slices"
)

// Shared sections (contract §8.6): in a --merge section the client owns the ids it has
// sent; an owned item follows the client's snapshot, an item the client never sent is
// kept as the data plane holds it. The section goes to APISIX as the union — the
// client's items byte for byte, then the kept ones as the data plane returned them — at
// the version §5.1 gives for the union against the data plane's copy.

// Merged is the action of a merged section in which items were kept.
const Merged Action = "merged"

// NewMerging returns a Rewriter that preserves preserve and merges merge item by item.
func NewMerging(preserve, merge []string) *Rewriter {
	rw := New(preserve)
	rw.merge = make(map[string]bool, len(merge))
	for _, s := range merge {
		rw.merge[s] = true
		delete(rw.preserve, s)
	}
	return rw
}

// splitItems cuts a section's JSON array (as validated by the scan) into its items, in
// order, reading each item's identity: id, or for consumers username (nil for an absent
// value or an object, which APISIX reads as no items). Linear in the bytes.
func splitItems(section string, raw []byte) ([]Item, error) {
	items, err := rawItems(section, raw)
	if err != nil || items == nil {
		return nil, err
	}
	out := make([]Item, len(items))
	for i, item := range items {
		out[i] = Item{Raw: item, ID: itemID(section, item)}
	}
	return out, nil
}

// rawItems cuts a section's JSON array into its items' bytes, without reading them
// (nil for an absent value or an object, which APISIX reads as no items).
func rawItems(section string, raw []byte) ([][]byte, error) {
	var out [][]byte
	i := skipWS(raw, 0)
	switch {
	case i >= len(raw): // absent: no items
		return nil, nil
	case raw[i] == '{': // APISIX reads an object as no items
		return nil, nil
	case raw[i] != '[':
		return nil, fmt.Errorf("%s is not an array", clip(section))
	}
	i = skipWS(raw, i+1)
	for i < len(raw) && raw[i] != ']' {
		end := valueEnd(raw, i)
		if end <= i {
			return nil, fmt.Errorf("%s: an item cannot be read", clip(section))
		}
		out = append(out, raw[i:end])
		i = skipWS(raw, end)
		if i < len(raw) && raw[i] == ',' {
			i = skipWS(raw, i+1)
		}
	}
	return out, nil
}

// CountItems counts the elements of a JSON array without decoding it (0 for anything
// else): for reports.
func CountItems(raw []byte) int {
	i := skipWS(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return 0
	}
	n := 0
	for i = skipWS(raw, i+1); i < len(raw) && raw[i] != ']'; n++ {
		end := valueEnd(raw, i)
		if end <= i {
			break
		}
		if i = skipWS(raw, end); i < len(raw) && raw[i] == ',' {
			i = skipWS(raw, i+1)
		}
	}
	return n
}

// itemID is an item's identity as APISIX keys it: tostring(id), or a consumer's
// username; "" when it has neither. It reads the item's top-level keys only (the item
// is valid JSON: the body was scanned), without decoding the rest. Which sections go by
// username is APISIX's table's to say, not a Rewriter's: SplitItems and the item diffs
// that call this have none.
func itemID(section string, item []byte) string {
	var id, username []byte
	eachMember(item, func(name string, value []byte) {
		switch name {
		case "id":
			id = value
		case "username":
			username = value
		}
	})
	raw := id
	if s, _ := sections.APISIX().Lookup(section); len(raw) == 0 && s.ByUsername {
		raw = username
	}
	return idText(raw)
}

// eachMember calls fn with each top-level member of a JSON object item (the name as
// lua-cjson decodes it, the value's bytes trimmed), in order; nothing for another
// value. A linear scan, no decode: the items were validated by the body's scan.
func eachMember(item []byte, fn func(name string, value []byte)) {
	i := skipWS(item, 0)
	if i >= len(item) || item[i] != '{' {
		return
	}
	for i = skipWS(item, i+1); i < len(item) && item[i] == '"'; {
		keyStart, keyEnd := i, valueEnd(item, i)
		key := item[i+1 : max(i+1, keyEnd-1)]
		i = skipWS(item, keyEnd)
		if i >= len(item) || item[i] != ':' {
			return
		}
		i = skipWS(item, i+1)
		end := valueEnd(item, i)
		if end <= i {
			return
		}
		name := string(key)
		if bytes.IndexByte(key, '\\') >= 0 { // an escaped key: as lua-cjson decodes it
			if s, ok := unquote(item[keyStart:keyEnd]); ok {
				name = s
			}
		}
		fn(name, bytes.TrimSpace(item[i:end]))
		if i = skipWS(item, end); i < len(item) && item[i] == ',' {
			i = skipWS(item, i+1)
		}
	}
}

// idText is an id's tostring: a string's value, a number's JSON text; "" for none.
func idText(raw []byte) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' && bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]) // no escapes: the string as it is
	}
	if s, ok := unquote(raw); ok {
		return s
	}
	return string(raw)
}

// union builds the merged section: the client's items, then the data plane's items the
// client neither sends nor owns. owned nil: no memory of ownership, nothing deleted.
func union(section string, client, dataPlane []byte, owned []string) (out []byte, ids []string, kept int, keptIDs []string, err error) {
	mine, err := splitItems(section, client)
	if err != nil {
		return nil, nil, 0, nil, err
	}
	theirs, err := splitItems(section, dataPlane)
	if err != nil {
		return nil, nil, 0, nil, err
	}
	sent := make(map[string]bool, len(mine))
	for _, it := range mine {
		if it.ID != "" {
			sent[it.ID] = true
			ids = append(ids, it.ID)
		}
	}
	ownedSet := make(map[string]bool, len(owned))
	for _, id := range owned {
		ownedSet[id] = true
	}
	size := len(client) + len(dataPlane) + 2
	out = make([]byte, 0, size)
	out = append(out, '[')
	for i, it := range mine {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, it.Raw...)
	}
	for _, it := range theirs {
		if it.ID == "" || sent[it.ID] || (owned != nil && ownedSet[it.ID]) {
			continue // the client's copy wins; an owned item gone from it is deleted
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, it.Raw...)
		kept++
		if len(keptIDs) < maxKeptIDs {
			keptIDs = append(keptIDs, clip(it.ID))
		}
	}
	out = append(out, ']')
	// the client owns every id it has ever sent: one it dropped and an out-of-band
	// writer created again is still the client's (deleted), never an out-of-band item
	ids = append(ids, owned...)
	slices.Sort(ids)
	return out, slices.Compact(ids), kept, keptIDs, nil
}

// maxKeptIDs bounds the kept ids a MergeReport names.
const maxKeptIDs = 20

func allOwned(items []Item, owned []string) bool {
	set := make(map[string]bool, len(owned))
	for _, id := range owned {
		set[id] = true
	}
	for _, it := range items {
		if !set[it.ID] {
			return false
		}
	}
	return true
}

// decideMerged is decideSection for a --merge section.
func (d *decision) decideMerged(section string, sl slots) (o outcome, change Change, changed bool, err error) {
	rw, p, in, h, res := d.rw, d.p, d.in, d.h, d.res
	vi, ii := sl.version, sl.items
	o, change, vR, present, err := sectionStart(section, vi, p, in)
	if err != nil {
		return o, change, false, err
	}
	vS, dpKnows := o.current, o.dpKnows
	o.recorded, o.shared = true, true
	var client []byte
	client, o.sum = rw.itemsOf(p, ii)
	owned, knows := in.Owned[section]
	// a body without K's items speaks of them only by a version the client moved
	speaks := ii >= 0 || d.emptiedByVersion(section, sectionVersion{vR, present}, vS)
	// The record vouches: the same client bytes as last time on the version that write
	// produced, so the union is what the data plane holds (an out-of-band write would
	// have moved the version).
	if entry, ok := in.Record.entry(section); ok && entry.version == vS && entry.sum == o.sum && knows && dpKnows && (ii >= 0 || !speaks) {
		o.fp, o.fpKnown, o.kept = entry.fp, entry.fpKnown, entry.kept
		res.owned[section] = owned
		return d.keepMerged(section, vi, o, change, sectionVersion{vR, present})
	}
	if !in.State.ItemsKnown {
		return o, change, false, ErrStateIncomplete
	}
	if p.yaml && ii >= 0 {
		return d.decideMergedYAML(section, sl, owned, knows)
	}
	merged, ids, kept, keptIDs, err := union(section, client, in.State.Items[section], deletable(owned, knows, speaks))
	if err != nil {
		return o, change, false, &SkipError{Reason: err.Error()}
	}
	if ii < 0 && knows {
		ids = owned // and they stay the client's
	}
	o.fp, o.fpKnown, o.kept = h.sectionFingerprint(section, merged), true, kept > 0
	unchanged := o.fp == h.sectionFingerprint(section, in.State.Items[section]) // the union is what it holds
	if p.yaml && !unchanged {
		return d.decideMergedYAML(section, sl, owned, knows) // a union to write into YAML
	}
	res.owned[section] = ids
	res.Merges = append(res.Merges, MergeReport{Section: section, ClientOwned: len(ids), Kept: kept, Unowned: !knows && kept > 0, KeptIDs: keptIDs})
	if unchanged {
		return d.keepMerged(section, vi, o, change, sectionVersion{vR, present})
	}
	return d.applyUnion(unionPlan{section: section, o: o, change: change, vi: vi, ii: ii, vR: vR, present: present, vS: vS, merged: merged, kept: kept})
}

// deletable are the items of a merged section the client may delete by leaving them
// out: the ones it owns, nil without a memory of ownership (nothing is deleted) or
// when the body says nothing about the section's items (speaks false: ADC 0.30 never
// sends secrets; the client's own stay as they are, like everyone else's).
func deletable(owned []string, knows, speaks bool) []string {
	if !knows || !speaks {
		return nil
	}
	return owned
}

// emptiedByVersion: a body that carries no items of merged section K says by its
// version that the client holds none (§8.6 as amended: to APISIX, no key and a higher
// version is no items, §5.1), so the client's own items of K go and the kept ones stay.
// It says nothing about K's items — everything stays — when the version is absent or
// the version the client last sent for K: the one in the body of its last write the
// data plane accepted (the record; ADC echoes its cache on every sync). A client whose
// last body carried K's items and whose next leaves them out at that same version has
// said nothing new either. A version moved onto the data plane's own (an out-of-band
// writer raised it by one, the client too) is moved all the same: to APISIX an equal
// version would keep what it holds, but a client's change is never dropped (§5.1).
//
// With no version the client last sent — the first sync since confshim started (the
// record is memory only, §8.6's ownership may survive in --state-dir, it does not), a
// section whose record was forgotten (§8.5), or a last body without the version — only
// a version above the data plane's is moved: that is how APISIX itself would read the
// body, and what a client echoes never is (it echoes what it or the data plane once
// had, and the data plane's version only grows: confshim raises or bumps it to at least
// what the client sent). An equal or lower one is taken for an echo: nothing is deleted
// on a guess.
func (d *decision) emptiedByVersion(section string, req sectionVersion, vS float64) bool {
	if !req.present {
		return false
	}
	if e, ok := d.in.Record.entry(section); ok && e.sent.present {
		return req.v != e.sent.v
	}
	return req.v > vS
}

// keepMerged keeps the data plane's copy of a merged section at its version: merged
// when items were kept (§8.6: the client's own or not), else raised or settled.
func (d *decision) keepMerged(section string, vi int, o outcome, change Change, req sectionVersion) (outcome, Change, bool, error) {
	vS := o.current
	o.applied = vS
	changed := keepVersion(&change, req.present, req.v, vS)
	if changed {
		d.e.setVersion(&d.p.obj, vi, section, vS)
		if o.kept {
			change.Action = Merged
		}
	}
	return o, change, changed, nil
}

// replaceItems sends items as a section's items: in place of the client's (member ii),
// or inserted when the body carries none.
func (e *edits) replaceItems(section string, ii int, items []byte) {
	if ii >= 0 {
		e.newValue[ii] = items
		return
	}
	e.inserts = append(e.inserts, insert{[]byte(section), items})
}

// keepVersion is the decision to keep the data plane's copy of a section at its
// version vS: raised (settled when the client's version was above); false when the
// client already sent vS.
func keepVersion(change *Change, present bool, vR, vS float64) bool {
	if present && vR == vS {
		return false
	}
	change.Action, change.To = Raised, vS
	if present && vR > vS {
		change.Action = Settled
	}
	return true
}

// decideMergedYAML: YAML items are never read (§5.6). While the data plane holds only
// items the client owns there is nothing to keep: the client's copy goes as for a
// managed section. Otherwise the union would have to be written into the client's YAML.
func (d *decision) decideMergedYAML(section string, sl slots, owned []string, knows bool) (outcome, Change, bool, error) {
	theirs, err := splitItems(section, d.in.State.Items[section])
	if err == nil && knows && allOwned(theirs, owned) {
		d.res.owned[section] = owned
		// YAML items are not read (§5.6), so a change sent at vS+1 — the version an
		// operator's read-modify-write of the section picks too — cannot be read back
		// (LostTies): it goes at the clock's version, as one decided unread does
		d.stampTie = true
		defer func() { d.stampTie = false }()
		return d.decideSection(section, sl)
	}
	return outcome{}, Change{}, false, &RefuseError{Reason: fmt.Sprintf("YAML body: %s is merged (--merge) and the data plane holds items the client may not own; confshim writes a merged section in JSON only: send this configuration as JSON", clip(section))}
}

// unionPlan is a merged section whose union differs from the data plane's copy: the
// section's decision so far and the union to send.
type unionPlan struct {
	section string
	o       outcome
	change  Change
	vi, ii  int
	vR, vS  float64
	present bool
	merged  []byte
	kept    int
}

// applyUnion sends a merged union that differs from the data plane's copy: at the
// client's version when it is above vS, else bumped; with the union's items in place
// of the client's when items were kept (merged).
func (d *decision) applyUnion(u unionPlan) (outcome, Change, bool, error) {
	section, o, change, vi, ii, vR, present, vS, merged, kept := u.section, u.o, u.change, u.vi, u.ii, u.vR, u.present, u.vS, u.merged, u.kept
	e, obj, in := d.e, &d.p.obj, d.in
	var next float64
	switch {
	case present && vR > vS && storable(vR) > vS && kept == 0 && (in.Unread || in.AvoidTies):
		// the client's own copy at its own version: stamped as a managed section is
		o.applied = storable(vR)
		if in.Unread {
			o.applied = d.stampClientVersion(section, vi, o.applied, vS)
		}
		if u := d.untied(o.applied, vS); in.AvoidTies && u != o.applied {
			return d.untie(section, vi, o, change, u)
		}
		return o, change, false, nil
	case present && vR > vS && storable(vR) > vS:
		next = storable(vR)
		if in.Unread {
			next, _ = d.unreadVersion(next, vS) // the union carries the clock's version, as a stamp would
		}
	default:
		var ok bool
		if next, ok = d.bumpVersion(vS); !ok {
			return o, change, false, unstorable(section, vS)
		}
	}
	if in.AvoidTies {
		next = d.untied(next, vS)
	}
	change.Action, change.To = Bumped, next
	if kept > 0 {
		change.Action = Merged
		o.union = merged
		e.replaceItems(section, ii, merged)
	}
	o.applied = change.To
	if change.To == vR && present && change.Action == Bumped {
		return o, change, false, nil // the client's version already applies its copy
	}
	e.setVersion(obj, vi, section, change.To)
	return o, change, true, nil
}
