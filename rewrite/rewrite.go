// Package rewrite decides, for one PUT /apisix/admin/configs body, what confshim
// changes before APISIX sees it (contract §5, §8.1–§8.3, §8.6): stale *_conf_version
// values are raised or bumped, re-stamped unchanged sections are settled (order-free
// sections compared as sets), preserved sections are kept as the data plane holds them,
// merged sections go as the union of the client's items and the ones it never owned,
// and sections APISIX keeps are sent without their items. For §8.5's fallback it splices
// items out of a body (itemSplice: held back, replaced by an accepted copy or left out) and
// finds the references that strand others. It is pure: bytes and state in, bytes and a
// report out. Only the changed version numbers and the removed or replaced items differ
// from the client's bytes; nothing else is re-serialised, JSON or YAML.
package rewrite

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"github.com/confshim/confshim/internal/sections"
	"hash/maphash"
	"slices"
	"strings"
)

// AllActions lists every action, for metrics that start at zero.
var AllActions = []Action{Raised, Bumped, Preserved, Settled, Merged, Backfilled}

// Backfilled is the word for a section with an item held back (§8.5): replaced by the
// copy the data plane last accepted, or left out.
const Backfilled Action = "backfilled"

// New returns a Rewriter that knows APISIX's sections and preserves the given ones.
func New(preserve []string) *Rewriter { return newWithTable(sections.APISIX(), preserve) }

// newWithTable is New knowing the sections of table instead (tests).
func newWithTable(table sections.Table, preserve []string) *Rewriter {
	p := make(map[string]bool, len(preserve))
	for _, s := range preserve {
		p[s] = true
	}
	return &Rewriter{preserve: p, seed: maphash.MakeSeed(), table: table}
}

// hasher is a semantic hasher on the Rewriter's seed and sections.
func (rw *Rewriter) hasher() semHasher { return semHasher{seed: rw.seed, table: rw.table} }

// Prepare validates and scans a JSON body. Errors: *RefuseError (400), *SkipError
// (forward untouched).
func (rw *Rewriter) Prepare(body []byte) (*Prepared, error) {
	obj, err := scanObject(body, make([]member, 0, 32))
	return rw.preparedJSON(body, obj, nil, err)
}

// PrepareArrived is PrepareLike for a body scanned while it arrived (NewBodyScan; no
// Feed may run any more): the scan is finished when little of the body is left to
// scan, or the body is not of prev's shape; otherwise (the bytes came faster than the
// scan) it is checked against prev.
func (rw *Rewriter) PrepareArrived(body []byte, bs *BodyScan, prev *Layout) (*Prepared, error) {
	full := func() (*Prepared, error) {
		obj, sums, err := bs.finish(body)
		return rw.preparedJSON(body, obj, sums, err)
	}
	if bs.left(len(body)) < len(body)/4 {
		return full() // scanning the rest costs less than checking the whole body against prev
	}
	return rw.prepareLike(body, prev, full)
}

// preparedJSON is a scanned JSON body prepared, or the scan's error as Prepare says it.
func (rw *Rewriter) preparedJSON(body []byte, obj object, sums []uint64, err error) (*Prepared, error) {
	switch {
	case errors.Is(err, errNotObject):
		return nil, refuseNotObject
	case err != nil:
		return nil, &SkipError{Reason: "the body is not valid JSON: " + err.Error()}
	}
	return rw.preparedSums(body, obj, false, sums)
}

func (rw *Rewriter) prepared(body []byte, obj object, yaml bool) (*Prepared, error) {
	return rw.preparedSums(body, obj, yaml, nil)
}

// preparedSums indexes a scanned body and hashes its members' values (those not in
// sums, the hashes of the first members an arriving scan already took).
func (rw *Rewriter) preparedSums(body []byte, obj object, yaml bool, sums []uint64) (*Prepared, error) {
	if err := obj.index(); err != nil {
		return nil, err
	}
	p := &Prepared{body: body, obj: obj, yaml: yaml, sums: make([]uint64, len(obj.members)), table: rw.table}
	copy(p.sums, sums)
	for i := len(sums); i < len(obj.members); i++ {
		if m := obj.members[i]; m.valueStart >= 0 {
			p.sums[i] = maphash.Bytes(rw.seed, body[m.valueStart:m.valueEnd])
		}
	}
	if !yaml && obj.yaml == nil {
		p.layout = rw.layoutOf(body, obj, p.sums)
	}
	return p, nil
}

// Rewrite prepares in.Body as JSON and decides on it; see Prepare and Decide.
func (rw *Rewriter) Rewrite(in Input) (*Result, error) {
	p, err := rw.Prepare(in.Body)
	if err != nil {
		return nil, err
	}
	return rw.Decide(p, in)
}

// Decide runs the decision for a prepared body (in.Body is ignored). Errors:
// *SkipError (forward untouched), *RefuseError (400), ErrStateIncomplete (read the
// full state and call again with the same Prepared).
func (rw *Rewriter) Decide(p *Prepared, in Input) (*Result, error) {
	if in.State == nil {
		in.State = &State{}
	}
	res := &Result{owned: Ownership{}, unread: in.Unread}
	e := edits{newValue: make([][]byte, len(p.obj.members)), drop: make([]bool, len(p.obj.members))}
	h := rw.hasher()
	sections := rw.sections(&p.obj, in.State)
	res.sections = make([]outcome, 0, len(sections))
	d := &decision{rw: rw, p: p, e: &e, in: in, h: &h, res: res}
	aliased := p.obj.aliasedMembers() // YAML: members whose anchors others refer to
	noop := true
	for _, ref := range sections {
		o, err := d.decideOne(ref, aliased)
		if err != nil {
			return nil, err
		}
		if o.dpKnows && o.applied != o.current {
			noop = false
		}
	}
	return d.finish(noop)
}

// decideOne decides one section, merged or not, and thins it when APISIX keeps it
// (§8.3: a managed section APISIX keeps is sent without its items).
func (d *decision) decideOne(ref sectionRef, aliased []bool) (outcome, error) {
	section, sl, res, e := ref.name, ref.slots, d.res, d.e
	var o outcome
	var change Change
	var changed bool
	var err error
	if d.rw.merge[section] {
		o, change, changed, err = d.decideMerged(section, sl)
	} else {
		o, change, changed, err = d.decideSection(section, sl)
	}
	if err != nil {
		return o, err
	}
	res.sections = append(res.sections, o)
	if changed {
		res.Changes = append(res.Changes, change)
	}
	if ii := sl.items; ii >= 0 && o.dpKnows && o.recorded && o.applied == o.current && !e.drop[ii] && (aliased == nil || !aliased[ii]) {
		e.drop[ii] = true
		res.Thinned = append(res.Thinned, section)
		res.ThinnedBytes += d.p.obj.members[ii].valueEnd - d.p.obj.members[ii].valueStart
	}
	return o, nil
}

// finish writes the decided body: the client's bytes when nothing changed, else its
// edits spliced in, with a digest of its own.
func (d *decision) finish(noop bool) (*Result, error) {
	res, e, p, in := d.res, d.e, d.p, d.in
	// sorted once at the end: the header, the log and the digest list sections in order
	slices.SortFunc(res.Changes, func(a, b Change) int { return strings.Compare(a.Section, b.Section) })
	slices.Sort(res.Thinned)
	slices.SortFunc(e.inserts, func(a, b insert) int { return bytes.Compare(a.name, b.name) })
	res.NoOp = noop && len(in.State.Versions) > 0
	if len(res.Changes) == 0 && len(res.Thinned) == 0 && len(res.stamped) == 0 {
		res.Body, res.Digest = p.body, in.Digest
		return res, nil
	}
	if p.yaml {
		if err := p.obj.checkAnchors(e.drop); err != nil {
			return nil, err
		}
	}
	res.Changed = true
	res.Body = e.apply(in.Buf[:0], p.body, &p.obj)
	res.Digest = in.Digest
	if in.HasDigest {
		res.Digest = in.Digest + "+confshim:" + decisionsHash(res.Changes, res.stamped, res.Thinned)
	}
	return res, nil
}

// sections is every section to decide on, once each, in no particular order:
// APISIX's known ones, the data plane's, and any <name>_conf_version in the request.
// Linear in the body's keys: a body of 70,000 version keys costs no sort and no
// second lookup per key.
func (rw *Rewriter) sections(obj *object, st *State) []sectionRef {
	out := make([]sectionRef, 0, len(rw.table)+len(st.Versions)+len(obj.idx))
	for s, sl := range obj.idx {
		if sl.version >= 0 {
			out = append(out, sectionRef{s, sl})
		}
	}
	others := func(s string) {
		if sl := obj.slot(s); sl.version < 0 {
			out = append(out, sectionRef{s, sl})
		}
	}
	for _, s := range rw.table {
		others(s.Name)
	}
	for s := range st.Versions {
		if !rw.table.Known(s) {
			others(s)
		}
	}
	return out
}

// decisionsHash is a short hash of the rewrite's decisions, so that the same client
// body rewritten the same way gets the same digest (APISIX's 204 keeps working).
func decisionsHash(changes, stamped []Change, thinned []string) string {
	h := sha256.New()
	var num []byte
	for _, c := range slices.Concat(changes, stamped) {
		h.Write([]byte(c.Section))
		h.Write([]byte{'='})
		num = appendVersion(num[:0], c.To)
		h.Write(num)
		if c.Dropped {
			h.Write([]byte(";drop"))
		}
		h.Write([]byte{'\n'})
	}
	for _, s := range thinned {
		h.Write([]byte(s))
		h.Write([]byte(";thin\n"))
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}

// IsJSON reports whether the body is JSON (not YAML).
func (p *Prepared) IsJSON() bool { return !p.yaml }

// JSONItems returns a section's items as the client's JSON body holds them (nil when
// the body has none); false for a YAML body, whose items are not JSON.
func (p *Prepared) JSONItems(section string) ([]byte, bool) {
	if p.yaml {
		return nil, false
	}
	sl := p.obj.slot(section)
	if sl.items < 0 {
		return nil, true
	}
	m := p.obj.members[sl.items]
	return p.body[m.valueStart:m.valueEnd], true
}

// ItemSections names, unclipped and sorted, the sections whose items the body carries:
// for decisions (the fallback's validate calls and references).
func (p *Prepared) ItemSections() []string {
	out := make([]string, 0, len(p.obj.idx))
	for s, sl := range p.obj.idx {
		if sl.items >= 0 {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// Sections names the sections the body carries (a version or items), sorted, at most
// limit of them, each clipped: for reports, never for decisions.
func (p *Prepared) Sections(limit int) []string {
	out := make([]string, 0, min(len(p.obj.idx), limit))
	for s, sl := range p.obj.idx {
		if sl.version >= 0 || (sl.items >= 0 && p.table.Known(s)) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	if len(out) > limit {
		out = out[:limit]
	}
	for i := range out {
		out[i] = clip(out[i])
	}
	return out
}

// PrepareYAML scans a YAML body (Content-Type application/yaml). Errors:
// *RefuseError (400: not a mapping, or a form confshim cannot splice safely).
func (rw *Rewriter) PrepareYAML(body []byte) (*Prepared, error) {
	obj, err := scanYAML(body)
	if err != nil {
		return nil, err
	}
	return rw.prepared(body, obj, true)
}

// Layout returns what the next PrepareLike may reuse (nil for a YAML body).
func (p *Prepared) Layout() *Layout { return p.layout }

// PrepareLike is Prepare for a body that may share prev's shape: when it has prev's
// length and the same bytes everywhere but inside some members' values, and those
// values are valid JSON, it is the same object with the same members, and only those
// values are validated. Otherwise it scans the whole body, as Prepare does.
func (rw *Rewriter) PrepareLike(body []byte, prev *Layout) (*Prepared, error) {
	return rw.prepareLike(body, prev, func() (*Prepared, error) { return rw.Prepare(body) })
}

// prepareLike is PrepareLike with full as what prepares a body of another shape.
func (rw *Rewriter) prepareLike(body []byte, prev *Layout, full func() (*Prepared, error)) (*Prepared, error) {
	if prev == nil || len(body) != prev.size || len(prev.obj.members) == 0 {
		return full()
	}
	members := prev.obj.members
	if maphash.Bytes(rw.seed, body[:members[0].start]) != prev.headSum {
		return full()
	}
	valSums := make([]uint64, len(members))
	for i, m := range members {
		if maphash.Bytes(rw.seed, body[m.start:m.valueStart]) != prev.keySums[i] ||
			maphash.Bytes(rw.seed, body[m.valueEnd:prev.nextStart(i)]) != prev.tailSums[i] {
			return full()
		}
		valSums[i] = maphash.Bytes(rw.seed, body[m.valueStart:m.valueEnd])
		if valSums[i] != prev.valSums[i] && !validValue(body[m.valueStart:m.valueEnd], 1) {
			return full() // let the full scan say what is wrong
		}
	}
	p := &Prepared{body: body, obj: prev.obj, sums: valSums, table: rw.table}
	p.layout = &Layout{size: prev.size, obj: prev.obj, headSum: prev.headSum, keySums: prev.keySums, tailSums: prev.tailSums, valSums: valSums}
	return p, nil
}
