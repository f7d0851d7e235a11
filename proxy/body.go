package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// statusClientGone is logged and counted for a client that went away: nothing reaches it.
const statusClientGone = 499

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

// readBody reads the request body into a pooled buffer, within --max-body-bytes and
// the body budget. The buffer grows with the bytes that arrive, never to what the
// client announced. release gives the buffer and the budget back.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, func(), bool) {
	limit := p.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		p.writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes is over --max-body-bytes (%d)", r.ContentLength, limit))
		return nil, nil, false
	}
	reserved := limit
	if r.ContentLength >= 0 {
		reserved = r.ContentLength
	}
	if err := p.budget.acquire(r.Context(), reserved, p.cfg.BodyBudgetWait); err != nil {
		if r.Context().Err() != nil {
			p.m.ClientDisconnects.Inc()
			w.WriteHeader(statusClientGone)
			return nil, nil, false
		}
		p.m.Refused.WithLabelValues("body_budget").Inc()
		p.log.Warn().Str("event", "refused").Str("reason", "body_budget").Int64("bytes", reserved).Msg("request bodies in flight are over --body-budget-bytes; answered 503")
		w.Header().Set("Retry-After", budgetRetryAfter)
		p.writeError(w, http.StatusServiceUnavailable, "request bodies in flight are over their memory budget (--body-budget-bytes); retry later")
		return nil, nil, false
	}
	bufp := p.getBuf()
	buf := bytes.NewBuffer((*bufp)[:0])
	_, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
	*bufp = buf.Bytes()
	n := int64(buf.Len())
	if n < reserved {
		p.budget.release(reserved - n) // keep what the body holds, not what it announced
		reserved = n
	}
	release := func() {
		p.putBuf(bufp)
		p.budget.release(reserved)
	}
	switch {
	case err != nil:
		release()
		if r.Context().Err() != nil || errors.Is(err, io.ErrUnexpectedEOF) {
			p.m.ClientDisconnects.Inc()
			w.WriteHeader(statusClientGone)
			return nil, nil, false
		}
		p.writeError(w, http.StatusBadRequest, "cannot read the request body")
		return nil, nil, false
	case n > limit:
		release()
		p.writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is over --max-body-bytes (%d)", limit))
		return nil, nil, false
	}
	return buf.Bytes(), release, true
}

// buffers is a small free list of body-sized buffers. sync.Pool empties itself at
// every GC, which at tens of megabytes per PUT means allocating and zeroing a new
// buffer each time; this list keeps at most cap(buffers) of them alive.
type buffers chan *[]byte

func (p *Proxy) getBuf() *[]byte {
	select {
	case b := <-p.bufs:
		return b
	default:
		b := make([]byte, 0, 64<<10)
		return &b
	}
}

func (p *Proxy) putBuf(b *[]byte) {
	*b = (*b)[:0]
	select {
	case p.bufs <- b:
	default: // the list is full: let the GC have it
	}
}

// hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// credentials are the caller's admin key in every form APISIX reads it (contract
// §5.4), carried exactly as sent: the query string, each header nginx's
// $http_x_api_key matches (any case, "_" for "-"), and the cookies. confshim never
// decides which one APISIX will take; it lets APISIX decide, as it will for the PUT.
type credentials struct {
	header   http.Header
	rawQuery string
}

func credentialsOf(r *http.Request) credentials {
	c := credentials{header: http.Header{}, rawQuery: r.URL.RawQuery}
	for name, values := range r.Header {
		if isAPIKeyHeader(name) || name == "Cookie" {
			c.header[name] = values
		}
	}
	return c
}

// isAPIKeyHeader: nginx matches $http_x_api_key case-insensitively with "_" for "-"
// (APISIX allows underscores in header names).
func isAPIKeyHeader(name string) bool {
	return len(name) == len("x-api-key") && strings.EqualFold(strings.ReplaceAll(name, "_", "-"), "x-api-key")
}

// keyCredentials are credentials made of one admin key (confshim's own requests).
func keyCredentials(key string) credentials {
	c := credentials{header: http.Header{}}
	if key != "" {
		c.header.Set("X-API-KEY", key)
	}
	return c
}

func (c credentials) apply(req *http.Request) {
	for name, values := range c.header {
		req.Header[name] = append([]string(nil), values...)
	}
}
