package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/confshim/confshim/integration/emulator"
)

// Regression tests for what a hostile or careless client found (contract §5.5–§5.7).

func TestRefusedCallerCostsNoStateRead(t *testing.T) {
	f := newFixture(t, nil, nil)
	big := `{"routes_conf_version":1,"routes":[` + strings.Repeat(`{"id":"x","uri":"/x"},`, 1000) + `{"id":"y","uri":"/y"}]}`
	r := do(t, "PUT", f.url+"/apisix/admin/configs", big, map[string]string{"X-Digest": "d", "X-API-KEY": "guess"})
	if r.status != http.StatusUnauthorized || r.header.Get("X-Confshim-Actions") != "" {
		t.Fatalf("want APISIX's 401 and no decision, got %d %v", r.status, r.header)
	}
	var methods []string
	for _, s := range f.rec.all() {
		methods = append(methods, s.method)
	}
	if strings.Join(methods, ",") != "HEAD,PUT" {
		t.Fatalf("a refused caller gets one probe and its PUT streamed to APISIX, got %v", methods)
	}
	if put := f.rec.puts()[0]; string(put.body) != big {
		t.Fatal("the refused caller's PUT must reach APISIX as it came")
	}
}

func TestBodyBudgetAnswers503WithRetryAfter(t *testing.T) {
	// a budget of one body: a second body waits, then is answered 503
	hold := make(chan struct{})
	em, _ := emulator.New(emulator.Options{AdminKey: key})
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			<-hold
		}
		em.ServeHTTP(w, r)
	}), func(c *Config) {
		c.MaxBodyBytes = 1 << 10
		c.BodyBudgetBytes = 1 << 10
		c.BodyBudgetWait = 50 * time.Millisecond
	})
	body := `{"routes_conf_version":1,"pad":"` + strings.Repeat("a", 900) + `"}`
	first := make(chan int, 1)
	go func() {
		first <- do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": "a"})).status
	}()
	waitUntil(t, func() bool { return len(f.rec.puts()) == 1 })
	r := do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": "b"}))
	close(hold)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, "budget") {
		t.Fatalf("want 503 with Retry-After, got %d %v %s", r.status, r.header, r.body)
	}
	if got := <-first; got != http.StatusAccepted {
		t.Fatalf("the first body: %d", got)
	}
	if got := testutil.ToFloat64(f.m.Refused.WithLabelValues("body_budget")); got != 1 {
		t.Fatalf("refused{body_budget} = %v", got)
	}
	// the budget came back: the same body now lands
	if r := do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": "c"})); r.status != http.StatusAccepted {
		t.Fatalf("after the first body: %d", r.status)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestLogsAndHeadersStayBounded(t *testing.T) {
	t.Run("a huge repeated key name", func(t *testing.T) {
		f := newFixture(t, nil, nil)
		name := strings.Repeat("k", 256<<10)
		r := do(t, "PUT", f.url+"/apisix/admin/configs", fmt.Sprintf(`{%q:1,%q:2}`, name, name), withKey(map[string]string{"X-Digest": "d"}))
		if r.status != http.StatusBadRequest || len(r.body) > 1024 {
			t.Fatalf("want a short 400, got %d with %d bytes", r.status, len(r.body))
		}
		for _, line := range strings.Split(f.log(), "\n") {
			if len(line) > 2048 {
				t.Fatalf("a log line of %d bytes", len(line))
			}
		}
	})
	t.Run("thousands of stale unknown sections", func(t *testing.T) {
		// the data plane holds 2,000 unknown sections at version 5; the client sends them at 1
		var state, req strings.Builder
		state.WriteString(`{"routes_conf_version":0`)
		req.WriteString(`{"routes_conf_version":0`)
		for i := 0; i < 2000; i++ {
			fmt.Fprintf(&state, `,"section_with_a_long_name_%04d_conf_version":5`, i)
			fmt.Fprintf(&req, `,"section_with_a_long_name_%04d_conf_version":1`, i)
		}
		state.WriteString("}")
		req.WriteString("}")
		f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.Method {
			case http.MethodGet:
				_, _ = io.WriteString(w, state.String())
			case http.MethodPut:
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusAccepted)
			}
		}), nil)
		r := do(t, "PUT", f.url+"/apisix/admin/configs", req.String(), map[string]string{"X-Digest": "d"})
		h := r.header.Get("X-Confshim-Actions")
		if r.status != http.StatusAccepted || len(h) > 8<<10 || !strings.HasSuffix(h, ", …") {
			t.Fatalf("want the actions cut at 8 KiB with ', …', got %d, %d bytes", r.status, len(h))
		}
		for _, line := range strings.Split(f.log(), "\n") {
			if len(line) > 8<<10 {
				t.Fatalf("a log line of %d bytes", len(line))
			}
		}
	})
}

func TestBufferNotReusedWhileTheTransportSends(t *testing.T) {
	// APISIX answers before reading the body; under -race a reused buffer shows up as a
	// race between the transport's write and the next PUT's read.
	em, _ := emulator.New(emulator.Options{AdminKey: key})
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error_msg":"early"}`)
			return
		}
		em.ServeHTTP(w, r)
	}), nil)
	body := `{"routes_conf_version":1,"pad":"` + strings.Repeat("b", 200<<10) + `"}`
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 5; j++ {
				do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": fmt.Sprint(j)}))
			}
		}()
	}
	wg.Wait()
	for _, p := range f.rec.puts() {
		if len(p.body) > 0 && !strings.HasPrefix(string(p.body), `{"routes_conf_version":`) {
			t.Fatalf("a forwarded body was overwritten: %.40q", p.body)
		}
	}
}

// TestAWriteWhileTheBodyArrives: an out-of-band write lands after the probe and before
// the body is complete; whichever way confshim learns of it (a fresh revalidation, or
// APISIX's conflict and one retry), the preserved secrets survive and the sync lands.
func TestAWriteWhileTheBodyArrives(t *testing.T) {
	f := newFixture(t, nil, nil)
	pw, done := slowPut(t, f, "slow")
	_, _ = io.WriteString(pw, `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"}],`)
	waitUntil(t, func() bool { return len(f.rec.all()) >= 1 }) // probed
	oob := httptest.NewRequest("PUT", "/apisix/admin/configs", strings.NewReader(`{"secrets_conf_version":5,"secrets":[{"id":"vault/1","uri":"http://v"}]}`))
	oob.Header.Set("X-API-KEY", key)
	oob.Header.Set("X-Digest", "oob")
	rec := httptest.NewRecorder()
	f.em.ServeHTTP(rec, oob)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("out-of-band write: %d", rec.Code)
	}
	_, _ = io.WriteString(pw, `"secrets_conf_version":0}`)
	pw.Close()
	r := <-done
	if r.status != http.StatusAccepted || !strings.Contains(r.header.Get("X-Confshim-Actions"), "secrets=preserved") {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	if f.em.Document()["secrets"] == nil {
		t.Fatal("the out-of-band secrets were wiped")
	}
}
