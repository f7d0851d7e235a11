package proxy

import (
	"context"
	"net/http"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/internal/syncmachine"
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

// sender forwards the PUTs of a sync.
type sender struct{ api *apisix.Client }

// send sends one complete PUT of the sync on conn, with the client's headers (hop-by-hop
// ones removed, X-Digest as decided), and reads APISIX's answer whole; took is how long
// that took. A PUT on the decide connection goes there or not at all (apisix.ErrRedial).
func (s sender) send(sc *scope, conn apisix.Conn, out syncmachine.Outgoing) (ans *apisix.Answer, took time.Duration, err error) {
	ctx := sc.ctx
	if conn == apisix.Decide {
		ctx = apisix.NoRedial(ctx)
	}
	header := sc.r.Header.Clone()
	apisix.RemoveHopHeaders(header)
	header.Del("Expect")
	header.Del("Content-Length")
	if out.SetDigest {
		header.Del("X-Digest")
		header.Set("X-Digest", out.Digest)
	}
	start := time.Now()
	ans, done, err := s.api.Put(ctx, conn, s.api.ForwardURL(sc.r), header, out.Body)
	sc.lent.sent = append(sc.lent.sent, done)
	return ans, time.Since(start), err
}
