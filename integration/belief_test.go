package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/wait"
	"github.com/confshim/confshim/proxy"
)

// Issue 18: what confshim believes about the data plane is true, fresh and cheap. Each
// test below is one way an earlier confshim acted on a belief that was no longer so.

// TestReusedDigestIsNotProof: APISIX answers 204 to a digest it already holds, whatever
// the body. An edit re-sent with the old digest is not applied (straight to APISIX
// neither); the same edit with a fresh digest must then be applied, not settled.
func TestReusedDigestIsNotProof(t *testing.T) {
	t.Parallel()
	// decided on a read: a sync decided unread stamps the changed section with the clock,
	// so that the edit would get a digest of its own anyway
	s := newStack(t, stackOptions{trust: proxy.TrustNever})
	// the README's operator: a secrets manager straight on the data plane, so that
	// confshim rewrites (secrets preserved) and the forwarded digest gets its suffix
	adminPut(t, s.dpURL, `{"secrets_conf_version":1,"secrets":[{"id":"vault/1","uri":"http://vault:8200","prefix":"kv","token":"t"}]}`, "oob")
	// versions above the data plane's: forwarded as they are, only secrets is rewritten,
	// so both PUTs below carry the same decisions and the same forwarded digest
	first := `{"routes_conf_version":5,"routes":[{"id":"r1","uris":["/get"]}],"secrets_conf_version":0}`
	if status, _ := rawPut(t, s.proxyURL, first, "sync-1"); status != http.StatusAccepted {
		t.Fatalf("first sync: %d", status)
	}
	edit := `{"routes_conf_version":6,"routes":[{"id":"r1","uris":["/edited"]}],"secrets_conf_version":0}`
	if status, _ := rawPut(t, s.proxyURL, edit, "sync-1"); status != http.StatusNoContent {
		t.Fatalf("the edit with the old digest: %d, want APISIX's 204", status)
	}
	if status, _ := rawPut(t, s.proxyURL, edit, "sync-2"); status != http.StatusAccepted {
		t.Fatalf("the edit with a fresh digest: %d, want 202", status)
	}
	mustContain(t, s.items(t, "routes"), "/edited")
}

// restartOn wraps the data plane: while armed, the first request matching hit restarts
// it the way a container does — after answering (between confshim's state read and its
// PUT), or instead of answering (during the PUT).
type restartOn struct {
	armed  atomic.Bool
	s      *stack
	t      *testing.T
	before bool // restart instead of answering
	hit    func(*http.Request) bool
	done   chan struct{} // closed when the data plane answers again
}

func (ro *restartOn) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ro.hit(r) || !ro.armed.CompareAndSwap(true, false) {
			next.ServeHTTP(w, r)
			return
		}
		if !ro.before {
			next.ServeHTTP(w, r)
			http.NewResponseController(w).Flush()
		}
		ro.s.restartDataPlane(ro.t, restartDowntime)
		close(ro.done)
	})
}

// TestRestartInsideASync: the data plane restarts empty between what confshim last
// confirmed and its PUT — after its state read, or after the sync's probe (no state is
// read when confshim trusts its belief: the restart falls between the watch's last
// ping, or the last sync, and the PUT) — or while the PUT is on its way. A thin PUT
// must never reach the restarted data plane (it would store the unchanged sections
// empty at their old versions, and every later sync would be answered 204 against the
// wrong record): the connection it must travel on closed with the restart.
func TestRestartInsideASync(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		before  bool
		restart bool // confshim restarts first: the sync reads the state
		hit     func(*http.Request) bool
	}{
		{"between the state read and the PUT", false, true, func(r *http.Request) bool {
			return r.Method == http.MethodGet && r.URL.Path == "/apisix/admin/configs"
		}},
		{"between the last confirmation and the PUT", false, false, func(r *http.Request) bool {
			return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength <= 2
		}},
		{"during the PUT", true, false, func(r *http.Request) bool { return r.Method == http.MethodPut }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ro := &restartOn{t: t, before: tc.before, hit: tc.hit, done: make(chan struct{})}
			o := stackOptions{reseed: time.Hour, wrap: ro.wrap} // the watch stays out of it
			if tc.restart {
				o.stateDir = t.TempDir() // the restarted confshim still has the kept configuration
			}
			s := newStack(t, o)
			ro.s = s
			c := s.client(true)
			mustLand(t, sync1(t, c, config("v1")))
			registerSecrets(t, s)
			mustLand(t, sync1(t, c, config("v1"))) // the kept configuration now has the secrets
			if tc.restart {
				s.startProxy(t)
				c = adoptedClient(s, c)
			}
			ro.armed.Store(true)
			// unchanged: every section would be thin. confshim decides again on a fresh
			// read; while the port is still closed that read fails and nothing is sent
			// (502), otherwise the sync lands. Either way no thin PUT reached the
			// restarted data plane, which the next sync would then find holding empty
			// sections at the old versions.
			res := sync1(t, c, config("v1"))
			if ro.armed.Load() {
				t.Fatal("the restart never happened")
			}
			<-ro.done
			if res.Status/100 == 2 {
				mustContain(t, s.logs.String(), `"event":"redial"`) // decided again, on a fresh read
			} else {
				mustContain(t, string(res.Body), "nothing was forwarded")
				mustLand(t, sync1(t, c, config("v1")))
			}
			for _, section := range []string{"routes", "services", "upstreams", "consumers"} {
				if got, want := s.items(t, section), wantItems(config("v1"), section); got != want {
					t.Fatalf("%s after a restart inside the sync: %s, want %s", section, got, want)
				}
			}
			mustContain(t, s.items(t, "secrets"), "vault/1")
			// and the next syncs land on a data plane that holds what the record says
			mustLand(t, sync1(t, c, config("v2")))
			if got, want := s.items(t, "routes"), routesOf("v2"); got != want {
				t.Fatalf("routes %s, want %s", got, want)
			}
		})
	}
}

// TestFirstSyncAfterRestartRestoresPreserved: the client's first sync after a
// data-plane restart beats the watch; the out-of-band secrets are restored with it,
// and kept for the next restart.
func TestFirstSyncAfterRestartRestoresPreserved(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{reseed: time.Hour}) // the watch never looks
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	registerSecrets(t, s)
	mustLand(t, sync1(t, c, config("v2"))) // reads the data plane again: the secrets are kept
	s.restartDataPlane(t, restartDowntime)
	mustLand(t, sync1(t, c, config("v3")))
	mustContain(t, s.items(t, "secrets"), "example-vault-token")
	if got, want := s.items(t, "routes"), routesOf("v3"); got != want {
		t.Fatalf("routes %s, want %s", got, want)
	}
	s.restartDataPlane(t, restartDowntime)
	mustLand(t, sync1(t, c, config("v3")))
	mustContain(t, s.items(t, "secrets"), "example-vault-token")
}

// TestOldCopyNeverRestoredOverANewerOne: a version number is not content identity.
// The state file keeps secrets at version 1 with an old token; after restarts of both,
// the operator registers a new token, again at version 1. The old one must never come
// back.
func TestOldCopyNeverRestoredOverANewerOne(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newStack(t, stackOptions{reseed: time.Hour, stateDir: dir, adminKey: adminKey})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	setToken := func(token string) {
		s.oobPut(t, func(doc map[string]any) {
			doc["secrets_conf_version"] = float64(1)
			doc["secrets"] = []any{map[string]any{"id": "vault/1", "uri": "http://vault:8200", "prefix": "kv", "token": token}}
		})
	}
	setToken("old-token")
	mustLand(t, sync1(t, c, config("v1")))
	waitFile(t, filepath.Join(dir, "confshim-state.json"), "old-token")

	s.startProxy(t) // confshim restarts from the file
	s.restartDataPlane(t, restartDowntime)
	// the operator's tooling registers the new token on the empty data plane: version 1 again
	adminPut(t, s.dpURL, `{"secrets_conf_version":1,"secrets":[{"id":"vault/1","uri":"http://vault:8200","prefix":"kv","token":"new-token"}]}`, "oob-new")
	c = s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	s.restartDataPlane(t, restartDowntime)
	mustLand(t, sync1(t, c, config("v2"))) // restores the kept configuration first
	secrets := s.items(t, "secrets")
	if strings.Contains(secrets, "old-token") || !strings.Contains(secrets, "new-token") {
		t.Fatalf("secrets after the restarts: %s, want the new token", secrets)
	}
}

func waitFile(t *testing.T, file, want string) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%s to hold %q", file, want), func() bool {
		data, _ := os.ReadFile(file)
		return strings.Contains(string(data), want)
	})
}

// TestSyncCostsNoMoreDecodesThanStraight (issue 27): per ADC-shaped sync — identical,
// one route changed, reordered upstreams — confshim makes APISIX decode its stored
// document no more often than the same client straight to APISIX: exactly once (the
// PUT), since the sync is decided on confshim's belief and APISIX's version check
// proves it. An out-of-band write in between costs the refresh (the refused PUT, a
// GET) and is still repaired in the same sync.
func TestSyncCostsNoMoreDecodesThanStraight(t *testing.T) {
	t.Parallel()
	reordered := func(variant string) adcclient.Config {
		cfg := config(variant)
		cfg["upstreams"] = append(cfg["upstreams"], map[string]any{"id": "svc2", "type": "roundrobin", "nodes": []any{map[string]any{"host": "10.244.0.12", "port": 80, "weight": 100}}})
		return cfg
	}
	flipped := func(variant string) adcclient.Config {
		cfg := reordered(variant)
		cfg["upstreams"][0], cfg["upstreams"][1] = cfg["upstreams"][1], cfg["upstreams"][0]
		return cfg
	}
	for _, tc := range []struct {
		name       string
		first, cfg adcclient.Config
		oob        bool
		maxThrough int
	}{
		{"identical", config("v1"), config("v1"), false, 1},
		{"one-route", config("v1"), config("v2"), false, 1},
		{"reordered", reordered("v1"), flipped("v1"), false, 1},
		{"out-of-band write in between", config("v1"), config("v2"), true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var costs [2]int
			for i, through := range []bool{false, true} {
				s := newStack(t, stackOptions{reseed: time.Hour})
				c := s.client(through)
				mustLand(t, sync1(t, c, tc.first))
				mustLand(t, sync1(t, c, tc.first)) // warm: the state confshim keeps
				if tc.oob {
					registerSecrets(t, s)
				}
				before, reloads := s.em.Costs().Decodes(), s.em.Reloads()
				res := sync1(t, c, tc.cfg)
				if through || !tc.oob { // straight, the stale secrets version is refused: the deadlock
					mustLand(t, res)
				}
				costs[i] = s.em.Costs().Decodes() - before
				if through && tc.name == "reordered" {
					if got := s.em.Reloads(); got["upstreams"] != reloads["upstreams"] {
						t.Fatalf("a reordered upstreams section reloaded (%v → %v)", reloads, got)
					}
				}
				if through && tc.oob {
					mustContain(t, s.items(t, "secrets"), "vault/1") // preserved in the same sync
					mustContain(t, s.items(t, "routes"), "/v2")
				}
			}
			t.Logf("%s: straight %d decodes, through confshim %d", tc.name, costs[0], costs[1])
			if costs[1] > tc.maxThrough || (!tc.oob && costs[1] > costs[0]) {
				t.Fatalf("%s: %d decodes through confshim, %d straight (at most %d allowed)", tc.name, costs[1], costs[0], tc.maxThrough)
			}
		})
	}
}
