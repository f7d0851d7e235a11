package reseed

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

const key = "watch-test-key"

// fakeClock is the watch's clock in these tests: it moves only when the test ticks or
// the data plane decodes, so what the watch decides does not depend on the machine.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// host reads the state as the PUT path does and records what the watch tells it.
type host struct {
	api     *apisix.Client
	mu      sync.Mutex
	moves   []dataplane.Move
	reseeds []string
}

func (h *host) ReadState(ctx context.Context, creds apisix.Credentials) (*rewrite.State, string, string, error) {
	body, meta, err := h.api.Get(ctx, apisix.Decide, creds, 1<<24)
	if err != nil {
		return nil, "", "", err
	}
	st, err := rewrite.ParseState(body)
	return st, meta.Digest, meta.LastModified, err
}

func (h *host) NoteMoves(moves []dataplane.Move, _ string) {
	h.mu.Lock()
	h.moves = append(h.moves, moves...)
	h.mu.Unlock()
}

func (h *host) NoteReseed(result string, _ int, _ time.Duration) {
	h.mu.Lock()
	h.reseeds = append(h.reseeds, result)
	h.mu.Unlock()
}

// driven is a watcher in front of an emulated data plane, driven tick by tick.
type driven struct {
	srv    *apisixtest.Server
	api    *apisix.Client
	clock  *fakeClock
	ticks  chan time.Time
	done   chan struct{}
	host   *host
	belief *dataplane.Belief
	m      *metrics.Metrics
	looks  *lookLog
}

// lookLog is every look (configs HEAD) the data plane answered: when it came by the
// watch's clock, and what it cost.
type lookLog struct {
	mu    sync.Mutex
	looks []look
	slow  time.Duration // added to the next look's cost, once (an APISIX still loading)
}

type look struct {
	at   time.Time
	cost time.Duration
}

func (l *lookLog) add(at time.Time, cost time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	cost, l.slow = cost+l.slow, 0
	l.looks = append(l.looks, look{at, cost})
	return cost
}

// since are the looks from at on.
func (l *lookLog) since(at time.Time) []look {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []look
	for _, lk := range l.looks {
		if !lk.at.Before(at) {
			out = append(out, lk)
		}
	}
	return out
}

// slowNext makes the next look take d more (an APISIX still loading after a restart).
func (l *lookLog) slowNext(d time.Duration) {
	l.mu.Lock()
	l.slow = d
	l.mu.Unlock()
}

// each is a look cost that does not depend on what is stored.
func each(d time.Duration) func(int) time.Duration { return func(int) time.Duration { return d } }

// perMB is a real APISIX's look: a decode of the stored document at 25 ms per MB
// (spec §11).
func perMB(stored int) time.Duration { return sizeCost(stored) }

// drive starts a watcher whose clock moves interval per tick and, per look (a HEAD of
// the configuration, which costs APISIX a decode), what lookCost says for the bytes
// the data plane stores; marks, when set, are on every answer (an intermediary's).
func drive(t *testing.T, interval, safety time.Duration, lookCost func(stored int) time.Duration, marks ...string) *driven {
	t.Helper()
	clock := &fakeClock{now: time.Unix(1_800_000_000, 0)}
	looks := &lookLog{}
	var srv *apisixtest.Server
	srv = apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{AdminKey: key}, Wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for i := 0; i+1 < len(marks); i += 2 {
				w.Header().Set(marks[i], marks[i+1])
			}
			if r.Method == http.MethodHead && r.URL.Path == apisix.ConfigsPath {
				clock.advance(looks.add(clock.Now(), lookCost(srv.Emulator.StoredBytes())))
			}
			next.ServeHTTP(w, r)
		})
	}})
	srv.Emulator.SetDecodeCost(-1) // the fake clock charges the decode, not the wall clock
	u, _ := url.Parse(srv.URL)
	api, err := apisix.New(apisix.Config{Upstream: u, Timeout: time.Minute, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := dataplane.New(dataplane.Options{Keep: true})
	d := &driven{srv: srv, api: api, clock: clock, ticks: make(chan time.Time), done: make(chan struct{}), host: &host{api: api}, belief: b,
		m: metrics.New(prometheus.NewRegistry(), "test"), looks: looks}
	w := New(Config{Interval: interval, SafetyInterval: safety, AdminKey: key, API: api, Belief: b, Metrics: d.m,
		Log: zerolog.Nop(), Host: d.host, Ticks: d.ticks, Now: clock.Now, TickDone: func() { d.done <- struct{}{} }})
	ctx, cancel := context.WithCancel(context.Background())
	w.Start(ctx)
	t.Cleanup(func() {
		cancel()
		go func() { // a tick handled after the test stopped waiting
			for range d.done {
			}
		}()
		w.Wait()
		close(d.done)
	})
	return d
}

// tick moves the clock one interval, hands the watch a tick and waits until it has
// handled it, n times: the clock never moves while the watch looks at it.
func (d *driven) tick(interval time.Duration, n int) {
	for range n {
		d.clock.advance(interval)
		d.ticks <- d.clock.Now()
		<-d.done
	}
}

func (d *driven) store(t *testing.T, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, d.srv.URL+apisix.ConfigsPath, strings.NewReader(body))
	req.Header.Set("X-API-KEY", key)
	req.Header.Set("X-Digest", body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("store: %d", resp.StatusCode)
	}
}

// TestWatchLooksFollowTheirCost: over 1.5 s of idle by the watch's clock, it looks at
// the configuration as often as its cost allows (lookInterval), never more often than
// each tick and at least once per safety interval, and pings at every tick.
func TestWatchLooksFollowTheirCost(t *testing.T) {
	t.Parallel()
	const interval, idleTicks = 10 * time.Millisecond, 150
	for _, tc := range []struct {
		name               string
		lookCost, safety   time.Duration
		minLooks, maxLooks int
	}{
		{"cheap: every tick", 0, time.Hour, idleTicks, idleTicks},
		{"costly: 2 ms a decode, one look per 0.5 s", 2 * time.Millisecond, time.Hour, 2, 3},
		{"huge: bounded by the 500 ms safety interval", 100 * time.Millisecond, 500 * time.Millisecond, 2, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := drive(t, interval, tc.safety, each(tc.lookCost))
			d.store(t, `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"}]}`)
			d.tick(interval, 2) // the first tick looks (nothing is known at start)
			before := d.srv.Emulator.Costs()
			d.tick(interval, idleTicks)
			after := d.srv.Emulator.Costs()
			looks, pings := after.DecodesHEAD-before.DecodesHEAD, after.Pings-before.Pings
			if looks < tc.minLooks || looks > tc.maxLooks {
				t.Fatalf("%d looks in %d ticks, want %d to %d", looks, idleTicks, tc.minLooks, tc.maxLooks)
			}
			if pings != idleTicks {
				t.Fatalf("%d pings in %d ticks", pings, idleTicks)
			}
			if spent := time.Duration(looks) * tc.lookCost; tc.safety == time.Hour && spent > time.Duration(0.005*float64(idleTicks*interval))+tc.lookCost {
				t.Fatalf("the looks cost %v of %v: over 0.5 %% (and one look)", spent, idleTicks*interval)
			}
		})
	}
}

// TestWatchReseedsAnEmptyDataPlane: the watch finds the data plane empty after a
// restart (its ping had to open a new connection) and PUTs the kept configuration back.
func TestWatchReseedsAnEmptyDataPlane(t *testing.T) {
	t.Parallel()
	d := drive(t, 10*time.Millisecond, time.Hour, each(0))
	d.store(t, `{"routes_conf_version":3,"routes":[{"id":"r1","uri":"/a"}],"secrets_conf_version":2,"secrets":[{"id":"vault/1","uri":"http://v","prefix":"kv","token":"t"}]}`)
	d.tick(10*time.Millisecond, 2) // looks, reads the configuration back (kept)
	if k := d.belief.Snapshot().Kept; k == nil || k.Versions["secrets"] != 2 {
		t.Fatalf("kept after the first look: %+v", k)
	}
	d.srv.Restart(t, 0)
	d.tick(10*time.Millisecond, 3)
	doc := d.srv.Emulator.Document()
	if doc == nil || doc["secrets_conf_version"] != float64(2) {
		t.Fatalf("after the restart the data plane holds %v", doc)
	}
	if got := d.host.reseeds; len(got) != 1 || got[0] != string(metrics.ReseedRestored) {
		t.Fatalf("re-seeds: %v", got)
	}
}

// TestWatchLearnsAnOutOfBandWrite: a write behind confshim is read back at the next
// look and reported as moves of the sections it changed.
func TestWatchLearnsAnOutOfBandWrite(t *testing.T) {
	t.Parallel()
	d := drive(t, 10*time.Millisecond, time.Hour, each(0))
	d.store(t, `{"routes_conf_version":3,"routes":[{"id":"r1","uri":"/a"}]}`)
	d.tick(10*time.Millisecond, 2)
	d.store(t, `{"routes_conf_version":3,"secrets_conf_version":5,"secrets":[{"id":"vault/1","uri":"http://v","prefix":"kv","token":"t"}]}`)
	d.tick(10*time.Millisecond, 2)
	d.host.mu.Lock()
	defer d.host.mu.Unlock()
	for _, m := range d.host.moves {
		if m.Section == "secrets" && m.From == 1 && m.To == 5 {
			return
		}
	}
	t.Fatalf("moves %+v: want secrets 1 -> 5 (absent sections move by one too)", d.host.moves)
}
