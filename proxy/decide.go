package proxy

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/internal/reseed"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// decider is the decide stage of a configs PUT: the state the sync is decided on
// (believed or proven, §5.4), the body (the client's, or its correction before the
// PUT, §8.5), and rewrite's pure decision on both.
type decider struct {
	rw              *rewrite.Rewriter
	dp              *dataplane.Belief
	api             *apisix.Client
	watch           *reseed.Watcher // nil with --reseed-interval 0
	states          *stateReader
	fallback        *fallback
	bufs            buffers
	notes           notes
	correctedLayout atomic.Pointer[rewrite.Layout] // the last body corrected before the PUT (§8.5)
}

// received is the client's PUT as read and scanned before the lock.
type received struct {
	in        rewrite.Input // the body and the X-Digest as the client sent them
	prepared  *rewrite.Prepared
	untouched metrics.UntouchedReason // why it goes to APISIX as it came ("" to decide)
	scanned   time.Duration           // the scan's time, counted into the rewrite's
}

// upfront is the body a sync is decided on: the client's, or its correction before the
// PUT (§8.5's steady state: the items this APISIX is known to reject held back).
type upfront struct {
	in       rewrite.Input
	prepared *rewrite.Prepared
	held     []dataplane.Held
}

// decided is one decision of the sync: the body and the state it was made on, and
// rewrite's result (nil: the body goes to APISIX as it came, untouched says why).
type decided struct {
	upfront
	res       *rewrite.Result
	untouched metrics.UntouchedReason
}

// retries is how a sync came to be decided again: at most once after a version
// conflict, at most maxRedials times after the decide connection closed. What a read
// learns and what the steady state holds carry over.
type retries struct {
	conflicted bool
	redials    int
	learnt     string           // how a fresh read would learn an out-of-band write
	carried    []dataplane.Held // held by a fallback of this sync before it was decided again
	holdAgain  bool             // the steady state is worked out at the next decision
	upfront    upfront
}

// firstTry is how a sync starts: decided on the client's body, the steady state to
// work out.
func firstTry(rcv received) *retries {
	return &retries{learnt: learntByReread, holdAgain: true, upfront: upfront{in: rcv.in, prepared: rcv.prepared}}
}

// errReseedPending: the data plane was found empty and the kept configuration could not
// be put back first; the sync is not decided on the empty state.
var errReseedPending = errors.New("the data plane lost its configuration; re-seeding it did not succeed")

// decide reads the data plane's state (fresh: read it, whatever is believed) and runs
// the rewrite. A body that goes to APISIX as it came says why in untouched.
func (dc *decider) decide(sc *scope, rcv received, fresh bool, t *retries) (decided, error) {
	d := decided{upfront: t.upfront, untouched: rcv.untouched}
	if rcv.untouched != "" {
		return d, nil
	}
	st, verified, err := dc.decisionState(sc, fresh, t.learnt)
	if err != nil {
		return untouchedIfRefused(d, err)
	}
	if t.holdAgain {
		t.holdAgain = false
		t.upfront = dc.holdKnownRejections(sc, rcv, t.carried)
		d.upfront = t.upfront
	}
	v := sc.tx.View()
	d.in.State, d.in.Record, d.in.Owned = st, v.Record, v.Owned
	d.in.Now, d.in.Unread = float64(time.Now().UnixMilli()), !verified
	res, err := dc.run(sc, &d.upfront, rcv.scanned, t.learnt)
	var skip *rewrite.SkipError
	switch {
	case errors.As(err, &skip):
		dc.notes.log.Info().Str("event", "forward_untouched").Str("reason", skip.Reason).Msg("configs PUT not rewritten; APISIX will judge it")
		d.untouched = metrics.UntouchedInvalid
		return d, nil
	case err != nil:
		return untouchedIfRefused(d, err)
	}
	if len(res.Changes) > 0 {
		dc.notes.decision(res)
	}
	d.res = res
	return d, nil
}

// untouchedIfRefused: APISIX refused the caller's state read, so it will refuse the PUT
// itself, in its own words; any other error is the sync's.
func untouchedIfRefused(d decided, err error) (decided, error) {
	var refused apisix.RefusedError
	if errors.As(err, &refused) {
		d.untouched = metrics.UntouchedRefused
		return d, nil
	}
	return d, err
}

// run decides u.in, and decides again when the decision needs more than the state it
// was given: the kept configuration's items, or a state shown current (§5.4). u.in
// ends as the input the result was decided on.
func (dc *decider) run(sc *scope, u *upfront, scanned time.Duration, learnt string) (*rewrite.Result, error) {
	buf := dc.bufs.get()
	u.in.Buf = *buf
	start := time.Now()
	res, err := dc.rw.Decide(u.prepared, u.in)
	if errors.Is(err, rewrite.ErrStateIncomplete) {
		// the items the decision needs are in the kept configuration when it describes
		// the state believed (after a fallback the record forgot a corrected section)
		if ks := sc.tx.View().KeptState(); ks != nil {
			u.in.State = ks
			res, err = dc.rw.Decide(u.prepared, u.in)
		}
	}
	if err == nil && u.in.Unread && (res.Unsure() || res.NeedsProof()) {
		// a version decided unread that the clock did not choose could equal one a
		// writer set meanwhile, or the data plane's items went into the body: the
		// decision stands only on a state shown current (§5.4), so look first
		shown, herr := dc.states.revalidate(sc.ctx, sc.tx, sc.creds)
		if herr != nil {
			dc.bufs.put(buf)
			return nil, herr
		}
		if !shown {
			err = rewrite.ErrStateIncomplete // decided again on a fresh read, just below
		}
	}
	if errors.Is(err, rewrite.ErrStateIncomplete) {
		st, _, rerr := dc.states.stateFor(sc.ctx, sc.tx, sc.creds, true, learnt)
		if rerr != nil {
			dc.bufs.put(buf)
			return nil, rerr
		}
		u.in.State, u.in.Unread = st, false
		start = time.Now()
		res, err = dc.rw.Decide(u.prepared, u.in)
	}
	dc.notes.m.RewriteDuration.Observe((scanned + time.Since(start)).Seconds())
	if res == nil || !res.Changed {
		dc.bufs.put(buf)
	}
	return res, err
}

// decisionState is the state this sync is decided on (verified: shown current for it).
// A data plane found empty gets the kept configuration back first (§8.4: the client's
// sync beat the watch to a restarted data plane); a sync is never decided on the empty
// state while there is one to restore (its preserved and merged sections would go out
// empty, and the kept configuration with them: §5.4).
func (dc *decider) decisionState(sc *scope, fresh bool, learnt string) (*rewrite.State, bool, error) {
	ctx, tx := sc.ctx, sc.tx
	st, verified, err := dc.states.stateFor(ctx, tx, sc.creds, fresh, learnt)
	if v := tx.View(); err != nil || !v.Empty(dc.api.NoHead()) || !dc.dp.Snapshot().Keeps || v.Kept == nil {
		return st, verified, err
	}
	if dc.watch.ReseedLocked(ctx, tx, time.Now(), &sc.creds) {
		return tx.View().State, verified, nil
	}
	if st, verified, err = dc.states.stateFor(ctx, tx, sc.creds, true, learnt); err == nil && tx.View().Empty(dc.api.NoHead()) {
		return nil, false, errReseedPending
	}
	return st, verified, err // someone wrote meanwhile: decided on what it holds
}

// holdKnownRejections is the body decided when this APISIX is known to reject items
// of it (§8.5's steady state): the client's with those items held back, else the
// client's own.
func (dc *decider) holdKnownRejections(sc *scope, rcv received, carried []dataplane.Held) upfront {
	client := upfront{in: rcv.in, prepared: rcv.prepared}
	corrected, held := dc.fallback.of(sc).steadyState(sc.ctx, rcv.prepared, carried)
	if corrected == nil {
		return client
	}
	prepared, err := dc.rw.PrepareLike(corrected, dc.correctedLayout.Load())
	if err != nil {
		return client
	}
	dc.correctedLayout.Store(prepared.Layout()) // the steady state sends this one again
	in := rcv.in
	in.Body = corrected
	if in.HasDigest {
		in.Digest += "+held:" + correctionHash(held) // another body than the client's
	}
	return upfront{in: in, prepared: prepared, held: held}
}
