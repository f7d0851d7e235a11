// Package rewrite decides, for one PUT /apisix/admin/configs body, what confshim
// changes before APISIX sees it (contract §5): stale *_conf_version values are raised
// or bumped, preserved sections are kept as the data plane holds them. It is pure:
// bytes and state in, bytes and a report out. Only the changed version numbers and the
// removed sections differ from the client's bytes; nothing else is re-serialised.
package rewrite

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Action is the word reported for a changed section (X-Confshim-Actions, metrics).
type Action string

// The actions of contract §5.1 and §5.3.
const (
	Raised    Action = "raised"    // set to the data plane's version: APISIX keeps its copy
	Bumped    Action = "bumped"    // set above the data plane's: APISIX applies the client's copy
	Preserved Action = "preserved" // an out-of-band section kept as the data plane holds it
)

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

// ErrNotObject reports a body that is valid JSON but not an object: APISIX would take
// an array or string as {} and empty every section, so the proxy refuses it.
var ErrNotObject = errors.New("the body parses but is not an object")

// ErrStateIncomplete asks the caller for a state with items (a full GET): a decision
// needs to compare the client's items with the data plane's.
var ErrStateIncomplete = errors.New("the decision needs the data plane's items")

// SkipError reports a body that is not rewritten; the caller forwards it untouched so
// that APISIX answers with its own error. The reason never quotes the body.
type SkipError struct{ Reason string }

func (e *SkipError) Error() string { return "not rewritten: " + e.Reason }

// Rewriter holds the configuration of the decision; it is safe for concurrent use.
type Rewriter struct {
	preserve map[string]bool
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

// Record is confshim's memory of its last successful write: per managed section, a
// hash of the items it forwarded and the version the data plane took. A nil Record is
// an empty one. It is immutable; Result.Commit returns the next one.
type Record struct {
	entries map[string]recordEntry
}

type recordEntry struct {
	sum     uint64
	version float64
}

func (r *Record) entry(section string) (recordEntry, bool) {
	if r == nil {
		return recordEntry{}, false
	}
	e, ok := r.entries[section]
	return e, ok
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
}

// Result is the decision for one body.
type Result struct {
	// Body is what to forward: the input bytes themselves when nothing changed.
	Body []byte
	// Changed is false when Body is the input, untouched.
	Changed bool
	// Changes lists the changed sections, sorted by section.
	Changes []Change
	// Digest is the X-Digest to forward (the client's when nothing changed).
	Digest string

	sections []outcome
}

// outcome is what the data plane will hold for one section after the forwarded PUT.
type outcome struct {
	section string
	managed bool
	sum     uint64  // hash of the forwarded items (managed only)
	applied float64 // the version after a 202
	current float64 // the data plane's version before the PUT (kept on a 204)
	dpKnows bool    // the data plane reported this section
}

// Actions renders the X-Confshim-Actions header value: "routes=raised, secrets=preserved".
func (r *Result) Actions() string {
	var b strings.Builder
	for i, c := range r.Changes {
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
// 202 it holds the versions the body set, with 204 (same digest) the ones it had.
func (r *Result) Commit(noContent bool) *Record {
	rec := &Record{entries: make(map[string]recordEntry, len(r.sections))}
	for _, o := range r.sections {
		if !o.managed {
			continue
		}
		v := o.applied
		if noContent {
			v = o.current
		}
		rec.entries[o.section] = recordEntry{sum: o.sum, version: v}
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

// Prepared is a body scanned and fingerprinted once, before any state is known. The
// proxy prepares outside its PUT lock, so that concurrent clients scan in parallel and
// only the O(sections) decision and the forwarding are serialised.
type Prepared struct {
	body []byte
	obj  object
	sums []uint64 // per member: the record's fingerprint of its value
}

// Prepare validates and scans body. Errors: ErrNotObject (refuse), *SkipError
// (forward untouched).
func (rw *Rewriter) Prepare(body []byte) (*Prepared, error) {
	obj, err := scanObject(body, make([]member, 0, 32))
	switch {
	case errors.Is(err, errNotObject):
		return nil, ErrNotObject
	case err != nil:
		return nil, &SkipError{Reason: "the body is not valid JSON: " + err.Error()}
	}
	if err := obj.checkDuplicates(); err != nil {
		return nil, &SkipError{Reason: err.Error()}
	}
	p := &Prepared{body: body, obj: obj, sums: make([]uint64, len(obj.members))}
	for i, m := range obj.members {
		if !strings.HasSuffix(string(m.key), versionSuffix) {
			p.sums[i] = hashItems(rw, body[m.valueStart:m.valueEnd])
		}
	}
	return p, nil
}

// Rewrite prepares in.Body and decides on it; see Prepare and Decide.
func (rw *Rewriter) Rewrite(in Input) (*Result, error) {
	p, err := rw.Prepare(in.Body)
	if err != nil {
		return nil, err
	}
	return rw.Decide(p, in)
}

// Decide runs the decision for a prepared body (in.Body is ignored). Errors:
// *SkipError (forward untouched), ErrStateIncomplete (read the full state and call
// again with the same Prepared).
func (rw *Rewriter) Decide(p *Prepared, in Input) (*Result, error) {
	res := &Result{}
	e := edits{newValue: make([][]byte, len(p.obj.members)), drop: make([]bool, len(p.obj.members))}
	for _, section := range rw.sections(&p.obj, in.State) {
		o, change, err := rw.decide(section, p, &e, in)
		if err != nil {
			return nil, err
		}
		res.sections = append(res.sections, o)
		if change != nil {
			res.Changes = append(res.Changes, *change)
		}
	}
	if len(res.Changes) == 0 {
		res.Body, res.Digest = p.body, in.Digest
		return res, nil
	}
	res.Changed = true
	res.Body = e.apply(in.Buf[:0], p.body, &p.obj)
	res.Digest = in.Digest
	if in.HasDigest {
		res.Digest = in.Digest + "+confshim:" + decisionsHash(res.Changes)
	}
	return res, nil
}

// sections is every section to decide on, sorted: APISIX's known ones, the data
// plane's, and any <name>_conf_version in the request.
func (rw *Rewriter) sections(obj *object, st *State) []string {
	out := make([]string, 0, len(KnownSections)+4)
	out = append(out, KnownSections...)
	if st != nil {
		for s := range st.Versions {
			out = append(out, s)
		}
	}
	for _, m := range obj.members {
		if s, ok := strings.CutSuffix(string(m.key), versionSuffix); ok && s != "" {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// decide handles one section: contract §5.1 for managed sections, §5.3 for preserved.
func (rw *Rewriter) decide(section string, p *Prepared, e *edits, in Input) (outcome, *Change, error) {
	body, obj := p.body, &p.obj
	vi := obj.find(section + versionSuffix)
	ii := obj.find(section)
	vR, present, err := requestVersion(body, obj, vi)
	if err != nil {
		return outcome{}, nil, &SkipError{Reason: section + versionSuffix + " " + err.Error()}
	}
	vS := in.State.Version(section)
	_, dpKnows := in.State.Versions[section]
	o := outcome{section: section, current: vS, dpKnows: dpKnows}
	change := &Change{Section: section, From: vR, FromAbsent: !present}

	if rw.preserve[section] {
		o.applied = vS
		if !present && !dpKnows && ii < 0 {
			return o, nil, nil // nothing to keep, nothing sent
		}
		versionChanged := !present || vR != vS
		if versionChanged {
			if err := e.setVersion(obj, vi, section, vS); err != nil {
				return o, nil, err
			}
		}
		if ii >= 0 {
			e.drop[ii] = true
		}
		if !versionChanged && ii < 0 {
			return o, nil, nil
		}
		change.Action, change.To, change.Dropped = Preserved, vS, ii >= 0
		return o, change, nil
	}

	var items []byte
	o.managed = true
	if ii >= 0 {
		items = body[obj.members[ii].valueStart:obj.members[ii].valueEnd]
		o.sum = p.sums[ii]
	} else {
		o.sum = hashItems(rw, nil)
	}
	switch {
	case !present:
		o.applied = vS + 1
		return o, nil, nil
	case vR > vS:
		o.applied = vR
		return o, nil, nil
	}
	unchanged, err := rw.unchanged(section, items, o.sum, vS, in)
	if err != nil {
		return o, nil, err
	}
	if unchanged {
		o.applied = vS
		if vR == vS {
			return o, nil, nil
		}
		change.Action, change.To = Raised, vS
	} else {
		o.applied = vS + 1
		change.Action, change.To = Bumped, vS+1
	}
	if err := e.setVersion(obj, vi, section, change.To); err != nil {
		return o, nil, err
	}
	return o, change, nil
}

// unchanged reports whether the client's copy of section is what the data plane holds.
// The record answers "yes" cheaply when it describes the data plane's current version
// and holds these very bytes. Otherwise — no record, a stale one, or other bytes — the
// items are compared with the data plane's: other bytes can still be the same
// configuration (another leader echoed the section as GET returned it), and raising
// then spares APISIX a reload, while a real change is still seen as one.
func (rw *Rewriter) unchanged(section string, items []byte, sum uint64, vS float64, in Input) (bool, error) {
	if e, ok := in.Record.entry(section); ok && e.version == vS && e.sum == sum {
		return true, nil
	}
	if in.State == nil || !in.State.ItemsKnown {
		return false, ErrStateIncomplete
	}
	h := semHasher{seed: rw.seed}
	return h.sectionFingerprint(items) == h.sectionFingerprint(in.State.Items[section]), nil
}

// requestVersion reads a *_conf_version value: false counts as absent (as in APISIX),
// anything but a finite number is an error.
func requestVersion(body []byte, obj *object, vi int) (float64, bool, error) {
	if vi < 0 {
		return 0, false, nil
	}
	m := obj.members[vi]
	raw := body[m.valueStart:m.valueEnd]
	if string(raw) == "false" {
		return 0, false, nil
	}
	if c := raw[0]; c != '-' && (c < '0' || c > '9') {
		return 0, false, errors.New("is not a number")
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, false, errors.New("is not a finite number")
	}
	return v, true, nil
}

// hashItems is the record's fingerprint of a section's items as forwarded.
func hashItems(rw *Rewriter, items []byte) uint64 { return maphash.Bytes(rw.seed, items) }

// appendVersion writes a version as JSON: integers without exponent or fraction.
func appendVersion(dst []byte, v float64) []byte { return strconv.AppendFloat(dst, v, 'f', -1, 64) }

// decisionsHash is a short hash of the rewrite's decisions, so that the same client
// body rewritten the same way gets the same digest (APISIX's 204 keeps working).
func decisionsHash(changes []Change) string {
	h := sha256.New()
	for _, c := range changes {
		h.Write([]byte(c.Section))
		h.Write([]byte{'='})
		h.Write(appendVersion(nil, c.To))
		if c.Dropped {
			h.Write([]byte(";drop"))
		}
		h.Write([]byte{'\n'})
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}

// edits collects the byte changes to the top-level object.
type edits struct {
	newValue [][]byte // per member: the replacement value, or nil
	drop     []bool   // per member: remove it
	inserts  [][]byte // members to add at the end
}

func (e *edits) setVersion(obj *object, vi int, section string, v float64) error {
	if v >= maxVersion || v <= -maxVersion {
		return &SkipError{Reason: fmt.Sprintf("%s%s would have to be %.0f, above 2^53", section, versionSuffix, v)}
	}
	text := appendVersion(nil, v)
	if vi >= 0 {
		e.newValue[vi] = text
		return nil
	}
	member := make([]byte, 0, len(section)+len(versionSuffix)+3+len(text))
	member = append(member, '"')
	member = append(member, section...)
	member = append(member, versionSuffix...)
	member = append(member, '"', ':')
	e.inserts = append(e.inserts, append(member, text...))
	return nil
}

// apply builds the output: the input with only the edited bytes changed. A dropped
// member takes the separator before it along (or after it, when it is first).
func (e *edits) apply(out, body []byte, obj *object) []byte {
	if need := len(body) + 64*len(e.inserts); cap(out) < need {
		out = make([]byte, 0, need)
	}
	if len(obj.members) == 0 {
		out = append(out, body[:obj.close]...)
	} else {
		out = append(out, body[:obj.members[0].start]...)
	}
	wrote := false
	for i, m := range obj.members {
		if e.drop[i] {
			continue
		}
		if wrote {
			out = append(out, body[obj.members[i-1].valueEnd:m.start]...)
		}
		if v := e.newValue[i]; v != nil {
			out = append(out, body[m.start:m.valueStart]...)
			out = append(out, v...)
		} else {
			out = append(out, body[m.start:m.valueEnd]...)
		}
		wrote = true
	}
	for _, ins := range e.inserts {
		if wrote {
			out = append(out, ',')
		}
		out = append(out, ins...)
		wrote = true
	}
	if len(obj.members) == 0 {
		return append(out, body[obj.close:]...)
	}
	return append(out, body[obj.members[len(obj.members)-1].valueEnd:]...)
}
