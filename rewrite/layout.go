package rewrite

import (
	"hash/maphash"
	"slices"
)

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
