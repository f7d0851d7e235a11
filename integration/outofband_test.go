package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/wait"
)

// Contract §7: the out-of-band writes confshim learns are counted per section, logged
// once and listed in /debug/config — an operator sees the gateway being edited by hand.

// TestOutOfBandWriteBetweenSyncsIsCountedOnce: a secrets manager registered straight on
// the data plane between two syncs is repaired in the next sync (preserved), counted
// once, logged once and shown; later syncs count nothing more.
func TestOutOfBandWriteBetweenSyncsIsCountedOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	mustLand(t, sync1(t, c, config("v1")))
	if got := counter(s.metrics.OutOfBandWrites.WithLabelValues("secrets")); got != 0 {
		t.Fatalf("out_of_band_writes_total{secrets} = %v before any", got)
	}
	registerSecrets(t, s)
	res := sync1(t, c, config("v2"))
	mustLand(t, res)
	mustContain(t, s.items(t, "secrets"), "vault/1") // repaired in the same sync: preserved
	mustContain(t, s.items(t, "routes"), "/v2")
	for i := 0; i < 3; i++ {
		mustLand(t, sync1(t, c, config("v2")))
	}
	if got := counter(s.metrics.OutOfBandWrites.WithLabelValues("secrets")); got != 1 {
		t.Fatalf("out_of_band_writes_total{secrets} = %v, want 1", got)
	}
	if got := counter(s.metrics.OutOfBandWrites.WithLabelValues("routes")); got != 0 {
		t.Fatalf("out_of_band_writes_total{routes} = %v: confshim's own writes are not out of band", got)
	}
	if n := strings.Count(s.logs.String(), `"event":"out_of_band_write"`); n != 1 {
		t.Fatalf("%d out_of_band_write log lines, want 1", n)
	}
	oob := s.proxy.DebugConfig().OutOfBand
	// learnt by APISIX's own version check: the sync was decided on confshim's belief
	// (no read), refused, and decided again on a fresh read — in the same client sync
	if len(oob) != 1 || oob[0].How != "version_conflict" || len(oob[0].Sections) != 1 || oob[0].Sections[0].Section != "secrets" ||
		oob[0].Sections[0].To != oob[0].Sections[0].From+1 {
		t.Fatalf("/debug/config out_of_band_writes: %+v", oob)
	}
	if strings.Contains(s.logs.String(), "example-vault-token") {
		t.Fatal("a value of the out-of-band write reached the log")
	}
}

// TestOutOfBandWriteLearntByTheWatch: with no sync at all, the watch's next look finds
// the write on a small configuration (its looks are cheap, so they follow
// --reseed-interval, 1 s, not the minute; counted in looks, not seconds); the next sync
// does not count it again. Not parallel: the watch paces its looks by what the last one
// took, and a look slowed by the other tests would put the next a minute away.
func TestOutOfBandWriteLearntByTheWatch(t *testing.T) {
	s := newStack(t, stackOptions{reseed: time.Second}) // the defaults: 1 s, a minute at most
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	looks := s.em.Costs().DecodesHEAD
	wait.For(t, "the watch's first look after the sync", func() bool { return s.em.Costs().DecodesHEAD > looks })
	registerSecrets(t, s)
	looks = s.em.Costs().DecodesHEAD
	wait.For(t, "the watch to learn the out-of-band write", func() bool {
		return counter(s.metrics.OutOfBandWrites.WithLabelValues("secrets")) > 0
	})
	if n := s.em.Costs().DecodesHEAD - looks; n > 2 {
		t.Fatalf("the watch learnt the out-of-band write after %d looks, want at its next one", n)
	}
	mustLand(t, sync1(t, c, config("v2")))
	if got := counter(s.metrics.OutOfBandWrites.WithLabelValues("secrets")); got != 1 {
		t.Fatalf("out_of_band_writes_total{secrets} = %v, want 1", got)
	}
	if oob := s.proxy.DebugConfig().OutOfBand; len(oob) != 1 || oob[0].How != "watch" {
		t.Fatalf("/debug/config out_of_band_writes: %+v", oob)
	}
}

// TestBumpNeverLandsOnAWritersEqualVersion: a hand write set routes to exactly the
// version confshim's belief would bump to (+1). To APISIX an equal version means "keep
// what you hold", so a bump to +1 decided unread would silently lose the client's
// change: a bump goes to the clock's milliseconds (§5.1), above the writer's version,
// without a look first.
func TestBumpNeverLandsOnAWritersEqualVersion(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := newStack(t, stackOptions{reseed: time.Hour})
	first := `{"routes_conf_version":5,"routes":[{"id":"r1","uri":"/one"}]}`
	if status, _ := rawPut(t, s.proxyURL, first, "c1"); status != 202 {
		t.Fatalf("first sync: %d", status)
	}
	s.oobPut(t, func(doc map[string]any) { // the operator's hand edit, at 5+1
		doc["routes_conf_version"] = float64(6)
		doc["routes"] = []any{map[string]any{"id": "r1", "uri": "/by-hand"}}
	})
	// the client's stale cache changes r1 at its old version: a bump to 5+1 would be
	// taken by APISIX as "keep routes"
	stale := `{"routes_conf_version":5,"routes":[{"id":"r1","uri":"/two"}]}`
	status, hdr := rawPut(t, s.proxyURL, stale, "c2")
	if status != 202 || !strings.Contains(hdr.Get("X-Confshim-Actions"), "routes=bumped") {
		t.Fatalf("stale change: %d %q", status, hdr.Get("X-Confshim-Actions"))
	}
	mustContain(t, s.items(t, "routes"), "/two")
	if v := s.em.SectionVersion("routes"); v < float64(start.UnixMilli()) || v > float64(time.Now().UnixMilli()) {
		t.Fatalf("routes at version %v, want the clock's milliseconds (above the writer's 6)", v)
	}
}
