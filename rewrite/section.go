package rewrite

// One section's decision (contract §5.1, §5.3, §8.1): the client's version and the data
// plane's, equality by the record or by content, and the version a changed section goes
// at. The dispatcher (Decide) and the merged sections (merge.go) stand on it.

import (
	"errors"
	"hash/maphash"
	"math"
	"strconv"
)

// decideSection handles one section: contract §5.1 and §8.1 for managed sections,
// §5.3 for preserved ones.
func (d *decision) decideSection(section string, sl slots) (o outcome, change Change, changed bool, err error) {
	o, change, vR, present, err := sectionStart(section, sl.version, d.p, d.in)
	if err != nil {
		return o, change, false, err
	}
	if d.rw.preserve[section] {
		o, change, changed = d.decidePreserved(section, sl, o, change, sectionVersion{vR, present})
		return o, change, changed, nil
	}
	return d.decideManaged(section, sl, o, change, sectionVersion{vR, present})
}

// sectionVersion is the <section>_conf_version a request carries (present false: none).
type sectionVersion struct {
	v       float64
	present bool
}

// decidePreserved keeps a section an out-of-band writer owns: the data plane's version,
// and none of the client's items.
func (d *decision) decidePreserved(section string, sl slots, o outcome, change Change, req sectionVersion) (outcome, Change, bool) {
	vS, ii := o.current, sl.items
	o.applied = vS
	if !req.present && !o.dpKnows && ii < 0 {
		return o, change, false // nothing to keep, nothing sent
	}
	versionChanged := !req.present || req.v != vS
	if versionChanged {
		d.e.setVersion(&d.p.obj, sl.version, section, vS)
	}
	if ii >= 0 {
		d.e.drop[ii] = true
	}
	if !versionChanged && ii < 0 {
		return o, change, false
	}
	change.Action, change.To, change.Dropped = Preserved, vS, ii >= 0
	return o, change, true
}

// decideManaged decides a section the client owns: kept, stamped, settled, raised or
// bumped, by its version and whether its items changed (§8.1).
func (d *decision) decideManaged(section string, sl slots, o outcome, change Change, req sectionVersion) (outcome, Change, bool, error) {
	rw, p := d.rw, d.p
	vR, vS, present := req.v, o.current, req.present
	var items []byte
	items, o.sum = rw.itemsOf(p, sl.items)
	if present && vR == vS && sl.items < 0 {
		// APISIX's own idiom for "keep this section" (and what a thin PUT sends).
		o.applied = vS
		return o, change, false, nil
	}
	o.recorded = true
	if present && vR > vS && !o.dpKnows {
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
	return d.compare(section, sl, o, change, vR, eq)
}

// compare is the verdict on a section the request carries at version vR whose items
// are (eq) or are not the data plane's.
func (d *decision) compare(section string, sl slots, o outcome, change Change, vR float64, eq bool) (outcome, Change, bool, error) {
	vS := o.current
	switch {
	case vR > vS && !eq && storable(vR) > vS:
		o.applied = storable(vR)
		if d.in.Unread {
			o.applied = d.stampClientVersion(section, sl.version, storable(vR), vS)
		}
		if u := d.untied(o.applied, vS); d.stampTie && u != o.applied {
			return d.untie(section, sl.version, o, change, u)
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
		if d.stampTie {
			next = d.untied(next, vS)
		}
		change.Action, change.To = Bumped, next
	}
	o.applied = change.To
	d.e.setVersion(&d.p.obj, sl.version, section, change.To)
	return o, change, true, nil
}

// untied is v, or — when v is vS+1, the version an out-of-band read-modify-write of vS
// picks too, and the section will not be read back after the PUT (Input.AvoidTies, a
// YAML merged section) — the clock's version when it is above, else vS+2.
func (d *decision) untied(v, vS float64) float64 {
	next, ok := nextStorable(vS)
	if !ok || v != next {
		return v
	}
	if now := storable(d.in.Now); now > next && now < maxVersion {
		return now
	}
	if after, ok := nextStorable(next); ok {
		return after
	}
	return v
}

// untie sends a section the client sent at vS+1 at u instead (untied): a version the
// client did not send, reported as bumped (§5.5).
func (d *decision) untie(section string, vi int, o outcome, change Change, u float64) (outcome, Change, bool, error) {
	change.Action, change.To = Bumped, u
	o.applied = u
	d.e.setVersion(&d.p.obj, vi, section, u)
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
	o = outcome{section: section, current: vS, dpKnows: dpKnows, sent: sectionVersion{vR, present}}
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
		if now == next {
			d.res.unsure = true // the clock reads vS+1 itself: the number a hand-made PUT picks
		}
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
	v, clock := d.unreadVersion(vR, vS)
	if clock {
		d.e.setVersion(&d.p.obj, vi, section, v)
		d.res.stamped = append(d.res.stamped, Change{Section: section, From: vR, To: v})
	}
	return v
}

// unreadVersion is max(vR, Now) for a changed section the client sent at vR > vS in a
// decision taken unread; clock says Now chose it. Kept at vR, the decision is Unsure
// when vR is vS+1 (what a hand-made PUT, or ADC's clamp, picks) or there is no clock.
func (d *decision) unreadVersion(vR, vS float64) (v float64, clock bool) {
	if now := storable(d.in.Now); now > vR && now < maxVersion {
		return now, true
	}
	if next, _ := nextStorable(vS); next == vR || d.in.Now == 0 {
		d.res.unsure = true
	}
	return vR, false
}
