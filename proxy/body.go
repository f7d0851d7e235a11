package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/confshim/confshim/metrics"
)

// bodyBudget bounds the request bodies buffered at once (contract §5.7), whatever the
// number of connections: a body reserves what it can hold before a byte is read
// (its Content-Length, or --max-body-bytes without one) and gives back what it did
// not use as soon as it is read. Reserving is not allocating: memory still grows only
// as bytes arrive.
type bodyBudget struct {
	mu      sync.Mutex
	free    int64
	changed chan struct{} // closed and replaced whenever bytes are given back
}

func newBodyBudget(total int64) *bodyBudget {
	return &bodyBudget{free: total, changed: make(chan struct{})}
}

var errBudget = errors.New("request bodies in flight are over their memory budget")

// acquire reserves n bytes, waiting at most wait (or until ctx ends).
func (b *bodyBudget) acquire(ctx context.Context, n int64, wait time.Duration) error {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		b.mu.Lock()
		if b.free >= n {
			b.free -= n
			b.mu.Unlock()
			return nil
		}
		changed := b.changed
		b.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return errBudget
		}
	}
}

func (b *bodyBudget) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.free += n
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// budgetRetryAfter is the Retry-After of a 503 for a full budget, in seconds.
const budgetRetryAfter = "5"

// bodyReader reads configs PUT bodies within --max-body-bytes and the body budget.
type bodyReader struct {
	maxBytes int64         // --max-body-bytes
	wait     time.Duration // how long a body waits for the budget before a 503
	budget   *bodyBudget
	bufs     buffers
	replies
}

// read reads the request body into a pooled buffer. The buffer grows with the bytes
// that arrive, never to what the client announced; arrived, when set, is handed the
// body read so far after each read. release gives the buffer and the budget back; ok
// false: the client was answered.
func (br *bodyReader) read(w http.ResponseWriter, r *http.Request, arrived func([]byte)) (body []byte, release func(), ok bool) {
	limit := br.maxBytes
	if r.ContentLength > limit {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes is over --max-body-bytes (%d)", r.ContentLength, limit))
		return nil, nil, false
	}
	reserved := limit
	if r.ContentLength >= 0 {
		reserved = r.ContentLength
	}
	if err := br.budget.acquire(r.Context(), reserved, br.wait); err != nil {
		br.overBudget(w, r, reserved)
		return nil, nil, false
	}
	bufp := br.bufs.Get()
	body, err := readGrowing((*bufp)[:0], r.Body, limit+1, r.ContentLength, arrived)
	*bufp = body
	n := int64(len(body))
	if n < reserved {
		br.budget.release(reserved - n) // keep what the body holds, not what it announced
		reserved = n
	}
	release = func() {
		br.bufs.Put(bufp)
		br.budget.release(reserved)
	}
	switch {
	case err != nil:
		release()
		if r.Context().Err() != nil || errors.Is(err, io.ErrUnexpectedEOF) {
			br.clientGone(w)
			return nil, nil, false
		}
		writeError(w, http.StatusBadRequest, "cannot read the request body")
		return nil, nil, false
	case n > limit:
		release()
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is over --max-body-bytes (%d)", limit))
		return nil, nil, false
	}
	return body, release, true
}

// overBudget answers a body the budget had no room for within its wait.
func (br *bodyReader) overBudget(w http.ResponseWriter, r *http.Request, reserved int64) {
	if r.Context().Err() != nil {
		br.clientGone(w)
		return
	}
	br.m.Refuse(metrics.RefusedBodyBudget)
	br.log.Warn().Str("event", "refused").Str("reason", "body_budget").Int64("bytes", reserved).Msg("request bodies in flight are over --body-budget-bytes; answered 503")
	w.Header().Set("Retry-After", budgetRetryAfter)
	writeError(w, http.StatusServiceUnavailable, "request bodies in flight are over their memory budget (--body-budget-bytes); retry later")
}

// readGrowing reads r into buf, at most limit bytes. The buffer doubles as bytes
// arrive, never past what the client announced (announced < 0: unknown), so a body of
// a known length ends in a buffer of exactly that length: the pooled buffers, and so
// confshim's memory, do not depend on how the bytes happened to arrive.
func readGrowing(buf []byte, r io.Reader, limit, announced int64, arrived func([]byte)) ([]byte, error) {
	for {
		if len(buf) == cap(buf) && announced >= 0 && int64(len(buf)) >= announced {
			// all that was announced has arrived: look for the end without growing
			more, err := readPastEnd(r)
			if more == nil || err != nil {
				return buf, err
			}
			buf = append(buf, more...)
			announced = -1 // longer than announced: grow as for an unknown length
			continue
		}
		if len(buf) == cap(buf) {
			buf = grow(buf, limit, announced)
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if n > 0 && arrived != nil && int64(len(buf)) <= limit-1 {
			arrived(buf)
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		if int64(len(buf)) >= limit {
			return buf, nil
		}
	}
}

// readPastEnd reads one byte after the announced length: nil at the body's end.
func readPastEnd(r io.Reader) ([]byte, error) {
	var one [1]byte
	n, err := r.Read(one[:])
	switch {
	case n == 0 && err == io.EOF:
		return nil, nil
	case err != nil && err != io.EOF:
		return nil, err
	}
	return one[:n], nil
}

// grow doubles a full buffer, never past what was announced nor past limit.
func grow(buf []byte, limit, announced int64) []byte {
	next := max(2*cap(buf), 64<<10)
	if announced > int64(len(buf)) && int64(next) > announced {
		next = int(announced)
	}
	if int64(next) > limit {
		next = int(limit)
	}
	if next <= len(buf) {
		next = len(buf) + 512 // past the announced length: the read below sees EOF
	}
	grown := make([]byte, len(buf), next)
	copy(grown, buf)
	return grown
}

// buffers is a small free list of body-sized buffers. sync.Pool empties itself at
// every GC, which at tens of megabytes per PUT means allocating and zeroing a new
// buffer each time; this list keeps at most cap(buffers) of them alive.
type buffers chan *[]byte

func (bufs buffers) Get() *[]byte {
	select {
	case b := <-bufs:
		return b
	default:
		b := make([]byte, 0, 64<<10)
		return &b
	}
}

func (bufs buffers) Put(b *[]byte) {
	*b = (*b)[:0]
	select {
	case bufs <- b:
	default: // the list is full: let the GC have it
	}
}
