package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fastjson"

	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// handlerTransport serves upstream requests in-process, so fuzzing needs no sockets.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// fakeDataPlane holds a fixed state and records the PUTs it receives.
type fakeDataPlane struct {
	mu      sync.Mutex
	puts    [][]byte
	digests []string
}

const fuzzState = `{"routes_conf_version":7,"routes":[{"id":"r1","uri":"\/a"}],"secrets_conf_version":2,"secrets":[{"id":"v\/1"}],"upstreams_conf_version":3,"X-Digest":"s","X-Last-Modified":1}`

func (d *fakeDataPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Digest", "s")
	w.Header().Set("X-Last-Modified", "1")
	switch r.Method {
	case http.MethodPut:
		b, _ := io.ReadAll(r.Body)
		d.mu.Lock()
		d.puts = append(d.puts, b)
		d.digests = append(d.digests, r.Header.Get("X-Digest"))
		d.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	case http.MethodGet:
		_, _ = io.WriteString(w, fuzzState)
	}
}

// FuzzProxyPut drives the configs PUT handler with any body: no panic; at most one PUT
// reaches the data plane; a body that is not rewritten is forwarded byte for byte with
// the client's digest; a rewritten one is valid JSON (or YAML that scans again) and
// carries another digest.
func FuzzProxyPut(f *testing.F) {
	paths, _ := filepath.Glob("../testdata/rewrite/*.txtar")
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		for _, name := range []string{"request.json", "request.yaml"} {
			if _, body, ok := bytes.Cut(data, []byte("-- "+name+" --\n")); ok {
				body, _, _ = bytes.Cut(body, []byte("\n-- "))
				f.Add(body, name == "request.yaml")
			}
		}
	}
	f.Add([]byte(`{"routes_conf_version":1}`), false)
	f.Add([]byte(`[1]`), false)
	f.Add([]byte("a: b\n"), true)
	f.Fuzz(func(t *testing.T, body []byte, asYAML bool) {
		dp := &fakeDataPlane{}
		p, err := New(Config{Upstream: "http://dp.invalid", Preserve: rewrite.DefaultPreserve, MaxBodyBytes: 1 << 20,
			UpstreamTimeout: time.Second, Logger: zerolog.Nop(), Metrics: metrics.New(prometheus.NewRegistry(), "fuzz"),
			Transport: handlerTransport{dp}})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest(http.MethodPut, "/apisix/admin/configs", bytes.NewReader(body))
		req.Header.Set("X-Digest", "d")
		if asYAML {
			req.Header.Set("Content-Type", "application/yaml")
		}
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		if len(dp.puts) > 1 {
			t.Fatalf("%d PUTs forwarded", len(dp.puts))
		}
		if len(dp.puts) == 0 {
			if rec.Code != http.StatusBadRequest && rec.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("nothing forwarded but answered %d", rec.Code)
			}
			return
		}
		sent, digest := dp.puts[0], dp.digests[0]
		rewritten := digest != "d"
		switch {
		case !rewritten && !bytes.Equal(sent, body):
			t.Fatalf("not rewritten, yet the forwarded body differs:\n%q\n%q", body, sent)
		case rewritten && !asYAML && fastjson.ValidateBytes(sent) != nil:
			t.Fatalf("rewritten body is not valid JSON: %q", sent)
		case rewritten && asYAML:
			if _, err := rewrite.New(nil).PrepareYAML(sent); err != nil {
				t.Fatalf("rewritten YAML does not scan again (%v): %q", err, sent)
			}
		case rewritten && digest != "s" && !strings.HasPrefix(digest, "d+confshim:"):
			t.Fatalf("rewritten with digest %q", digest)
		}
	})
}
