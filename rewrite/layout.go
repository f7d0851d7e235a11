package rewrite

import (
	"hash/maphash"
	"slices"
)

// A Layout is the top-level shape of the last JSON body Prepare scanned — its members'
// offsets and a hash of every part between them — without the bytes. ADC re-sends the
// same configuration on every sync, re-stamping a few versions and modifiedIndex values
// with numbers of the same length: such a body has the same length and differs only
// inside a few values. PrepareLike then validates just those values instead of scanning
// the whole body again; the hashing it does instead is needed for the record anyway.
// The hashes are seeded per process, so no client can aim a collision at them.
type Layout struct {
	size     int
	obj      object   // members (named; their raw keys dropped), the closing brace, the index: read-only
	headSum  uint64   // body[:first member]
	keySums  []uint64 // per member: "key": up to its value
	tailSums []uint64 // per member: after its value, up to the next member (or the end)
	valSums  []uint64 // per member: its value
}

// Layout returns what the next PrepareLike may reuse (nil for a YAML body).
func (p *Prepared) Layout() *Layout { return p.layout }

// layoutOf records body's shape; valSums are the members' value hashes.
func (rw *Rewriter) layoutOf(body []byte, obj object, valSums []uint64) *Layout {
	// The members' raw keys are sub-slices of body, whose pooled buffer the next body
	// overwrites: the layout keeps their names only, so it holds none of body's bytes.
	obj.members = slices.Clone(obj.members)
	for i := range obj.members {
		obj.members[i].key = nil
	}
	l := &Layout{size: len(body), obj: obj, valSums: valSums,
		keySums: make([]uint64, len(obj.members)), tailSums: make([]uint64, len(obj.members))}
	if len(obj.members) == 0 {
		l.headSum = maphash.Bytes(rw.seed, body)
		return l
	}
	l.headSum = maphash.Bytes(rw.seed, body[:obj.members[0].start])
	for i, m := range obj.members {
		l.keySums[i] = maphash.Bytes(rw.seed, body[m.start:m.valueStart])
		l.tailSums[i] = maphash.Bytes(rw.seed, body[m.valueEnd:l.nextStart(i)])
	}
	return l
}

// nextStart is where what follows member i ends: the next member, or the body's end.
func (l *Layout) nextStart(i int) int {
	if i+1 < len(l.obj.members) {
		return l.obj.members[i+1].start
	}
	return l.size
}

// PrepareLike is Prepare for a body that may share prev's shape: when it has prev's
// length and the same bytes everywhere but inside some members' values, and those
// values are valid JSON, it is the same object with the same members, and only those
// values are validated. Otherwise it scans the whole body, as Prepare does.
func (rw *Rewriter) PrepareLike(body []byte, prev *Layout) (*Prepared, error) {
	if prev == nil || len(body) != prev.size || len(prev.obj.members) == 0 {
		return rw.Prepare(body)
	}
	members := prev.obj.members
	if maphash.Bytes(rw.seed, body[:members[0].start]) != prev.headSum {
		return rw.Prepare(body)
	}
	valSums := make([]uint64, len(members))
	for i, m := range members {
		if maphash.Bytes(rw.seed, body[m.start:m.valueStart]) != prev.keySums[i] ||
			maphash.Bytes(rw.seed, body[m.valueEnd:prev.nextStart(i)]) != prev.tailSums[i] {
			return rw.Prepare(body)
		}
		valSums[i] = maphash.Bytes(rw.seed, body[m.valueStart:m.valueEnd])
		if valSums[i] != prev.valSums[i] && !validValue(body[m.valueStart:m.valueEnd], 1) {
			return rw.Prepare(body) // let the full scan say what is wrong
		}
	}
	p := &Prepared{body: body, obj: prev.obj, sums: valSums}
	p.layout = &Layout{size: prev.size, obj: prev.obj, headSum: prev.headSum, keySums: prev.keySums, tailSums: prev.tailSums, valSums: valSums}
	return p, nil
}
