package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
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
// within the minute while neither it nor the data plane changed — APISIX does not
// decode it again — but a changed configuration, or a data plane that moved, is; a
// configuration that fits lands and clears it all.
func TestConfigTooBigForTheDict(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{dictSize: 64 << 10})
	c := s.client(true)
	mustLand(t, sync1(t, c, manyRoutes(3, "small")))
	tooBig := s.metrics.ConfigTooBig
	byAPISIX, byConfshim := tooBig.WithLabelValues(string(metrics.TooBigByAPISIX)), tooBig.WithLabelValues(string(metrics.TooBigByConfshim))

	puts, parsed := s.em.Puts(), s.em.Costs().BytesParsed
	res := sync1(t, c, manyRoutes(300, "big"))
	if res.Status != http.StatusInternalServerError {
		t.Fatalf("a configuration over the dict: %d %s", res.Status, res.Body)
	}
	sent := s.em.Costs().BytesParsed - parsed
	for _, want := range []string{"confshim: APISIX could not store the configuration: " + strconv.Itoa(sent) + " bytes",
		"nginx_config.meta.lua_shared_dict.standalone-config", "restart APISIX", "no memory"} {
		mustContain(t, string(res.Body), want)
	}
	if s.em.Puts() != puts+1 || counter(byAPISIX) != 1 || counter(s.metrics.ConfigTooBigBytes) != float64(sent) {
		t.Fatalf("PUTs %d (want %d), apisix %v, bytes %v (want %d)", s.em.Puts(), puts+1, counter(byAPISIX), counter(s.metrics.ConfigTooBigBytes), sent)
	}
	dbg := s.proxy.DebugConfig().TooBig
	if dbg == nil || dbg.Bytes != sent || dbg.Setting != "nginx_config.meta.lua_shared_dict.standalone-config" || dbg.RetryNotBefore.Sub(dbg.At).Minutes() != 1 {
		t.Fatalf("/debug/config config_too_big: %+v", dbg)
	}

	// ADC's next try: the same configuration, fresh versions
	puts = s.em.Puts()
	res = sync1(t, c, manyRoutes(300, "big"))
	if res.Status != http.StatusInternalServerError || s.em.Puts() != puts {
		t.Fatalf("the same configuration again: %d (PUTs %d, want %d unchanged) %s", res.Status, s.em.Puts(), puts, res.Body)
	}
	mustContain(t, string(res.Body), "so it was not sent again")
	if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); ra < 50 || ra > 60 {
		t.Fatalf("Retry-After %q, want the rest of the minute", res.Header.Get("Retry-After"))
	}
	if counter(byConfshim) != 1 || counter(byAPISIX) != 1 {
		t.Fatalf("counted apisix %v, confshim %v", counter(byAPISIX), counter(byConfshim))
	}

	// a changed configuration is APISIX's to judge
	res = sync1(t, c, manyRoutes(301, "big"))
	if res.Status != http.StatusInternalServerError || s.em.Puts() != puts+1 || counter(byAPISIX) != 2 {
		t.Fatalf("a changed configuration: %d, PUTs %d (want %d), apisix %v", res.Status, s.em.Puts(), puts+1, counter(byAPISIX))
	}
	// and so is the same one on a data plane that moved (an operator's write)
	s.writeSecret(t, "op-1")
	res = sync1(t, c, manyRoutes(301, "big"))
	if res.Status != http.StatusInternalServerError || s.em.Puts() != puts+3 { // the operator's PUT and confshim's
		t.Fatalf("after the data plane moved: %d, PUTs %d (want %d)", res.Status, s.em.Puts(), puts+3)
	}

	mustLand(t, sync1(t, c, manyRoutes(5, "small")))
	if counter(s.metrics.ConfigTooBigBytes) != 0 || s.proxy.DebugConfig().TooBig != nil {
		t.Fatalf("a landed sync leaves bytes %v, /debug/config %+v", counter(s.metrics.ConfigTooBigBytes), s.proxy.DebugConfig().TooBig)
	}
	mustContain(t, s.logs.String(), `"event":"config_too_big"`)
}
