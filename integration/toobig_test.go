package integration

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/wait"
	"github.com/confshim/confshim/metrics"
)

// manyRoutes is config("v1") with n routes, each with a path long enough to fill a
// small dict.
func manyRoutes(n int, prefix string) adcclient.Config {
	routes := make([]map[string]any, n)
	for i := range routes {
		routes[i] = route(fmt.Sprintf("r%d", i), fmt.Sprintf("/%s/%04d/%s", prefix, i, strings.Repeat("x", 200)), nil)
	}
	return withRoutes(routes...)
}

// TestConfigTooBigForTheDict (issue 46): a configuration larger than APISIX's
// standalone-config dict is answered with the size and the setting to raise, counted,
// shown in /debug/config; sent again (ADC re-stamps its versions) it is not forwarded
// within the minute while neither it nor what the data plane holds changed — APISIX
// does not decode it again — though APISIX's refusal emptied its dict, and whether or
// not confshim's watch put the kept configuration back meanwhile; a changed
// configuration, or another configuration on the data plane, goes to APISIX; a
// configuration that fits lands and clears it all.
func TestConfigTooBigForTheDict(t *testing.T) {
	t.Parallel()
	for _, reseed := range []time.Duration{0, 20 * time.Millisecond} {
		t.Run(fmt.Sprintf("reseed=%v", reseed), func(t *testing.T) {
			var refused atomic.Int64 // the size of the last PUT APISIX refused for the dict (a re-seed may follow it)
			s := newStack(t, stackOptions{dictSize: 64 << 10, reseed: reseed, adminKey: adminKey, wrap: func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method != http.MethodPut {
						next.ServeHTTP(w, r)
						return
					}
					body, _ := io.ReadAll(r.Body)
					r.Body = io.NopCloser(bytes.NewReader(body))
					rec := &statusRecorder{ResponseWriter: w}
					next.ServeHTTP(rec, r)
					if rec.status == http.StatusInternalServerError {
						refused.Store(int64(len(body)))
					}
				})
			}})
			c := s.client(true)
			mustLand(t, sync1(t, c, manyRoutes(3, "small")))
			tooBig := s.metrics.ConfigTooBig
			byAPISIX, byConfshim := tooBig.WithLabelValues(string(metrics.TooBigByAPISIX)), tooBig.WithLabelValues(string(metrics.TooBigByConfshim))
			refusals := func() int { return s.em.Costs().Rejected }

			res := sync1(t, c, manyRoutes(300, "big"))
			if res.Status != http.StatusInternalServerError {
				t.Fatalf("a configuration over the dict: %d %s", res.Status, res.Body)
			}
			sent := int(refused.Load())
			for _, want := range []string{"confshim: APISIX could not store the configuration: " + strconv.Itoa(sent) + " bytes",
				"nginx_config.meta.lua_shared_dict.standalone-config", "restart APISIX", "no memory"} {
				mustContain(t, string(res.Body), want)
			}
			if refusals() != 1 || counter(byAPISIX) != 1 || counter(s.metrics.ConfigTooBigBytes) != float64(sent) {
				t.Fatalf("refusals %d, apisix %v, bytes %v (want %d)", refusals(), counter(byAPISIX), counter(s.metrics.ConfigTooBigBytes), sent)
			}
			dbg := s.proxy.DebugConfig().TooBig
			if dbg == nil || dbg.Bytes != sent || dbg.Setting != "nginx_config.meta.lua_shared_dict.standalone-config" || dbg.RetryNotBefore.Sub(dbg.At) != time.Minute {
				t.Fatalf("/debug/config config_too_big: %+v", dbg)
			}
			if reseed > 0 { // the refusal emptied APISIX's dict: the watch puts the kept configuration back
				wait.For(t, "the watch to re-seed the emptied data plane", func() bool { return s.em.Document() != nil })
			}

			// ADC's next tries: the same configuration, fresh versions
			for i := range 3 {
				res = sync1(t, c, manyRoutes(300, "big"))
				if res.Status != http.StatusInternalServerError || refusals() != 1 {
					t.Fatalf("the same configuration again (%d): %d, APISIX refused %d times %s", i, res.Status, refusals(), res.Body)
				}
			}
			mustContain(t, string(res.Body), "so it was not sent again")
			left := time.Until(s.proxy.DebugConfig().TooBig.RetryNotBefore).Seconds()
			if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); ra < 1 || ra > 60 || math.Abs(float64(ra)-left) > 2 {
				t.Fatalf("Retry-After %q, want the rest of the minute (%.1f s)", res.Header.Get("Retry-After"), left)
			}
			if counter(byConfshim) != 3 || counter(byAPISIX) != 1 {
				t.Fatalf("counted apisix %v, confshim %v", counter(byAPISIX), counter(byConfshim))
			}

			// a changed configuration is APISIX's to judge
			res = sync1(t, c, manyRoutes(301, "big"))
			if res.Status != http.StatusInternalServerError || refusals() != 2 || counter(byAPISIX) != 2 {
				t.Fatalf("a changed configuration: %d, refusals %d, apisix %v", res.Status, refusals(), counter(byAPISIX))
			}
			// and so is the first one again, while the second is remembered too
			res = sync1(t, c, manyRoutes(300, "big"))
			if res.Status != http.StatusInternalServerError || refusals() != 2 {
				t.Fatalf("the first configuration after the second: %d, refusals %d, want it remembered", res.Status, refusals())
			}
			// another configuration on the data plane (an operator's write) lets it go
			adminPut(t, s.dpURL, `{"secrets_conf_version":99,"secrets":[{"id":"vault/op","uri":"http://vault:8200","prefix":"kv","token":"t"}]}`,
				fmt.Sprintf("oob-%d", time.Now().UnixNano()))
			res = sync1(t, c, manyRoutes(301, "big"))
			if res.Status != http.StatusInternalServerError || refusals() != 3 {
				t.Fatalf("after the data plane moved: %d, refusals %d, want 3", res.Status, refusals())
			}

			mustLand(t, sync1(t, c, manyRoutes(5, "small")))
			if counter(s.metrics.ConfigTooBigBytes) != 0 || s.proxy.DebugConfig().TooBig != nil {
				t.Fatalf("a landed sync leaves bytes %v, /debug/config %+v", counter(s.metrics.ConfigTooBigBytes), s.proxy.DebugConfig().TooBig)
			}
			mustContain(t, s.logs.String(), `"event":"config_too_big"`)
		})
	}
}

// statusRecorder keeps the status an emulator answered.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
