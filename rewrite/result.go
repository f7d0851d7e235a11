package rewrite

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/valyala/fastjson"
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
// version with other items (a writer's copy APISIX kept), or at a higher one without
// the items sent (a writer's, whether or not the PUT's landed first; in a merged section
// only the client's own items count, the kept ones are the writer's to change). "As
// sent" allows what a data plane may add to an item (schema defaults), not what it
// changes. Each is a Change from the version decided on to the one read. A data plane
// that lost its state since is §8.4's matter, not judged here.
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
		case v == o.applied && h.sectionFingerprint(o.section, items) == h.sectionFingerprint(o.section, held):
			// as sent (the common case: read once, no item parsed)
		case v == o.applied:
			landed = holdsAsSent(o.section, items, held, nil, true)
		case v > o.applied:
			var only map[string]bool
			if o.shared {
				only = map[string]bool{}
				for _, id := range r.owned[o.section] {
					only[id] = true
				}
			}
			landed = holdsAsSent(o.section, items, held, only, false)
		}
		if !landed {
			lost = append(lost, Change{Section: o.section, From: o.current, To: st.Version(o.section)})
		}
	}
	return lost, nil
}

// holdsAsSent reports whether held has each item of sent (of those in only, when not
// nil) by its id, containing what was sent; exact: and no item sent does not name.
func holdsAsSent(section string, sent, held []byte, only map[string]bool, exact bool) bool {
	want, err1 := rawItems(section, sent)
	have, err2 := rawItems(section, held)
	if err1 != nil || err2 != nil {
		return false
	}
	byID := make(map[string][]byte, len(have))
	for _, raw := range have {
		byID[itemID(section, raw)] = raw
	}
	for _, raw := range want {
		id := itemID(section, raw)
		if id == "" || (only != nil && !only[id]) {
			continue
		}
		got, ok := byID[id]
		if !ok || (!bytes.Equal(got, raw) && !itemContains(got, raw)) {
			return false
		}
		delete(byID, id)
	}
	return !exact || len(byID) == 0
}

// itemContains: stored holds every member of sent with a value that contains sent's
// (modifiedIndex aside: ADC re-stamps it, it is not content).
func itemContains(stored, sent []byte) bool {
	sv, err1 := fastjson.ParseBytes(stored)
	v, err2 := fastjson.ParseBytes(sent)
	if err1 != nil || err2 != nil {
		return false
	}
	if o, err := v.Object(); err == nil {
		o.Del("modifiedIndex")
	}
	return contains(sv, v)
}

// contains: stored has what sent has — objects member by member (stored may have more),
// arrays element by element, an empty array as an empty object (cjson stores [] as {}),
// numbers by value, strings decoded.
func contains(stored, sent *fastjson.Value) bool {
	switch sent.Type() {
	case fastjson.TypeObject:
		o, _ := sent.Object()
		if o.Len() == 0 && stored.Type() == fastjson.TypeArray {
			return len(stored.GetArray()) == 0
		}
		so, err := stored.Object()
		if err != nil {
			return false
		}
		ok := true
		o.Visit(func(k []byte, v *fastjson.Value) {
			if sv := so.Get(string(k)); ok && (sv == nil || !contains(sv, v)) {
				ok = false
			}
		})
		return ok
	case fastjson.TypeArray:
		a := sent.GetArray()
		if len(a) == 0 && stored.Type() == fastjson.TypeObject {
			o, _ := stored.Object()
			return o.Len() == 0
		}
		sa, err := stored.Array()
		if err != nil || len(sa) != len(a) {
			return false
		}
		for i := range a {
			if !contains(sa[i], a[i]) {
				return false
			}
		}
		return true
	case fastjson.TypeNumber:
		return stored.Type() == fastjson.TypeNumber && stored.GetFloat64() == sent.GetFloat64()
	case fastjson.TypeString:
		return stored.Type() == fastjson.TypeString && bytes.Equal(stored.GetStringBytes(), sent.GetStringBytes())
	}
	return stored.Type() == sent.Type() // true, false, null
}
