package apisix

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/metrics"
)

const testKey = "client-test-key"

// clientFor is a Client in front of an emulated APISIX of version.
func clientFor(t *testing.T, version string, wrap func(http.Handler) http.Handler) (*Client, *apisixtest.Server) {
	t.Helper()
	srv := apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{Version: version, AdminKey: testKey}, Wrap: wrap})
	u, _ := url.Parse(srv.URL)
	c, err := New(Config{Upstream: u, Timeout: 5 * time.Second, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	return c, srv
}

func keyed(key string) Credentials {
	r, _ := http.NewRequest(http.MethodPut, "http://x/apisix/admin/configs", nil)
	r.Header.Set("X-API-KEY", key)
	return CredentialsOf(r)
}

func storeConfig(t *testing.T, c *Client, body string) *Answer {
	t.Helper()
	a, err := c.PutConfig(context.Background(), keyed(testKey), []byte(body), "d-"+fmt.Sprint(len(body)))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestProbeByVersion: the probe is the cheapest call each version offers — an empty
// validate (3.15+), HEAD (3.14), GET (3.13) — and a wrong key is a RefusedError.
func TestProbeByVersion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ version, want string }{{"3.17.0", "POST /apisix/admin/configs/validate"}, {"3.14.1", "HEAD /apisix/admin/configs"}, {"3.13.0", "GET /apisix/admin/configs"}} {
		t.Run(tc.version, func(t *testing.T) {
			var seen []string
			c, _ := clientFor(t, tc.version, func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					seen = append(seen, r.Method+" "+r.URL.Path)
					next.ServeHTTP(w, r)
				})
			})
			ctx := context.Background()
			if _, err := c.Ping(ctx, ""); err != nil { // learns the version from Server
				t.Fatal(err)
			}
			seen = nil
			if err := c.Probe(ctx, keyed(testKey), 1<<20); err != nil {
				t.Fatal(err)
			}
			if len(seen) == 0 || seen[len(seen)-1] != tc.want {
				t.Fatalf("probe sent %v, want %s last", seen, tc.want)
			}
			var refused RefusedError
			if err := c.Probe(ctx, keyed("wrong"), 1<<20); !errors.As(err, &refused) || refused.Status != http.StatusUnauthorized {
				t.Fatalf("a wrong key: %v", err)
			}
			if tc.version == "3.13.0" && !c.NoHead() {
				t.Fatal("3.13's missing HEAD is not noted")
			}
		})
	}
}

func TestReadsAndWrites(t *testing.T) {
	t.Parallel()
	c, srv := clientFor(t, "3.17.0", nil)
	ctx := context.Background()
	creds := keyed(testKey)
	if meta, status, err := c.Head(ctx, Decide, creds); err != nil || status != http.StatusOK || meta.LastModified != "" {
		t.Fatalf("HEAD of an empty data plane: %+v %d %v", meta, status, err)
	}
	if a := storeConfig(t, c, `{"routes_conf_version":3,"routes":[{"id":"r1","uri":"/a"}]}`); a.Status != http.StatusAccepted || a.Header.Get("X-Digest") == "" {
		t.Fatalf("PutConfig: %d %v", a.Status, a.Header)
	}
	meta, _, err := c.Head(ctx, Decide, creds)
	if err != nil || meta.LastModified == "" || meta.Digest == "" {
		t.Fatalf("HEAD after a PUT: %+v %v", meta, err)
	}
	body, gm, err := c.Get(ctx, Decide, creds, 1<<20)
	if err != nil || !strings.Contains(string(body), `"r1"`) || gm != *meta {
		t.Fatalf("GET: %s %+v %v", body, gm, err)
	}
	var tooBig TooBigError
	if _, _, err := c.Get(ctx, Shared, creds, 10); !errors.As(err, &tooBig) {
		t.Fatalf("a state over the limit: %v", err)
	}
	var refused RefusedError
	if _, _, err := c.Get(ctx, Shared, keyed("wrong"), 1<<20); !errors.As(err, &refused) {
		t.Fatalf("GET with a wrong key: %v", err)
	}
	if _, _, err := c.Head(ctx, Shared, keyed("wrong")); !errors.As(err, &refused) {
		t.Fatalf("HEAD with a wrong key: %v", err)
	}
	header := http.Header{"X-Api-Key": {testKey}, "X-Digest": {"c2"}, "Content-Type": {"application/json"}}
	a, done, err := c.Put(ctx, Decide, c.URL(ConfigsPath, ""), header, []byte(`{"routes_conf_version":2}`))
	<-done
	if err != nil || !IsConflict(a) {
		t.Fatalf("a stale PUT: %v %+v", err, a)
	}
	if server, err := c.Ping(ctx, ""); err != nil || server != "APISIX/3.17.0" || c.Server() != server || !c.HasValidate() {
		t.Fatalf("Ping: %q %v (Server %q)", server, err, c.Server())
	}
	if !c.Alive(ctx, "", time.Second) {
		t.Fatal("Alive: false")
	}
	if n, counted := c.DialCount(); !counted || n == 0 {
		t.Fatalf("decide dials %d %v", n, counted)
	}
	if c.DecideConn() == 0 {
		t.Fatal("the decide connection just used cannot be vouched for")
	}
	srv.Close()
	if c.Alive(ctx, "", 200*time.Millisecond) {
		t.Fatal("Alive with the port closed")
	}
	_, err = c.Ping(ctx, "")
	if kind, status := Classify(ctx, err); kind != metrics.Unreachable || status != http.StatusBadGateway {
		t.Fatalf("a closed port classified %s %d (%v)", kind, status, err)
	}
}

// TestValidateSectionUnderTheCap: items are validated in pieces under APISIX's 1.5 MiB
// cap, rejections come back with the section's own indexes, and an item alone over the
// cap counts as rejected.
func TestValidateSectionUnderTheCap(t *testing.T) {
	t.Parallel()
	var calls int
	c, _ := clientFor(t, "3.17.0", func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/validate") {
				calls++
			}
			next.ServeHTTP(w, r)
		})
	})
	ctx := context.Background()
	if _, err := c.Ping(ctx, ""); err != nil {
		t.Fatal(err)
	}
	var items [][]byte
	for i := range 3000 {
		plugins := ""
		if i == 2500 {
			plugins = `,"plugins":{"nope":{}}`
		}
		items = append(items, fmt.Appendf(nil, `{"id":"r%d","uri":"/r%d","desc":"%s"%s}`, i, i, strings.Repeat("x", 600), plugins))
	}
	items = append(items, fmt.Appendf(nil, `{"id":"huge","uri":"/h","desc":"%s"}`, strings.Repeat("y", maxValidateBody)))
	found, ok := c.ValidateSection(ctx, keyed(testKey), "routes", items)
	if !ok || len(found) != 2 || found[0].Index != 2500 || !strings.Contains(found[0].Error, "nope") || found[1].Index != 3000 {
		t.Fatalf("found %+v ok %v", found, ok)
	}
	if calls < 2 {
		t.Fatalf("%d validate calls: the section must be split under the cap", calls)
	}
	if _, ok := c.ValidateSection(ctx, keyed("wrong"), "routes", items[:1]); ok {
		t.Fatal("a refused validate said which items it rejects")
	}
}

func TestIntermediarySigns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		h    http.Header
		want string
	}{
		{http.Header{"Server": {"APISIX/3.17.0"}}, ""},
		{http.Header{"Server": {"APISIX/3.17.0"}, "Via": {"1.1 mesh"}}, "Via"},
		{http.Header{"Server": {"envoy"}}, "Server: envoy"},
		{http.Header{"Server": {"APISIX/3.17.0"}, "X-Envoy-Upstream-Service-Time": {"3"}}, "X-Envoy-*"},
		{http.Header{}, "no Server header"},
	} {
		if got := intermediarySign(tc.h); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.h, got, tc.want)
		}
	}
}
