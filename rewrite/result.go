package rewrite

import (
	"slices"
	"strings"
)

// Record is confshim's memory of its last accepted write: per managed section, a hash
// of the client's bytes, the semantic fingerprint of the content the data plane then
// held, and the version it took. A nil Record is an empty one. It is immutable;
// Result.Commit returns the next one.
type Record struct {
	entries map[string]recordEntry
}

type recordEntry struct {
	sum     uint64 // maphash of the client's raw items
	fp      uint64 // semantic fingerprint of the section's content (when fpKnown)
	fpKnown bool
	version float64
	kept    bool // a --merge section whose union kept items the client never sent
}

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

// Result is the decision for one body.
type Result struct {
	// Body is what to forward: the input bytes themselves when nothing changed.
	Body []byte
	// Changed is false when Body is the input, untouched.
	Changed bool
	// Changes lists the reported sections (§5.5), sorted by section.
	Changes []Change
	// Digest is the X-Digest to forward (the client's when nothing changed).
	Digest string
	// NoOp: the forwarded body leaves every section as the data plane holds it (§8.2).
	NoOp bool
	// Thinned lists the sections sent at the data plane's version without their items
	// (§8.3); ThinnedBytes is what that left out.
	Thinned      []string
	ThinnedBytes int
	// Merges reports each --merge section whose union was computed (§8.6).
	Merges []MergeReport

	sections []outcome
	owned    Ownership // the client's ids in each merged section after this PUT
	// stamped are the changed sections a decision taken unread sent at Now instead of
	// the client's version (Input.Unread); unsure: a version was chosen that the clock
	// did not, so a decision taken unread must be checked first
	stamped []Change
	unsure  bool
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

// outcome is what the data plane will hold for one section after the forwarded PUT.
type outcome struct {
	section  string
	recorded bool    // a managed section whose client copy the record keeps
	sum      uint64  // hash of the client's items
	fp       uint64  // fingerprint of the content after the PUT (when fpKnown)
	fpKnown  bool    //
	applied  float64 // the version after a 202, as APISIX stores it
	current  float64 // the data plane's version before the PUT (kept on a 204)
	dpKnows  bool    // the data plane reported this section
	kept     bool    // a merged section that keeps items the client never sent (§8.6)
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
		rec.entries[o.section] = recordEntry{sum: o.sum, fp: o.fp, fpKnown: o.fpKnown, version: v, kept: o.kept}
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
}

// Unsure reports whether the decision sends a section the client changed at a version
// the clock did not choose (Input.Now was not above it): taken unread, that version
// could equal one an out-of-band writer set meanwhile, which APISIX would take as
// "keep what you hold", so the caller checks the data plane first.
func (r *Result) Unsure() bool { return r != nil && r.unsure }

// Stamped lists the sections sent at the clock's version instead of the client's.
func (r *Result) Stamped() []string {
	out := make([]string, len(r.stamped))
	for i, c := range r.stamped {
		out[i] = c.Section
	}
	return out
}

// Outcomes lists the sections the data plane knows after a 202 to the forwarded body.
func (r *Result) Outcomes() []SectionOutcome {
	out := make([]SectionOutcome, 0, len(r.sections))
	for _, o := range r.sections {
		if o.dpKnows {
			out = append(out, SectionOutcome{Section: o.section, Version: o.applied, FromBody: o.applied != o.current})
		}
	}
	return out
}
