// Package reseed is the watcher (contract §8.4): an actor with a goroutine of its own
// that notices a data plane that restarted empty, re-seeds it with the kept
// configuration, and reads back one written behind confshim, while costing APISIX as
// little as the belief allows.
//
// On APISIX every GET, HEAD or PUT of /apisix/admin/configs decodes the whole stored
// document (≈ 0.3 s of a worker at 40,000 routes), while HEAD /apisix/admin and an empty
// POST /configs/validate cost well under a millisecond. So:
//
//   - The watch pings HEAD /apisix/admin every --reseed-interval on the decide
//     connection, which stays open between syncs. A container restart closes it; the
//     configs HEAD that tells an empty data plane is asked on such evidence (the ping
//     had to open a new connection, failed, or saw another Server version), when the
//     kept configuration could not be derived, and otherwise as often as a cost budget
//     allows (lookInterval): between --reseed-interval and once a minute. A look's cost
//     is judged before it is sent, from the stored document's size confshim knows (the
//     kept configuration: what it last forwarded in an accepted PUT, read or re-seeded),
//     so the budget holds in the minutes right after a sync grew the configuration.
//   - Under the PUT lock, the state read and the PUT travel on that connection; when
//     a sync may be decided on the belief without a read is proxy/state.go's rule.
package reseed

import (
	"bytes"
	"context"
	"maps"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// safetyInterval bounds how long an unnoticed change can go unseen by the watch: at
// least one configs HEAD a minute, however large the configuration.
const safetyInterval = time.Minute

// lookBudget is the share of an APISIX worker the watch's looks may take in any
// minute: a look (a configs HEAD) makes APISIX decode its whole stored document on the
// worker that also proxies traffic. The contract allows 0.5 %; planning with 0.4 %
// leaves room for a decode slower than the 25 ms per MB it is judged by (spec §11
// measured 276–342 ms for 11 MB), and keeps a 40,000-route configuration (≈ 0.28 s a
// look) at one look a minute.
const lookBudget = 0.004

// budgetWindow is the span the budget holds in: every minute (contract §8.4).
const budgetWindow = time.Minute

// decodePerMB is what a look costs APISIX per MB (10^6 bytes) of stored document
// (spec §11: a configs HEAD decodes the whole document, ≈ 25 ms per MB on a real 3.17).
const decodePerMB = 25 * time.Millisecond

// sizeCost is what a look at a stored document of n bytes costs APISIX: one decode.
func sizeCost(n int) time.Duration {
	return time.Duration(float64(decodePerMB) * float64(n) / 1e6)
}

// maxLoggedSections bounds a re-seed's log line (§5.7).
const maxLoggedSections = 32

// learnt is how the watch learnt an out-of-band write.
const learnt = "watch"

// Host is what the watcher needs of the handler it serves: the state read as the PUT
// path makes it, and where to say what the watch learnt.
type Host interface {
	// ReadState reads and parses the data plane's configuration on the decide
	// connection.
	ReadState(ctx context.Context, creds apisix.Credentials) (st *rewrite.State, digest, lastModified string, err error)
	// NoteMoves is told of the out-of-band writes a read back showed.
	NoteMoves(moves []dataplane.Move, how string)
	// NoteReseed is told of each re-seed's outcome (result as the metric's label).
	NoteReseed(result string, status int, took time.Duration)
}

// Config is what the watcher needs.
type Config struct {
	Interval       time.Duration // --reseed-interval (> 0)
	SafetyInterval time.Duration // the longest between looks (0: safetyInterval)
	AdminKey       string        // --admin-key: for the watch's own requests
	API            *apisix.Client
	Belief         *dataplane.Belief
	Metrics        *metrics.Metrics
	Log            zerolog.Logger
	Host           Host
	// Ticks drive the watch (nil: a ticker of Interval) and Now is its clock (nil:
	// time.Now): tests drive both, so that what they count does not depend on how busy
	// the machine is.
	Ticks <-chan time.Time
	Now   func() time.Time
	// TickDone, when set, is told each time the watch has handled a tick (tests wait
	// for it before they move the clock again).
	TickDone func()
}

// Watcher is the watch.
type Watcher struct {
	cfg    Config
	bg     sync.WaitGroup
	caller atomic.Pointer[apisix.Credentials] // the last accepted caller's (memory only)
}

// New returns the watcher; Start runs it.
func New(cfg Config) *Watcher {
	if cfg.SafetyInterval <= 0 {
		cfg.SafetyInterval = safetyInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Watcher{cfg: cfg}
}

// Start runs the watch until ctx ends; Wait returns once it has.
func (w *Watcher) Start(ctx context.Context) {
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		w.run(ctx)
	}()
}

// Wait returns when the watch has stopped.
func (w *Watcher) Wait() { w.bg.Wait() }

// NoteCaller keeps the credentials of a caller whose PUT APISIX accepted, for the
// watch's own requests when there is no --admin-key; memory only.
func (w *Watcher) NoteCaller(creds apisix.Credentials) { w.caller.Store(&creds) }

// credentials are --admin-key, else the last accepted caller's.
func (w *Watcher) credentials() (apisix.Credentials, bool) {
	if w.cfg.AdminKey != "" {
		return apisix.KeyCredentials(w.cfg.AdminKey), true
	}
	creds := w.caller.Load()
	if creds == nil || creds.IsZero() {
		return apisix.Credentials{}, false
	}
	return *creds, true
}

// lookInterval is how long the watch waits between looks with nothing suspicious seen,
// for looks that cost APISIX cost each: as often as the budget allows in every minute,
// never more often than --reseed-interval, at least once per safety interval (a
// minute). Looks at least budgetWindow/k apart put at most k of them in any minute, so
// the interval is a minute over the most looks whose cost fits the minute's budget
// (cost / budget would let two looks of 0.15–0.24 s fall into one minute). A few
// hundred routes are looked at every second; 10,000 (≈ 70 ms) every 20 s; 40,000
// (≈ 0.28 s) once a minute.
func (w *Watcher) lookInterval(cost time.Duration) time.Duration {
	d := w.cfg.SafetyInterval
	if cost <= 0 {
		d = w.cfg.Interval
	} else if k := math.Floor(lookBudget * float64(budgetWindow) / float64(cost)); k >= 1 {
		d = time.Duration(float64(budgetWindow) / k)
	}
	return min(max(d, w.cfg.Interval), w.cfg.SafetyInterval)
}

// run pings the data plane every interval and looks at its configuration (a configs
// HEAD) when something suggests it changed, or as the budget allows.
func (w *Watcher) run(ctx context.Context) {
	ticks := w.cfg.Ticks
	if ticks == nil {
		t := time.NewTicker(w.cfg.Interval)
		defer t.Stop()
		ticks = t.C
	}
	st := watchState{suspect: true} // nothing is known at start
	for {
		var at time.Time
		select {
		case <-ctx.Done():
			return
		case at = <-ticks:
		}
		keepOn := w.tick(ctx, &st, at)
		if w.cfg.TickDone != nil {
			w.cfg.TickDone()
		}
		if !keepOn {
			return
		}
	}
}

// watchState is what the watch carries from one tick to the next.
type watchState struct {
	suspect    bool          // something suggests the data plane changed: look
	lastServer string        // the Server header the last ping saw
	lastCheck  time.Time     // the tick at which the watch last looked
	latency    time.Duration // what looks took, as nextLatency keeps it
	bytes      int           // the stored document's size as last known (0: not known)
}

// nextLatency is what the looks' latency is taken as after one that took took: at most
// twice what it was taken as before. One slow answer — an APISIX still loading after a
// restart, a busy worker — is not a decode that grew, and would otherwise space the
// looks by minutes, leaving a restart behind a proxy, which no ping can see, unnoticed
// that long. A configuration that grew needs no latency to be seen: its size is known
// before the next look (lookCost).
func nextLatency(prev, took time.Duration) time.Duration {
	if prev > 0 && took > 2*prev {
		return 2 * prev
	}
	return took
}

// lookCost is what the next look will cost APISIX, judged before it is sent: the stored
// document's size as confshim knows it — the kept configuration, which follows every
// PUT APISIX accepted through confshim (a sync that grew the configuration counts at
// once), every read and every re-seed — at 25 ms per MB, or what looks took when that is
// more (an APISIX slower than that figure; the only measure while the size is not
// known), that latency taken at most twice what it was before (nextLatency).
func (w *Watcher) lookCost(st *watchState) time.Duration {
	if k := w.cfg.Belief.Snapshot().Kept; k != nil {
		if n := k.Bytes(); n != st.bytes {
			if n < st.bytes {
				// a smaller configuration decodes faster: the latency learnt on the
				// larger one would hold the looks back until the next one is timed
				st.latency = time.Duration(float64(st.latency) * float64(n) / float64(st.bytes))
			}
			st.bytes = n
		}
	}
	return max(sizeCost(st.bytes), st.latency)
}

// tick pings the data plane and looks at its configuration when something suggests it
// changed, or as the budget allows; false when the watch cannot work here (3.13). at is
// the tick's time: looks are spaced from tick to tick, so that neither a ping's nor a
// look's latency turns a look every interval into one every other interval.
func (w *Watcher) tick(ctx context.Context, st *watchState, at time.Time) bool {
	b, api := w.cfg.Belief, w.cfg.API
	tx, free := b.TryLock()
	if !free {
		return true // a PUT is in flight on the decide connection: it tells what a ping would
	}
	dials, _ := api.UnexpectedDials()
	server, err := api.Ping(ctx, w.cfg.AdminKey)
	n, counted := api.UnexpectedDials() // a connection APISIX said it closes is no sign
	redialed := counted && n != dials
	if err != nil || redialed || server != st.lastServer {
		tx.Distrust() // down, a new connection, or another APISIX answering
	}
	tx.Unlock()
	if err != nil {
		st.suspect = true // unreachable or reset: it may come back empty
		w.cfg.Log.Debug().Str("event", "watch").Str("error", apisix.SafeError(err)).Msg("the data plane did not answer the ping")
		return true
	}
	if redialed || server != st.lastServer {
		st.suspect = true // a new connection, or another APISIX answering
	}
	st.lastServer = server
	if !st.suspect && !b.RefreshDue() && at.Sub(st.lastCheck) < w.lookInterval(w.lookCost(st)) {
		return true
	}
	w.cfg.Log.Debug().Str("event", "watch").Bool("suspect", st.suspect).Msg("looking at the data plane's configuration")
	looked, took, ok := w.look(ctx)
	if looked {
		st.suspect, st.lastCheck, st.latency = false, at, nextLatency(st.latency, took)
	}
	return ok
}

// look is the watch's look at the configuration (a configs HEAD, which costs APISIX a
// decode of its stored document): an empty data plane is re-seeded, one that changed
// without confshim is read back. looked says whether the data plane answered, took how
// long the HEAD took; ok is false when re-seeding cannot work here (APISIX 3.13).
func (w *Watcher) look(ctx context.Context) (looked bool, took time.Duration, ok bool) {
	api := w.cfg.API
	if api.NoHead() {
		w.cfg.Log.Info().Str("event", "reseed_off").Msg("the data plane has no HEAD /apisix/admin/configs (APISIX 3.13): re-seeding is off")
		return false, 0, false
	}
	creds, have := w.lookCredentials()
	if !have {
		return false, 0, true // nobody's key yet: nothing kept either
	}
	start := w.cfg.Now()
	head, status, err := api.Head(ctx, apisix.Shared, creds)
	took = w.cfg.Now().Sub(start)
	switch {
	case status == http.StatusNotFound:
		return false, 0, true // APISIX 3.13: said at the next tick
	case err != nil || head == nil:
		return false, 0, true // down, restarting or refusing the key: the next tick looks again
	case head.LastModified == "":
		tx, _ := w.cfg.Belief.Lock(context.Background())
		defer tx.Unlock()
		w.ReseedLocked(ctx, tx, w.cfg.Now(), nil)
	default:
		w.refresh(ctx, head.Digest, head.LastModified)
	}
	return true, took, true
}

// lookCredentials are the watch's, read without waiting for a PUT in flight.
func (w *Watcher) lookCredentials() (apisix.Credentials, bool) {
	if w.cfg.AdminKey != "" {
		return apisix.KeyCredentials(w.cfg.AdminKey), true
	}
	tx, free := w.cfg.Belief.TryLock()
	if !free {
		return apisix.Credentials{}, false // a PUT is in flight: look next time
	}
	defer tx.Unlock() // a PUT in flight may change the caller: look next time
	return w.credentials()
}

// refresh reads the data plane when it changed since the kept configuration (an
// out-of-band write) or when the kept one could not be derived.
func (w *Watcher) refresh(ctx context.Context, digest, lastModified string) {
	tx, _ := w.cfg.Belief.Lock(context.Background())
	defer tx.Unlock()
	if tx.KeptIsCurrent(digest, lastModified) {
		return
	}
	creds, _ := w.credentials()
	st, d, lm, err := w.cfg.Host.ReadState(ctx, creds)
	if err != nil || lm == "" {
		return
	}
	w.cfg.Host.NoteMoves(tx.Refreshed(st, d, lm, w.cfg.API.NoHead(), w.cfg.API.DecideConn()), learnt)
	w.cfg.Log.Debug().Str("event", "kept_refreshed").Msg("read the data plane's configuration back after a write confshim did not make")
}

// ReseedLocked PUTs the kept configuration back into an empty data plane; the caller
// holds the PUT lock. A HEAD on the decide connection first checks that the data plane
// still holds nothing, and the PUT goes on that connection: a data plane that holds
// anything is never overwritten. caller are the caller's credentials for a re-seed
// before a client's sync, nil for the watch's own. It reports whether the data plane
// now holds the kept configuration.
func (w *Watcher) ReseedLocked(ctx context.Context, tx *dataplane.Tx, foundEmpty time.Time, caller *apisix.Credentials) bool {
	api, m := w.cfg.API, w.cfg.Metrics
	k := tx.View().Kept
	if k == nil {
		return false
	}
	creds, _ := w.credentials()
	if caller != nil {
		creds = *caller
	}
	if head, _, err := api.Head(ctx, apisix.Decide, creds); err != nil || head == nil || head.LastModified != "" {
		m.Reseed(metrics.ReseedSkipped)
		return false // someone wrote meanwhile (or it went away again)
	}
	body, err := k.Body()
	if err != nil {
		m.Reseed(metrics.ReseedFailed)
		return false
	}
	digest := k.Digest
	if digest == "" {
		digest = "confshim-reseed"
	}
	ans, err := api.PutConfig(ctx, creds, body, digest) // on the decide connection, as it is
	if err != nil || ans.Status != http.StatusAccepted {
		tx.Doubt() // whatever it holds now is read again
	}
	if err != nil {
		m.Reseed(metrics.ReseedFailed)
		w.cfg.Host.NoteReseed(string(metrics.ReseedFailed), 0, w.cfg.Now().Sub(foundEmpty))
		w.cfg.Log.Warn().Str("event", "reseed").Str("result", "failed").Str("error", apisix.SafeError(err)).Msg("re-seeding the data plane failed; retrying at the next check")
		tx.AskRefresh() // look again at the next tick
		return false
	}
	took := w.cfg.Now().Sub(foundEmpty)
	if ans.Status != http.StatusAccepted {
		m.Reseed(metrics.ReseedFailed)
		w.cfg.Host.NoteReseed(string(metrics.ReseedFailed), ans.Status, took)
		w.cfg.Log.Warn().Str("event", "reseed").Str("result", "failed").Int("status", ans.Status).Str("answer", clipAnswer(ans.Body)).Msg("the data plane refused the kept configuration")
		return false
	}
	m.Reseed(metrics.ReseedRestored)
	m.ReseedDuration.Observe(took.Seconds())
	w.cfg.Host.NoteReseed(string(metrics.ReseedRestored), ans.Status, took)
	versions := zerolog.Dict()
	for i, s := range slices.Sorted(maps.Keys(k.Versions)) {
		if i == maxLoggedSections {
			break
		}
		versions = versions.Float64(rewrite.Clip(s), k.Versions[s])
	}
	w.cfg.Log.Info().Str("event", "reseed").Str("result", "restored").Dict("versions", versions).
		Dur("after", took).Msg("the data plane had lost its configuration; restored the kept one")
	// the record still holds: the data plane has the same versions and content again
	tx.Reseeded(k, ans.Header.Get("X-Digest"), ans.Header.Get("X-Last-Modified"), api.DecideConn())
	return true
}

// clipAnswer bounds an APISIX answer quoted in a log line.
func clipAnswer(msg []byte) string {
	msg = bytes.TrimSpace(msg)
	if len(msg) > 256 {
		return string(msg[:256]) + "…"
	}
	return string(msg)
}
