package proxy

import (
	"context"
	"net/http"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/rewrite"
)

// scope is what every stage of one sync under the PUT lock shares: the client's
// request (its headers are forwarded), the caller's credentials, the lock held, the
// PUT's one deadline, the sync's arrival (the fallback's budget counts from it) and
// what it lent the transport.
type scope struct {
	ctx   context.Context // the request's, bounded by --upstream-timeout
	r     *http.Request
	creds apisix.Credentials
	tx    *dataplane.Tx
	start time.Time
	lent  *lent
}

// lent are the buffers a sync lent the transport and what gives them back: the
// transport may read them until every sent channel closed.
type lent struct {
	releases []func()
	sent     []<-chan struct{}
	took     time.Duration // how long the sync's last PUT took (§8.5's budget)
}

// giveAllBack gives the buffers back once the transport let go of them: at once in the
// usual case (APISIX read the whole body before it answered), so that the next PUT
// finds them in the pool; later, on its own goroutine, when a body is still being sent.
func (l *lent) giveAllBack() {
	giveBack := func() {
		for _, f := range l.releases {
			f()
		}
	}
	if waitAllFor(l.sent, 100*time.Millisecond) {
		giveBack()
		return
	}
	go func() { waitAll(l.sent); giveBack() }()
}

func waitAll(chans []<-chan struct{}) {
	for _, c := range chans {
		<-c
	}
}

// waitAllFor is waitAll for at most d; false when some channel is still open.
func waitAllFor(chans []<-chan struct{}, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for _, c := range chans {
		select {
		case <-c:
		case <-timer.C:
			return false
		}
	}
	return true
}

// outgoingPut is the PUT confshim forwards: the body and the X-Digest to send.
type outgoingPut struct {
	body      []byte
	digest    string
	setDigest bool
	noop      bool // the data plane's own digest, so that APISIX answers 204 (§8.2)
}

// outgoing builds what to forward: the client's bytes, or the rewritten ones.
func outgoing(in rewrite.Input, res *rewrite.Result, dpDigest string) outgoingPut {
	out := outgoingPut{body: in.Body}
	if res == nil || !res.Changed {
		return out
	}
	out.body = res.Body
	if in.HasDigest {
		out.digest, out.setDigest = res.Digest, true
		if res.NoOp && dpDigest != "" {
			out.digest, out.noop = dpDigest, true
		}
	}
	return out
}

// sender forwards the PUTs of a sync.
type sender struct{ api *apisix.Client }

// send sends one complete PUT of the sync on conn, with the client's headers (hop-by-hop
// ones removed, X-Digest as decided), and reads APISIX's answer whole. A PUT on the
// decide connection goes there or not at all (apisix.ErrRedial).
func (s sender) send(sc *scope, conn apisix.Conn, out outgoingPut) (*apisix.Answer, error) {
	ctx := sc.ctx
	if conn == apisix.Decide {
		ctx = apisix.NoRedial(ctx)
	}
	header := sc.r.Header.Clone()
	apisix.RemoveHopHeaders(header)
	header.Del("Expect")
	header.Del("Content-Length")
	if out.setDigest {
		header.Del("X-Digest")
		header.Set("X-Digest", out.digest)
	}
	start := time.Now()
	ans, done, err := s.api.Put(ctx, conn, s.api.ForwardURL(sc.r), header, out.body)
	sc.lent.took = time.Since(start)
	sc.lent.sent = append(sc.lent.sent, done)
	return ans, err
}
