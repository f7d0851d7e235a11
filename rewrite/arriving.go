package rewrite

import (
	"bytes"
	"errors"
	"hash/maphash"
	"sync/atomic"
)

// BodyScan scans a JSON body while it arrives: Feed it each longer prefix of the body
// (from one goroutine at a time), then PrepareArrived with the whole body once no Feed
// runs any more; only what was not
// scanned yet (at most the item the last prefix ended in) is left to do then. The result
// is exactly Prepare's: the same members, the same sums, the same errors.
//
// A prefix scan stops where the prefix ends (or at an error, which only the whole body
// may report) and goes on, at the next prefix, from the start of the value it stopped
// in: a section's item or a top-level member, never deeper. A prefix is scanned again
// from there only once the bytes after it have doubled, so the work stays linear in the
// body, however it is cut.
type BodyScan struct {
	rw      *Rewriter
	s       scanner
	stack   [64]byte
	at      resumePoint // where the next prefix is scanned from
	started bool
	retryAt int // the prefix length at which the scan is tried again
	sums    []uint64
	stop    atomic.Bool
	// splitAbove: the rest left at Finish is split between two cores from this size
	// (splitAbove; tests lower it)
	splitAbove int
}

// resumePoint is the scanner's state at a value that starts at most two levels deep.
type resumePoint struct {
	i       int
	stack   [2]byte
	open    int // containers open (the scanner's stack, at most two)
	members int
	cur     member
}

// errScanStopped: Stop was called.
var errScanStopped = errors.New("the scan was stopped")

// NewBodyScan starts the scan of a JSON body that is still arriving.
func (rw *Rewriter) NewBodyScan() *BodyScan {
	bs := &BodyScan{rw: rw, splitAbove: splitAbove}
	bs.s.obj.members = make([]member, 0, 32)
	bs.s.stack = bs.stack[:0]
	bs.s.partial = true
	bs.s.mark = bs.mark
	return bs
}

// Stop makes a Feed in progress return soon (at the next item) and later ones at once;
// what was scanned stays, and Finish does the rest.
func (bs *BodyScan) Stop() { bs.stop.Store(true) }

func (bs *BodyScan) mark() error {
	if bs.stop.Load() {
		return errScanStopped
	}
	s := &bs.s
	bs.at = resumePoint{i: s.i, open: len(s.stack), members: len(s.obj.members), cur: s.cur}
	copy(bs.at.stack[:], s.stack)
	return nil
}

// restore puts the scanner back where the last mark left it.
func (bs *BodyScan) restore() {
	s := &bs.s
	s.i, s.cur = bs.at.i, bs.at.cur
	s.stack = append(s.stack[:0], bs.at.stack[:bs.at.open]...)
	s.obj.members = s.obj.members[:bs.at.members]
}

// Feed scans as much of prefix, the body's first bytes so far, as it can. prefix must
// keep its bytes until Finish (a longer one may live in another array).
func (bs *BodyScan) Feed(prefix []byte) {
	if bs.stop.Load() || len(prefix) < bs.retryAt {
		return
	}
	s := &bs.s
	s.b = prefix
	if !bs.started {
		s.i = skipWS(prefix, 0)
		if s.i >= len(prefix) {
			bs.retryAt = 2 * len(prefix) // whitespace so far: look again once it doubled
			return
		}
		s.isObject, bs.started = prefix[s.i] == '{', true
		bs.at = resumePoint{i: s.i}
	} else {
		bs.restore()
	}
	err := s.resume() // a stop, too, leaves the last mark a place to go on from
	bs.restore()
	bs.retryAt = len(prefix) + max(len(prefix)-bs.at.i, 1)
	if err == nil {
		bs.retryAt = len(prefix) + 1 // scanned to its end: only the whole body tells more
	}
	bs.hashDone(prefix)
}

// hashDone hashes the members the scan has finished (those before the resume point).
func (bs *BodyScan) hashDone(prefix []byte) {
	for i := len(bs.sums); i < bs.at.members; i++ {
		m := bs.s.obj.members[i]
		bs.sums = append(bs.sums, maphash.Bytes(bs.rw.seed, prefix[m.valueStart:m.valueEnd]))
	}
}

// left is how much of a body of size bytes the scan has not done.
func (bs *BodyScan) left(size int) int {
	if !bs.started {
		return size
	}
	return size - bs.at.i
}

// finish scans the rest of body strictly and returns its top-level object as
// scanObject would, with the members' sums (nil when Finish must compute them).
func (bs *BodyScan) finish(body []byte) (object, []uint64, error) {
	if !bs.started {
		obj, err := scanObject(body, bs.s.obj.members)
		return obj, nil, err
	}
	s := &bs.s
	s.b, s.partial, s.mark = body, false, nil
	bs.restore()
	if err := bs.scanRest(body); err != nil {
		return object{}, nil, err
	}
	if !s.isObject {
		return object{}, nil, errNotObject
	}
	for i := range s.obj.members { // their keys in body's array, not an earlier prefix's
		m := &s.obj.members[i]
		m.key = body[m.start+1 : m.start+1+len(m.key)]
	}
	return s.obj, bs.sums, nil
}

// splitAbove is how much of a body must be left to scan at Finish for it to be split
// between two cores.
const splitAbove = 1 << 20

// scanRest scans the rest of the body from the last mark. When much is left (the bytes
// came faster than the scan, as over loopback), a second scanner takes the second half
// on another core from a place that looks like the start of a section's next item
// ("},{"): the first half's scan proves or refutes that guess when it gets there — at
// exactly that offset, a value starting inside the top-level object's member array —
// and without the proof the first scan simply goes on alone. Either way the result and
// the error are those of one scan from the mark.
func (bs *BodyScan) scanRest(body []byte) error {
	s := &bs.s
	split := bs.splitPoint(body)
	if split < 0 || !s.isObject {
		return s.resume()
	}
	second := &scanner{b: body, i: split, isObject: true, stack: make([]byte, 2, 64), obj: object{members: make([]member, 0, 8)}}
	copy(second.stack, "{[")
	var stop atomic.Bool
	second.mark = func() error {
		if stop.Load() {
			return errScanStopped
		}
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- second.resume() }()
	reached := false
	s.mark = func() error {
		if s.i == split && len(s.stack) == 2 && s.stack[1] == '[' {
			reached = true
			return errScanStopped
		}
		return nil
	}
	err := s.resume()
	s.mark = nil
	if !reached {
		stop.Store(true) // the guess was wrong (or an error came first): one scan decided
		<-done
		return err
	}
	if err := <-done; err != nil {
		return err
	}
	// the second scan is the first's from split on: the member it closed first is the
	// one the first scan was in
	if len(second.obj.members) > 0 {
		m := &second.obj.members[0]
		m.key, m.start, m.valueStart = s.cur.key, s.cur.start, s.cur.valueStart
	}
	s.obj.members = append(s.obj.members, second.obj.members...)
	s.obj.close, s.stack = second.obj.close, s.stack[:0]
	return nil
}

// splitPoint is where a second scanner may start — the '{' of what looks like a
// section's next item, in the second half of what is left — or -1.
func (bs *BodyScan) splitPoint(body []byte) int {
	from := bs.at.i
	if len(body)-from < bs.splitAbove {
		return -1
	}
	mid := from + (len(body)-from)/2
	k := bytes.Index(body[mid:], []byte(`},{"`))
	if k < 0 {
		return -1
	}
	return mid + k + 2
}
