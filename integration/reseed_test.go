package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/wait"
	"github.com/confshim/confshim/proxy"
)

// The §8.4 stories: a data plane that restarted empty is re-seeded by confshim, with no
// client involved.

const watch = 100 * time.Millisecond // the tests' --reseed-interval

// watchSafety is the safety interval of the tests that wait for the watch to look at
// an out-of-band write: the watch paces its looks by what the last one took, and on a
// loaded machine one slow look would put the next a minute (the default) away.
const watchSafety = 500 * time.Millisecond

// waitRestored polls until the data plane holds routes again and returns how long it took.
func waitRestored(t *testing.T, s *stack) time.Duration {
	t.Helper()
	defer logOnFailure(t, s)
	start := time.Now()
	wait.For(t, "the data plane to be re-seeded", func() bool { return s.em.Document() != nil && s.em.Document()["routes"] != nil })
	return time.Since(start)
}

// waitLog waits until the log holds n lines with event.
func waitLog(t *testing.T, s *stack, event string, n int) {
	t.Helper()
	defer logOnFailure(t, s)
	wait.For(t, fmt.Sprintf("%d %s lines", n, event), func() bool { return strings.Count(s.logs.String(), `"event":"`+event+`"`) >= n })
}

// logOnFailure, deferred, shows confshim's log when the test failed (t.Fatal runs it).
func logOnFailure(t *testing.T, s *stack) {
	if t.Failed() {
		t.Logf("confshim's log:\n%s", s.logs.String())
	}
}

// restartDowntime is how long a restarted data plane's port stays closed in these tests
// (a real container: about 1–2 s).
const restartDowntime = 150 * time.Millisecond

// watchTicks waits until the watch pinged the data plane n more times: it had its
// chances to act (a test of something that must not happen waits for them, not for a
// fixed time).
func watchTicks(t *testing.T, s *stack, n int) {
	t.Helper()
	from := s.em.Costs().Pings
	wait.For(t, fmt.Sprintf("%d pings of the watch", n), func() bool { return s.em.Costs().Pings >= from+n })
}

func TestReseedAfterDataPlaneRestart(t *testing.T) {
	s := newStack(t, stackOptions{reseed: watch, safety: watchSafety})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	registerSecrets(t, s) // straight to the data plane: the watcher reads it back once
	waitLog(t, s, "kept_refreshed", 1)
	before := s.em.Document()
	s.restartDataPlane(t, restartDowntime)
	took := waitRestored(t, s)
	t.Logf("re-seeded %v after the restart (watch every %v)", took, watch)
	if took > 2*time.Second {
		t.Fatalf("re-seeded after %v, want within 2 s", took)
	}
	after := s.em.Document()
	for _, k := range []string{"routes", "secrets", "routes_conf_version", "secrets_conf_version", "upstreams_conf_version", "consumers"} {
		if b, a := jsonOf(before[k]), jsonOf(after[k]); a != b {
			t.Fatalf("%s: before the restart %s, after the re-seed %s", k, b, a)
		}
	}
	// the data plane holds the configuration as soon as it answered the re-seed PUT;
	// confshim counts and logs it just after
	waitLog(t, s, "reseed", 1)
	if got := counter(s.metrics.Reseeds.WithLabelValues("restored")); got != 1 {
		t.Fatalf("reseeds_total{restored} = %v", got)
	}
	if strings.Contains(s.logs.String(), "example-vault-token") {
		t.Fatal("the re-seed log line carries items")
	}
	// the client's next sync, from its unchanged cache, lands with nothing lost
	res := sync1(t, c, config("v2"))
	mustLand(t, res)
	mustContain(t, s.items(t, "secrets"), "vault/1")
	if got, want := s.items(t, "routes"), routesOf("v2"); got != want {
		t.Fatalf("routes %s, want %s", got, want)
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestReseedAfterConfshimRestartWithStateDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newStack(t, stackOptions{reseed: watch, safety: watchSafety, stateDir: dir, adminKey: adminKey})
	mustLand(t, sync1(t, s.client(true), config("v1")))
	registerSecrets(t, s)
	waitLog(t, s, "kept_refreshed", 1)
	file := filepath.Join(dir, "confshim-state.json")
	waitFile(t, file, "example-vault-token") // the operator's secrets
	if info, err := os.Stat(file); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", info, err)
	}
	s.startProxy(t) // confshim restarts: its memory is gone, the file is not
	s.restartDataPlane(t, restartDowntime)
	took := waitRestored(t, s)
	t.Logf("re-seeded from --state-dir %v after the restart", took)
	mustContain(t, s.items(t, "secrets"), "vault/1")
	if got, want := s.items(t, "routes"), routesOf("v1"); got != want {
		t.Fatalf("routes %s, want %s", got, want)
	}
}

func TestNoReseedWithoutStateDirAfterConfshimRestart(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{reseed: watch, adminKey: adminKey})
	mustLand(t, sync1(t, s.client(true), config("v1")))
	s.startProxy(t) // memory only: nothing kept after a restart
	s.restartDataPlane(t, restartDowntime)
	watchTicks(t, s, 3)
	if s.em.Document() != nil {
		t.Fatal("re-seeded from nothing")
	}
}

func TestReseedLeavesAnotherConfigurationAlone(t *testing.T) {
	t.Parallel()
	var hold sync.RWMutex // held: the watcher's HEADs wait
	s := newStack(t, stackOptions{reseed: watch, wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodHead {
				hold.RLock() // the watcher's HEADs wait while the test holds the lock
				defer hold.RUnlock()
			}
			next.ServeHTTP(w, r)
		})
	}})
	mustLand(t, sync1(t, s.client(true), config("v1")))
	// the data plane comes back with someone else's configuration before the watcher looks
	hold.Lock()
	s.restartDataPlane(t, restartDowntime)
	other := `{"routes_conf_version":1,"routes":[{"id":"theirs","uri":"/theirs"}]}`
	if status, _ := rawPut(t, s.dpURL, other, "theirs"); status != http.StatusAccepted {
		t.Fatalf("the other writer: %d", status)
	}
	hold.Unlock()
	waitLog(t, s, "kept_refreshed", 1) // the watcher saw it, and keeps it from now on
	mustContain(t, s.items(t, "routes"), "/theirs")
	if got := counter(s.metrics.Reseeds.WithLabelValues("restored")); got != 0 {
		t.Fatalf("overwrote a data plane that held a configuration (%v re-seeds)", got)
	}
}

func TestReseedRetriesWhenTheDataPlaneFailsMidway(t *testing.T) {
	t.Parallel()
	var dropOne atomic.Bool
	s := newStack(t, stackOptions{reseed: watch, wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut && dropOne.CompareAndSwap(true, false) {
				conn, _, _ := http.NewResponseController(w).Hijack()
				conn.(*net.TCPConn).SetLinger(0)
				conn.Close() // restarted again mid-re-seed
				return
			}
			next.ServeHTTP(w, r)
		})
	}})
	mustLand(t, sync1(t, s.client(true), config("v1")))
	dropOne.Store(true)
	s.restartDataPlane(t, restartDowntime)
	waitRestored(t, s)
	if failed := counter(s.metrics.Reseeds.WithLabelValues("failed")); failed != 1 {
		t.Fatalf("reseeds_total{failed} = %v, want 1", failed)
	}
	if got, want := s.items(t, "routes"), routesOf("v1"); got != want {
		t.Fatalf("routes %s, want %s", got, want)
	}
}

func TestClientSyncDuringReseed(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var slowed atomic.Bool
	s := newStack(t, stackOptions{reseed: watch, wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut && slowed.CompareAndSwap(true, false) {
				<-release // the re-seed PUT is in flight
			}
			next.ServeHTTP(w, r)
		})
	}})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	slowed.Store(true)
	s.restartDataPlane(t, restartDowntime)
	wait.For(t, "the re-seed PUT to be in flight", func() bool { return !slowed.Load() })
	probes := s.em.Costs().Validates
	done := make(chan int, 1)
	go func() { done <- sync1(t, c, config("v2")).Status }()
	// the client's sync was probed: it goes on to wait for the PUT lock the re-seed holds
	wait.For(t, "the client's sync to be probed", func() bool { return s.em.Costs().Validates > probes })
	close(release)
	if status := <-done; status/100 != 2 {
		t.Fatalf("the client's sync during the re-seed: %d", status)
	}
	if got, want := s.items(t, "routes"), routesOf("v2"); got != want {
		t.Fatalf("routes %s, want the client's %s", got, want)
	}
}

func TestReseedOffOnAPISIX313(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{reseed: watch, version: "3.13.0"})
	mustLand(t, sync1(t, s.client(true), config("v1")))
	// the watch says so and stops: no more pings after it
	wait.For(t, "re-seeding declared off", func() bool { return strings.Contains(s.logs.String(), `"event":"reseed_off"`) })
	if n := strings.Count(s.logs.String(), `"event":"reseed_off"`); n != 1 {
		t.Fatalf("want re-seeding declared off once, said %d times", n)
	}
}

func TestCorruptStateFileIsIgnored(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "confshim-state.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newStack(t, stackOptions{reseed: watch, stateDir: dir})
	mustContain(t, s.logs.String(), "cannot be read; ignored")
	mustLand(t, sync1(t, s.client(true), config("v1")))
}

// Issue 36: a sync that finds the data plane empty while its re-seed fails is not
// decided on the empty state (the preserved secrets would go out empty, and the kept
// configuration with them): 503 with Retry-After, nothing forwarded, and the operator's
// secret comes back with the next attempt.
func TestSyncOnAnEmptyDataPlaneWhoseReseedFailsForwardsNothing(t *testing.T) {
	t.Parallel()
	var refuseOne atomic.Bool
	s := newStack(t, stackOptions{reseed: time.Hour, adminKey: adminKey, wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut && refuseOne.CompareAndSwap(true, false) {
				w.WriteHeader(http.StatusInternalServerError) // the re-seed PUT fails
				return
			}
			next.ServeHTTP(w, r)
		})
	}})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	s.writeSecret(t, "op")
	mustLand(t, sync1(t, c, config("v2"))) // confshim sees the secret pass
	refuseOne.Store(true)
	s.restartDataPlane(t, restartDowntime)
	puts := s.em.Puts()
	res := sync1(t, c, config("v3"))
	if res.Status != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" {
		t.Fatalf("a sync whose re-seed failed: %d %s (Retry-After %q), want 503 with Retry-After", res.Status, res.Body, res.Header.Get("Retry-After"))
	}
	if got := s.em.Puts(); got != puts {
		t.Fatalf("%d PUTs reached the data plane, want none (the failed re-seed is answered by the wrap)", got-puts)
	}
	mustLand(t, sync1(t, c, config("v3"))) // the client's retry: re-seeded first, then decided
	mustContain(t, jsonOf(s.doc(t)["secrets"]), `"token":"op"`)
	if got, want := s.items(t, "routes"), routesOf("v3"); got != want {
		t.Fatalf("routes %s, want %s", got, want)
	}
}

// Issue 36: a PUT caught by a data-plane restart (the container went down with the PUT
// in its socket) gets the answer of the APISIX that came back, not a 502: confshim
// waits for it, re-seeds it and decides the sync again.
func TestPutCaughtByARestartIsAnsweredByTheReturnedDataPlane(t *testing.T) {
	t.Parallel()
	var cut atomic.Bool
	var s *stack
	s = newStack(t, stackOptions{reseed: watch, adminKey: adminKey, wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut && cut.CompareAndSwap(true, false) {
				s.restartDataPlane(t, time.Second) // a container takes a second or two
				return
			}
			next.ServeHTTP(w, r)
		})
	}})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	s.writeSecret(t, "op")
	mustLand(t, sync1(t, c, config("v2")))
	cut.Store(true)
	res := sync1(t, c, config("v3"))
	mustLand(t, res)
	if got, want := s.items(t, "routes"), routesOf("v3"); got != want {
		t.Fatalf("routes %s, want %s", got, want)
	}
	mustContain(t, jsonOf(s.doc(t)["secrets"]), `"token":"op"`)
}

// Issue 36: a re-seed never restores an older copy of an item than one confshim saw:
// the operator rotates the secret, the client's next sync reads the data plane (it
// sees the new token) but APISIX rejects that sync (a route it cannot load, no
// fallback), and the data plane restarts. The kept configuration follows the read,
// so the re-seed brings the new token back, not the one of the last accepted sync.
func TestReseedRestoresWhatTheLastReadSaw(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{reseed: watch, adminKey: adminKey, trust: proxy.TrustNever})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	s.writeSecret(t, "token-9")
	mustLand(t, sync1(t, c, config("v2"))) // kept: token-9
	watchTicks(t, s, 3)
	s.writeSecret(t, "token-11")
	bad := config("v3")
	bad["routes"] = append(bad["routes"], route("r-bad", "/bad", unknownPlugin))
	if res := sync1(t, c, bad); res.Status != http.StatusBadRequest {
		t.Fatalf("the sync with a route APISIX cannot load: %d, want its 400", res.Status)
	}
	s.restartDataPlane(t, restartDowntime)
	waitRestored(t, s)
	mustContain(t, jsonOf(s.doc(t)["secrets"]), `"token":"token-11"`)
}
