package rewrite

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// Without returns the record with sections forgotten (their content on the data plane
// is not the client's: a backfilled section, §8.5).
func (r *Record) Without(sections []string) *Record {
	if r == nil || len(sections) == 0 {
		return r
	}
	next := &Record{entries: make(map[string]recordEntry, len(r.entries))}
	for s, e := range r.entries {
		if !slices.Contains(sections, s) {
			next.entries[s] = e
		}
	}
	return next
}

func (r *Record) entry(section string) (recordEntry, bool) {
	if r == nil {
		return recordEntry{}, false
	}
	e, ok := r.entries[section]
	return e, ok
}

// Ownership returns the memory of ownership once the data plane accepted this body:
// prev with every merged section this body decided replaced.
func (r *Result) Ownership(prev Ownership) Ownership {
	if len(r.owned) == 0 {
		return prev
	}
	next := make(Ownership, len(prev)+len(r.owned))
	for s, ids := range prev {
		next[s] = ids
	}
	for s, ids := range r.owned {
		next[s] = ids
	}
	return next
}

// maxHeaderBytes bounds X-Confshim-Actions: Node's HTTP client (ADC) refuses headers
// over 16 KiB in all.
const maxHeaderBytes = 8 << 10

// Actions renders the X-Confshim-Actions header value, "routes=raised, secrets=preserved",
// cut at 8 KiB with ", …".
func (r *Result) Actions() string {
	var b strings.Builder
	for i, c := range r.Changes {
		entry := len(c.Section) + len(c.Action) + 3
		if b.Len()+entry > maxHeaderBytes-len(", …") {
			b.WriteString(", …")
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c.Section)
		b.WriteByte('=')
		b.WriteString(string(c.Action))
	}
	return b.String()
}

// Commit returns the record after the data plane accepted the forwarded body: with
// 202 it holds the versions the body set, with 204 the ones it had.
func (r *Result) Commit(noContent bool) *Record {
	rec := &Record{entries: make(map[string]recordEntry, len(r.sections))}
	for _, o := range r.sections {
		if !o.recorded {
			continue
		}
		v := o.applied
		if noContent {
			v = o.current
		}
		rec.entries[o.section] = recordEntry{sum: o.sum, fp: o.fp, fpKnown: o.fpKnown, version: v, kept: o.kept, sent: o.sent}
	}
	return rec
}

// AppliedState is the data plane's state after it answered 202 to the forwarded body:
// the versions are known exactly, the items are not.
func (r *Result) AppliedState() *State {
	st := &State{Versions: make(map[string]float64, len(r.sections))}
	for _, o := range r.sections {
		if o.dpKnows {
			st.Versions[o.section] = o.applied
		}
	}
	return st
}

// SectionOutcome is one section the data plane knows, as it stands after a 202 to the
// forwarded body: its version, and whether its items are now the body's.
type SectionOutcome struct {
	Section string
	Version float64
	// FromBody: APISIX took the section's items from the body (its version moved);
	// otherwise it kept what it held.
	FromBody bool
	// Items are the section's items as sent when they are not the client's own (a
	// merged union); nil: the body's.
	Items []byte
}

// Unsure reports whether the decision sends a section the client changed at a version
// the clock did not choose (Input.Now was not above it): taken unread, that version
// could equal one an out-of-band writer set meanwhile, which APISIX would take as
// "keep what you hold", so the caller checks the data plane first.
func (r *Result) Unsure() bool { return r != nil && r.unsure }

// NeedsProof reports whether a decision taken unread put the data plane's own items
// into the body (a merged union sent at a new version, §8.6): sent at the clock's
// version it would beat APISIX's check, so an out-of-band write since the belief was
// confirmed would be overwritten. The caller shows the state current first (§5.4).
func (r *Result) NeedsProof() bool { return r != nil && r.unread && r.SendsUnion() }

// SendsUnion reports whether the body carries a merged section's union at a new
// version: a later PUT of the same sync (a fallback's) stands only on a state shown
// unchanged since the decision.
func (r *Result) SendsUnion() bool {
	if r == nil {
		return false
	}
	for _, o := range r.sections {
		if o.shared && o.applied != o.current {
			return true
		}
	}
	return false
}

// Outcomes lists the sections the data plane knows after a 202 to the forwarded body.
func (r *Result) Outcomes() []SectionOutcome {
	out := make([]SectionOutcome, 0, len(r.sections))
	for _, o := range r.sections {
		if o.dpKnows {
			out = append(out, SectionOutcome{Section: o.section, Version: o.applied, FromBody: o.applied != o.current, Items: o.union})
		}
	}
	return out
}

// SentAtATie reports whether the decision sends a --merge section (§8.6: shared with
// out-of-band writers, who write it by read-modify-write) it changes at exactly the data
// plane's version plus one: the version such a write of the same state picks too.
// APISIX takes an equal version as "keep what you hold", so when the write lands between
// the state read and the PUT, the PUT's 2xx does not mean the client's copy was applied
// (§5.1: a change is never dropped); the caller reads back. A section the client owns
// whole is not judged: another writer of it is overwritten by the client's next change
// anyway (§5.2), and a client's small versions (1, 2, …) would pay a read per sync.
func (r *Result) SentAtATie() bool { return len(r.TiedSections()) > 0 }

// TiedSections names the sections SentAtATie is about.
func (r *Result) TiedSections() []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, o := range r.sections {
		if o.atATie() {
			out = append(out, o.section)
		}
	}
	return out
}

// atATie: a merged section goes at the client's version (or a bump) that is vS+1, on a
// state that reported it (an absent version is APISIX's stored+1 at apply time: no
// tie). A YAML body's items are not read (§5.6): its content has no fingerprint to
// judge by.
func (o *outcome) atATie() bool {
	next, ok := nextStorable(o.current)
	return ok && o.shared && o.sent.present && o.dpKnows && o.fpKnown && o.applied == next
}

// LostTies are the sections the decision sent at a tie (SentAtATie) that st, read after
// APISIX accepted sent (the bytes forwarded), does not hold as sent: at that very
// version with other content (a writer's copy APISIX kept), or at a higher one without
// the client's own items as sent (a writer's, whether or not the PUT's landed first; the
// kept items are the writer's to change). Content is compared as §8.1 compares it: the
// semantic fingerprint (key order, modifiedIndex and cjson's spellings aside, numbers as
// APISIX stores them, an ordered section's order kept). Each is a Change from the
// version decided on to the one read. A data plane that lost its state since is §8.4's
// matter, not judged here.
func (rw *Rewriter) LostTies(r *Result, sent []byte, st *State) ([]Change, error) {
	if !r.SentAtATie() || st == nil || !st.ItemsKnown {
		return nil, nil
	}
	p, err := rw.Prepare(sent)
	if err != nil {
		return nil, fmt.Errorf("reading back the forwarded body: %w", err)
	}
	h := rw.hasher()
	var lost []Change
	for _, o := range r.sections {
		if !o.atATie() {
			continue
		}
		items, _ := p.JSONItems(o.section)
		held := st.Items[o.section]
		landed := true
		switch v := st.Version(o.section); {
		case v == o.applied:
			landed = h.sectionFingerprint(o.section, items) == h.sectionFingerprint(o.section, held)
		case v > o.applied:
			landed = rw.holdsOwned(o.section, items, held, r.owned[o.section])
		}
		if !landed {
			lost = append(lost, Change{Section: o.section, From: o.current, To: st.Version(o.section)})
		}
	}
	return lost, nil
}

// holdsOwned reports whether held has sent's items among the client's (owned: every id
// it has sent, §8.6) as sent: each one it sent, by id, with the same content (in the
// same order, in a section that keeps one), and none it no longer sends (deleted). The
// kept items are a writer's to change.
func (rw *Rewriter) holdsOwned(section string, sent, held []byte, owned []string) bool {
	want, err1 := rawItems(section, sent)
	have, err2 := rawItems(section, held)
	if err1 != nil || err2 != nil {
		return false
	}
	mine := make(map[string]bool, len(owned))
	for _, id := range owned {
		mine[id] = true
	}
	byID := make(map[string][]byte, len(want))
	var order []string // the client's ids as sent
	for _, raw := range want {
		if id := itemID(section, raw); id != "" && mine[id] {
			byID[id] = raw
			order = append(order, id)
		}
	}
	ordered := !orderFree(rw.table, section)
	found := 0
	for _, raw := range have {
		id := itemID(section, raw)
		if !mine[id] {
			continue
		}
		sentRaw, ok := byID[id]
		if !ok {
			return false // an item the client deleted
		}
		if ordered && (found >= len(order) || order[found] != id) {
			return false // the client's items in another order
		}
		if !bytes.Equal(sentRaw, raw) && rw.ItemFingerprint(sentRaw) != rw.ItemFingerprint(raw) {
			return false
		}
		found++
	}
	return found == len(order)
}
