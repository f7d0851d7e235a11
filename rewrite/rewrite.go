// Package rewrite decides, for one PUT /apisix/admin/configs body, what confshim
// changes before APISIX sees it (contract §5, §8.1–§8.3, §8.6): stale *_conf_version
// values are raised or bumped, re-stamped unchanged sections are settled (order-free
// sections compared as sets), preserved sections are kept as the data plane holds them,
// merged sections go as the union of the client's items and the ones it never owned,
// and sections APISIX keeps are sent without their items. For §8.5's fallback it splices
// items out of a body (Splice: held back, replaced by an accepted copy or left out) and
// finds the references that strand others. It is pure: bytes and state in, bytes and a
// report out. Only the changed version numbers and the removed or replaced items differ
// from the client's bytes; nothing else is re-serialised, JSON or YAML.
package rewrite

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/confshim/confshim/internal/sections"
	"hash/maphash"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Action is the word reported for a changed section (X-Confshim-Actions, metrics).
type Action string

// The actions of contract §5.1, §5.3 and §8.1.
const (
	Raised    Action = "raised"    // set to the data plane's version: APISIX keeps its copy
	Bumped    Action = "bumped"    // set above the data plane's: APISIX applies the client's copy
	Preserved Action = "preserved" // an out-of-band section kept as the data plane holds it
	Settled   Action = "settled"   // re-stamped but unchanged: set back to the data plane's version
)

// AllActions lists every action, for metrics that start at zero.
var AllActions = []Action{Raised, Bumped, Preserved, Settled, Merged, Backfilled}

// Backfilled is the word for a section with an item held back (§8.5): replaced by the
// copy the data plane last accepted, or left out.
const Backfilled Action = "backfilled"

// Change is one section that the rewrite changed.
type Change struct {
	Section string
	Action  Action
	From    float64 // the request's version; meaningless when FromAbsent
	// FromAbsent: the request had no usable version for the section.
	FromAbsent bool
	To         float64
	Dropped    bool // the client's items were removed from the body
}

// RefuseError reports a body confshim must not forward (contract §4, §6): the client
// gets 400 and nothing reaches APISIX. The reason never quotes more than a clipped name.
type RefuseError struct{ Reason string }

func (e *RefuseError) Error() string { return e.Reason }

// ErrNotObject refuses a body that parses but is not an object: APISIX would take an
// array or a string as {} and empty every section.
var ErrNotObject = &RefuseError{Reason: "the configuration must be an object: APISIX would read this body as {} and delete every section"}

// ErrStateIncomplete asks the caller for a state with items (a full GET): a decision
// needs to compare the client's items with the data plane's.
var ErrStateIncomplete = errors.New("the decision needs the data plane's items")

// SkipError reports a body that is not rewritten; the caller forwards it untouched so
// that APISIX answers with its own error (it rejects every such body whole). The
// reason never quotes the body beyond a clipped name.
type SkipError struct{ Reason string }

func (e *SkipError) Error() string { return "not rewritten: " + e.Reason }

// Rewriter holds the configuration of the decision; it is safe for concurrent use.
type Rewriter struct {
	preserve map[string]bool
	merge    map[string]bool // --merge sections (§8.6)
	seed     maphash.Seed
}

// New returns a Rewriter that preserves the given sections.
func New(preserve []string) *Rewriter {
	p := make(map[string]bool, len(preserve))
	for _, s := range preserve {
		p[s] = true
	}
	return &Rewriter{preserve: p, seed: maphash.MakeSeed()}
}

// Input is one request to decide on.
type Input struct {
	Body []byte
	// Digest is the client's X-Digest; HasDigest is false when it sent none (APISIX 3.13).
	Digest    string
	HasDigest bool
	State     *State
	Record    *Record
	// Buf, if it has the capacity, holds the rewritten body: callers pool it so that a
	// sync of tens of megabytes does not allocate its copy each time.
	Buf []byte
	// Owned is the memory of which ids the client owns in --merge sections (§8.6).
	Owned Ownership
	// Now is the current Unix time in milliseconds: a bump goes to max(vS+1, Now)
	// (§5.1), a number no other writer picks. 0 (no clock) bumps to vS+1.
	Now float64
	// Unread: the state was not read for this decision (§5.4), so an out-of-band writer
	// may have set any section to any version since. A section the client changed is
	// then sent at Now when Now is above the client's version (stamped), so that it
	// cannot equal such a version; where the clock cannot choose (Now is not above the
	// versions involved), the result is Unsure and the caller looks first.
	Unread bool
}

// Prepared is a body scanned once, before any state is known. The proxy prepares
// outside its PUT lock, so that concurrent clients scan in parallel and only the
// O(sections) decision and the forwarding are serialised.
type Prepared struct {
	body   []byte
	obj    object
	yaml   bool
	sums   []uint64 // per member: the hash of its value (the record's, for sections)
	layout *Layout  // JSON bodies: what the next PrepareLike may reuse
}

// Prepare validates and scans a JSON body. Errors: *RefuseError (400), *SkipError
// (forward untouched).
func (rw *Rewriter) Prepare(body []byte) (*Prepared, error) {
	obj, err := scanObject(body, make([]member, 0, 32))
	switch {
	case errors.Is(err, errNotObject):
		return nil, ErrNotObject
	case err != nil:
		return nil, &SkipError{Reason: "the body is not valid JSON: " + err.Error()}
	}
	return rw.prepared(body, obj, false)
}

func (rw *Rewriter) prepared(body []byte, obj object, yaml bool) (*Prepared, error) {
	if err := obj.index(); err != nil {
		return nil, err
	}
	p := &Prepared{body: body, obj: obj, yaml: yaml, sums: make([]uint64, len(obj.members))}
	for i, m := range obj.members {
		if m.valueStart >= 0 {
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
	res := &Result{owned: Ownership{}}
	e := edits{newValue: make([][]byte, len(p.obj.members)), drop: make([]bool, len(p.obj.members))}
	h := semHasher{seed: rw.seed}
	noop := true
	sections := rw.sections(&p.obj, in.State)
	aliased := p.obj.aliasedMembers() // YAML: members whose anchors others refer to
	res.sections = make([]outcome, 0, len(sections))
	d := &decision{rw: rw, p: p, e: &e, in: in, h: &h, res: res}
	for _, ref := range sections {
		section, sl := ref.name, ref.slots
		var o outcome
		var change Change
		var changed bool
		var err error
		if rw.merge[section] {
			o, change, changed, err = d.decideMerged(section, sl)
		} else {
			o, change, changed, err = d.decideSection(section, sl)
		}
		if err != nil {
			return nil, err
		}
		res.sections = append(res.sections, o)
		if changed {
			res.Changes = append(res.Changes, change)
		}
		if o.dpKnows && o.applied != o.current {
			noop = false
		}
		// §8.3: a managed section APISIX keeps is sent without its items.
		if ii := sl.items; ii >= 0 && o.dpKnows && o.recorded && o.applied == o.current && !e.drop[ii] && (aliased == nil || !aliased[ii]) {
			e.drop[ii] = true
			res.Thinned = append(res.Thinned, section)
			res.ThinnedBytes += p.obj.members[ii].valueEnd - p.obj.members[ii].valueStart
		}
	}
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

// decision is one Decide call: the prepared body and its edits, the input, the hasher
// and the result being built. Each section's decision is a method of it.
type decision struct {
	rw  *Rewriter
	p   *Prepared
	e   *edits
	in  Input
	h   *semHasher
	res *Result
}

type sectionRef struct {
	name string
	slots
}

// sections is every section to decide on, once each, in no particular order:
// APISIX's known ones, the data plane's, and any <name>_conf_version in the request.
// Linear in the body's keys: a body of 70,000 version keys costs no sort and no
// second lookup per key.
func (rw *Rewriter) sections(obj *object, st *State) []sectionRef {
	out := make([]sectionRef, 0, len(sections.Table)+len(st.Versions)+len(obj.idx))
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
	for _, s := range sections.Table {
		others(s.Name)
	}
	for s := range st.Versions {
		if !sections.Known(s) {
			others(s)
		}
	}
	return out
}

// decideSection handles one section: contract §5.1 and §8.1 for managed sections,
// §5.3 for preserved ones.
func (d *decision) decideSection(section string, sl slots) (o outcome, change Change, changed bool, err error) {
	rw, p, e, in := d.rw, d.p, d.e, d.in
	obj := &p.obj
	vi, ii := sl.version, sl.items
	o, change, vR, present, err := sectionStart(section, vi, p, in)
	if err != nil {
		return o, change, false, err
	}
	vS, dpKnows := o.current, o.dpKnows

	if rw.preserve[section] {
		o.applied = vS
		if !present && !dpKnows && ii < 0 {
			return o, change, false, nil // nothing to keep, nothing sent
		}
		versionChanged := !present || vR != vS
		if versionChanged {
			e.setVersion(obj, vi, section, vS)
		}
		if ii >= 0 {
			e.drop[ii] = true
		}
		if !versionChanged && ii < 0 {
			return o, change, false, nil
		}
		change.Action, change.To, change.Dropped = Preserved, vS, ii >= 0
		return o, change, true, nil
	}

	var items []byte
	items, o.sum = rw.itemsOf(p, ii)
	if present && vR == vS && ii < 0 {
		// APISIX's own idiom for "keep this section" (and what a thin PUT sends).
		o.applied = vS
		return o, change, false, nil
	}
	o.recorded = true
	if present && vR > vS && !dpKnows {
		// APISIX ignores a section it does not know: nothing to settle or compare
		o.applied = vR
		return o, change, false, nil
	}
	if !present {
		o.applied = storable(vS + 1)
		o.fp, o.fpKnown = rw.fingerprint(p, section, items, d.h)
		return o, change, false, nil
	}
	eq, fp, fpKnown, err := d.equal(section, items, o.sum, vS)
	if err != nil {
		return o, change, false, err
	}
	o.fp, o.fpKnown = fp, fpKnown
	switch {
	case vR > vS && !eq && storable(vR) > vS:
		o.applied = storable(vR)
		if in.Unread {
			o.applied = d.stampClientVersion(section, vi, storable(vR), vS)
		}
		return o, change, false, nil
	case vR > vS && !eq:
		// a version APISIX would store as vS again: the change would never be served
		next, ok := d.bumpVersion(vS)
		if !ok {
			return o, change, false, unstorable(section, vS)
		}
		change.Action, change.To = Bumped, next
	case vR > vS: // §8.1: re-stamped, unchanged
		change.Action, change.To = Settled, vS
	case eq && vR == vS:
		o.applied = vS
		return o, change, false, nil
	case eq:
		change.Action, change.To = Raised, vS
	default:
		next, ok := d.bumpVersion(vS)
		if !ok {
			return o, change, false, unstorable(section, vS)
		}
		change.Action, change.To = Bumped, next
	}
	o.applied = change.To
	e.setVersion(obj, vi, section, change.To)
	return o, change, true, nil
}

// sectionStart is what every section's decision starts from: the client's version
// (vR, present: a *RefuseError or *SkipError when it cannot be read) and the data
// plane's (the outcome's current).
func sectionStart(section string, vi int, p *Prepared, in Input) (o outcome, change Change, vR float64, present bool, err error) {
	vR, present, err = p.sectionVersion(section, vi)
	if err != nil {
		return o, change, 0, false, err
	}
	vS := in.State.Version(section)
	_, dpKnows := in.State.Versions[section]
	o = outcome{section: section, current: vS, dpKnows: dpKnows}
	change = Change{Section: section, From: vR, FromAbsent: !present}
	return o, change, vR, present, nil
}

// itemsOf is the client's items of member ii (nil when absent) and their hash.
func (rw *Rewriter) itemsOf(p *Prepared, ii int) ([]byte, uint64) {
	if ii < 0 {
		return nil, maphash.Bytes(rw.seed, nil)
	}
	m := p.obj.members[ii]
	return p.body[m.valueStart:m.valueEnd], p.sums[ii]
}

// equal reports whether the client's copy of section is the data plane's (§5.1's
// "unchanged", §8.1's "equal"), and the content's fingerprint when it was computed.
// The record answers cheaply when it describes the data plane's current version: the
// same bytes, or the same fingerprint (ADC re-stamps modifiedIndex, which is not
// content). Otherwise the items are compared with the data plane's.
func (d *decision) equal(section string, items []byte, sum uint64, vS float64) (eq bool, fp uint64, fpKnown bool, err error) {
	p, in, h := d.p, d.in, d.h
	e, ok := in.Record.entry(section)
	if ok && e.version == vS && e.sum == sum {
		return true, e.fp, e.fpKnown, nil
	}
	if p.yaml {
		// YAML values are never read (§5.6 asks to read them only where needed): a copy
		// the record does not vouch for counts as changed, so it is applied, not lost.
		return false, 0, false, nil
	}
	recordKnows := ok && e.version == vS && e.fpKnown
	if !recordKnows && !in.State.ItemsKnown {
		// ask for the items before fingerprinting: the call is repeated with them
		return false, 0, false, ErrStateIncomplete
	}
	fp = h.sectionFingerprint(section, items)
	if recordKnows {
		return fp == e.fp, fp, true, nil
	}
	return fp == h.sectionFingerprint(section, in.State.Items[section]), fp, true, nil
}

func (rw *Rewriter) fingerprint(p *Prepared, section string, items []byte, h *semHasher) (uint64, bool) {
	if p.yaml {
		return 0, false
	}
	return h.sectionFingerprint(section, items), true
}

// sectionVersion is version for section's decision: a *RefuseError as it is (400), any
// other error a *SkipError (APISIX rejects the body itself).
func (p *Prepared) sectionVersion(section string, vi int) (float64, bool, error) {
	vR, present, err := p.version(vi)
	var refuse *RefuseError
	switch {
	case errors.As(err, &refuse):
		return 0, false, err
	case err != nil:
		return 0, false, &SkipError{Reason: clip(section) + versionSuffix + " " + err.Error()}
	}
	return vR, present, nil
}

// version reads the *_conf_version member vi: false counts as absent (as in APISIX);
// anything but a finite number is an error (APISIX rejects the body itself).
func (p *Prepared) version(vi int) (float64, bool, error) {
	if vi < 0 {
		return 0, false, nil
	}
	m := p.obj.members[vi]
	if m.valueStart < 0 {
		return yamlVersion(nil)
	}
	raw := p.body[m.valueStart:m.valueEnd]
	if p.yaml {
		return yamlVersion(raw)
	}
	if string(raw) == "false" {
		return 0, false, nil
	}
	if c := raw[0]; c != '-' && (c < '0' || c > '9') {
		return 0, false, errors.New("is not a number")
	}
	if n, ok := smallInt(raw); ok {
		return float64(n), true, nil
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, false, errors.New("is not a finite number")
	}
	return v, true, nil
}

func unstorable(section string, vS float64) error {
	return &RefuseError{Reason: fmt.Sprintf("%s%s cannot go above the data plane's %s: APISIX keeps 14 significant digits and no higher version below 2^53 survives that", clip(section), versionSuffix, appendVersion(nil, vS))}
}

// storable is v as APISIX stores it: lua-cjson keeps 14 significant digits.
func storable(v float64) float64 {
	f, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 14, 64), 64)
	if err != nil {
		return v
	}
	return f
}

// nextStorable is the smallest version above v that APISIX stores as a different
// number (§5.1): v+1 below 1e14, a step in the 14th significant digit above; false
// when none exists below 2^53.
func nextStorable(v float64) (float64, bool) {
	if c := v + 1; c > v && storable(c) == c {
		return c, c < maxVersion
	}
	if math.IsInf(v, 0) || math.IsNaN(v) || v >= maxVersion {
		return 0, false
	}
	// the smallest power-of-ten step that reaches the next 14-digit number
	for step := 10.0; step < maxVersion; step *= 10 {
		if c := storable(v + step); c > v && storable(c) == c {
			return c, c < maxVersion
		}
	}
	return 0, false
}

// bumpVersion is the version a changed section goes to above vS (§5.1): max(vS+1, Now),
// vS+1 being the smallest storable version above vS. Writers pick their clock's time
// (ADC) or the last version plus one (a hand-made PUT), so the clock's number is one
// nobody else picks; vS+1 itself — a clock behind vS — is, and a decision taken
// unread on it is then Unsure.
func (d *decision) bumpVersion(vS float64) (float64, bool) {
	next, ok := nextStorable(vS)
	if !ok {
		return 0, false
	}
	if now := storable(d.in.Now); now >= next && now < maxVersion {
		return now, true
	}
	d.res.unsure = true
	return next, true
}

// stampClientVersion is the version a changed section the client sent at vR > vS goes
// at when the decision was taken unread: max(vR, Now). The clock's number when it is
// above vR (the section is stamped: part of the digest's decisions, not reported);
// otherwise vR, and the result is Unsure when vR is vS+1, the number a hand-made PUT
// would have picked (ADC clamps its version to the last one plus one when its clock is
// behind).
func (d *decision) stampClientVersion(section string, vi int, vR, vS float64) float64 {
	now := storable(d.in.Now)
	if now <= vR || now >= maxVersion {
		if next, _ := nextStorable(vS); next == vR || d.in.Now == 0 {
			d.res.unsure = true
		}
		return vR
	}
	d.e.setVersion(&d.p.obj, vi, section, now)
	d.res.stamped = append(d.res.stamped, Change{Section: section, From: vR, To: now})
	return now
}

// appendVersion writes a version as JSON and YAML read it: integers without exponent
// or fraction.
func appendVersion(dst []byte, v float64) []byte { return strconv.AppendFloat(dst, v, 'f', -1, 64) }

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

// maxNameBytes bounds a name taken from a body in logs and messages (§5.7).
const maxNameBytes = 64

// clip cuts a request-supplied name for a log line or an error message.
func clip(name string) string {
	if len(name) <= maxNameBytes {
		return name
	}
	return name[:maxNameBytes] + "…"
}

// Clip is clip for the proxy's log lines.
func Clip(name string) string { return clip(name) }

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
		if sl.version >= 0 || (sl.items >= 0 && sections.Known(s)) {
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
