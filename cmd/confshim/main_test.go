package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/wait"
)

func noEnv(string) (string, bool) { return "", false }

// withReady is the default hooks with ready set.
func withReady(ready func(proxyAddr, metricsAddr string)) hooks {
	h := defaultHooks()
	h.ready = ready
	return h
}

// mustNotListen fails the test if run gets as far as listening.
func mustNotListen(t *testing.T) hooks {
	return withReady(func(string, string) { t.Fatal("must not listen") }) // run is called on the test's goroutine
}

func TestVersion(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if code := run(context.Background(), []string{"--version"}, noEnv, &out, io.Discard, defaultHooks()); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.HasPrefix(out.String(), "confshim ") {
		t.Fatalf("%q", out.String())
	}
}

func TestBadFlagsAreAllReportedBeforeListening(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	args := []string{"--listen", "nope", "--max-body-bytes", "-1", "--upstream-timeout", "soon", "--log-level", "loud",
		"--log-format", "xml", "--upstream", "ftp://x", "--tls-cert-file", "a.pem"}
	code := run(context.Background(), args, noEnv, io.Discard, &stderr, mustNotListen(t))
	if code == 0 {
		t.Fatal("want a non-zero exit")
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	for _, flag := range []string{"--listen", "--max-body-bytes", "--upstream-timeout", "--log-level", "--log-format", "--tls-cert-file"} {
		found := false
		for _, l := range lines {
			found = found || strings.HasPrefix(l, flag+":")
		}
		if !found {
			t.Fatalf("no line names %s:\n%s", flag, stderr.String())
		}
	}
	// --upstream is checked when the proxy is built, still before listening
	stderr.Reset()
	code = run(context.Background(), []string{"--upstream", "ftp://x", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, noEnv, io.Discard, &stderr, mustNotListen(t))
	if code == 0 || !strings.HasPrefix(stderr.String(), "--upstream:") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

// TestAllowCIDRsNeverFailsOpen: a value with no usable entry is an error, never
// "everyone" (issue 18); only the empty default allows every client.
func TestAllowCIDRsNeverFailsOpen(t *testing.T) {
	t.Parallel()
	for _, v := range []string{",", " ", " , ", ",,,"} {
		_, err := parseOptions([]string{"--allow-cidrs", v}, noEnv)
		if err == nil || !strings.HasPrefix(err.Error(), "--allow-cidrs:") || strings.Contains(err.Error(), "\n") {
			t.Errorf("--allow-cidrs %q: %v, want one line naming the flag", v, err)
		}
		env := func(k string) (string, bool) { return v, k == "CONFSHIM_ALLOW_CIDRS" }
		if _, err := parseOptions(nil, env); err == nil {
			t.Errorf("CONFSHIM_ALLOW_CIDRS=%q was accepted", v)
		}
	}
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"--allow-cidrs", ","}, noEnv, io.Discard, &stderr, mustNotListen(t)); code == 0 {
		t.Fatal("--allow-cidrs , must exit non-zero")
	}
	o, err := parseOptions([]string{"--allow-cidrs", "10.0.0.0/8, ,127.0.0.1"}, noEnv)
	if err != nil || len(o.allowCIDRs) != 2 {
		t.Fatalf("usable entries with blanks between: %v %v", o.allowCIDRs, err)
	}
	if o, err := parseOptions(nil, noEnv); err != nil || len(o.allowCIDRs) != 0 {
		t.Fatalf("the default allows everyone: %v %v", o.allowCIDRs, err)
	}
}

// TestFallbackFlag: off (the default) and backfill; anything else names the flag.
func TestFallbackFlag(t *testing.T) {
	t.Parallel()
	if o, err := parseOptions([]string{"--fallback", "off"}, noEnv); err != nil || o.fallback {
		t.Fatal(err)
	}
	if o, err := parseOptions([]string{"--fallback", "backfill"}, noEnv); err != nil || !o.fallback {
		t.Fatal(err)
	}
	for _, v := range []string{"on", "", "Backfill"} {
		if _, err := parseOptions([]string{"--fallback", v}, noEnv); err == nil || !strings.HasPrefix(err.Error(), "--fallback:") {
			t.Errorf("--fallback %q: %v", v, err)
		}
	}
}

// TestMergeFlag: a merged section leaves the default --preserve list; naming it in both
// explicitly, by flag or environment, is an error naming --merge.
func TestMergeFlag(t *testing.T) {
	t.Parallel()
	o, err := parseOptions([]string{"--merge", "secrets,global_rules"}, noEnv)
	if err != nil || slices.Contains(o.preserve, "secrets") || !slices.Contains(o.preserve, "plugins") || len(o.merge) != 2 {
		t.Fatalf("preserve %v merge %v: %v", o.preserve, o.merge, err)
	}
	if _, err := parseOptions([]string{"--merge", "secrets", "--preserve", "secrets,plugins"}, noEnv); err == nil || !strings.HasPrefix(err.Error(), "--merge:") {
		t.Fatalf("both flags: %v", err)
	}
	env := func(k string) (string, bool) { return "secrets", k == "CONFSHIM_PRESERVE" }
	if _, err := parseOptions([]string{"--merge", "secrets"}, env); err == nil {
		t.Fatal("CONFSHIM_PRESERVE naming a merged section was accepted")
	}
}

// TestSectionListsAreStrict: --preserve and --merge name APISIX resource sections only
// (a misspelt --merge secretz would merge nothing while secrets stays preserved), with
// one line naming the flag and listing the known sections; empty elements are said once.
func TestSectionListsAreStrict(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string // the one line
	}{
		{[]string{"--merge", "secretz"}, `--merge: "secretz" is not an APISIX resource section (known: routes, services, upstreams, consumers, consumer_groups, ssls, global_rules, plugin_configs, plugin_metadata, protos, secrets, stream_routes, plugins)`},
		{[]string{"--preserve", "plugins,route,secret"}, `--preserve: "route", "secret" are not APISIX resource sections (known: `},
		{[]string{"--merge", "secrets,,"}, `--merge: "secrets,," has an empty section name`},
		{[]string{"--merge", ",,,"}, `--merge: ",,," has an empty section name`},
		{[]string{"--preserve", "routes_conf_version"}, `--preserve: "routes_conf_version" is not an APISIX resource section`},
	} {
		_, err := parseOptions(tc.args, noEnv)
		if err == nil || strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want one line starting %q", tc.args, err, tc.want)
		}
	}
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"--merge", "secretz"}, noEnv, io.Discard, &stderr, mustNotListen(t)); code != 2 {
		t.Fatalf("--merge secretz exited %d, want 2 (%s)", code, stderr.String())
	}
	if o, err := parseOptions([]string{"--merge", " secrets , global_rules,secrets"}, noEnv); err != nil || !slices.Equal(o.merge, []string{"secrets", "global_rules"}) {
		t.Fatalf("spaces and a repeat: %v %v", o, err)
	}
}

func TestEnvironmentOverlay(t *testing.T) {
	t.Parallel()
	env := map[string]string{"CONFSHIM_PRESERVE": "secrets", "CONFSHIM_MAX_BODY_BYTES": "1234", "CONFSHIM_UPSTREAM_TIMEOUT": "3s", "CONFSHIM_UPSTREAM_INSECURE_SKIP_VERIFY": "true"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	o, err := parseOptions([]string{"--max-body-bytes", "99"}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.preserve, ",") != "secrets" || o.maxBodyBytes != 99 || o.upstreamTimeout != 3*time.Second || !o.upstreamInsecure {
		t.Fatalf("flags must win over the environment, the environment over defaults: %+v", o)
	}
	o, err = parseOptions([]string{"--preserve", ""}, noEnv)
	if err != nil || len(o.preserve) != 0 {
		t.Fatalf("--preserve '' means none: %v %v", o.preserve, err)
	}
	env = map[string]string{"CONFSHIM_PRESERVE": ""}
	if o, err := parseOptions(nil, lookup); err != nil || len(o.preserve) != 0 {
		t.Fatalf("CONFSHIM_PRESERVE set to empty means none: %v %v", o.preserve, err)
	}
	env = map[string]string{"CONFSHIM_LOG_LEVEL": "chatty"}
	if _, err := parseOptions(nil, lookup); err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Fatalf("a bad environment value names its flag: %v", err)
	}
}

type addrs struct {
	proxy, metrics string
}

// start runs confshim in front of upstream.
func start(t *testing.T, upstream string, h hooks) (addrs, func() int) {
	t.Helper()
	return launch(t, []string{"--upstream", upstream, "--upstream-timeout", "2s", "--shutdown-timeout", "5s"}, h)
}

// launch runs confshim on loopback ports with args and h (its ready set here) and
// returns its addresses and a stop func (cancel, then the exit code).
func launch(t *testing.T, args []string, h hooks) (addrs, func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan addrs, 1)
	done := make(chan int, 1)
	args = append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}, args...)
	go func() {
		h.ready = func(p, m string) { ready <- addrs{p, m} }
		done <- run(ctx, args, noEnv, io.Discard, io.Discard, h)
	}()
	select {
	case a := <-ready:
		return a, func() int { cancel(); return <-done }
	case code := <-done:
		t.Fatalf("confshim exited with %d", code)
	case <-time.After(5 * time.Second):
		t.Fatal("confshim did not start")
	}
	cancel()
	return addrs{}, nil
}

func get(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	h := defaultHooks()
	h.readyWindow = 100 * time.Millisecond // how long one answer keeps confshim ready
	dp := apisixtest.Start(t, apisixtest.Options{})
	a, stop := start(t, dp.URL, h)
	defer stop()
	if get(t, "http://"+a.metrics+"/healthz") != 200 || get(t, "http://"+a.metrics+"/readyz") != 200 {
		t.Fatal("healthy and ready with the data plane up")
	}
	if get(t, "http://"+a.metrics+"/metrics") != 200 {
		t.Fatal("/metrics")
	}
	if get(t, "http://"+a.metrics+"/apisix/admin/configs") != 404 {
		t.Fatal("the metrics listener never serves the proxied API")
	}
	dp.Close()
	// once the last answer is older than the window and HEAD /apisix/admin fails,
	// /readyz turns 503; /healthz never depends on the upstream
	wait.For(t, "/readyz 503 with the data plane down", func() bool { return get(t, "http://"+a.metrics+"/readyz") == 503 })
	if get(t, "http://"+a.metrics+"/healthz") != 200 {
		t.Fatal("/healthz never depends on the upstream")
	}
}

func TestUpstreamPasswordIsNeverPrinted(t *testing.T) {
	t.Parallel()
	var stderr strings.Builder
	ctx, cancel := context.WithCancel(context.Background())
	code := run(ctx, []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--upstream", "http://admin:hunter2@127.0.0.1:1"},
		noEnv, io.Discard, &stderr, withReady(func(string, string) { cancel() }))
	if code != 0 || !strings.Contains(stderr.String(), "confshim started") || strings.Contains(stderr.String(), "hunter2") {
		t.Fatalf("exit %d; the start line must redact the password:\n%s", code, stderr.String())
	}
	stderr.Reset()
	code = run(context.Background(), []string{"--upstream", "http://admin:hunter2@[::1"}, noEnv, io.Discard, &stderr, defaultHooks())
	if code == 0 || strings.Contains(stderr.String(), "hunter2") || !strings.Contains(stderr.String(), "--upstream") {
		t.Fatalf("exit %d; a bad --upstream is reported without its password: %s", code, stderr.String())
	}
}

func TestShutdownDrainsInFlightRequests(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	var once sync.Once
	entered := make(chan struct{})
	dp := apisixtest.Start(t, apisixtest.Options{Wrap: func(em http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				once.Do(func() { close(entered) })
				<-gate
			}
			em.ServeHTTP(w, r)
		})
	}})
	a, stop := start(t, dp.URL, defaultHooks())
	status := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + a.proxy + "/apisix/admin/configs")
		if err != nil {
			status <- -1
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	<-entered
	exited := make(chan int, 1)
	go func() { exited <- stop() }()
	// /readyz turns 503 once shutdown starts, while the request is still in flight
	wait.For(t, "/readyz 503 during the drain", func() bool { return get(t, "http://"+a.metrics+"/readyz") == 503 })
	close(gate)
	if got := <-status; got != 200 {
		t.Fatalf("the in-flight request was not drained: %d", got)
	}
	if code := <-exited; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestUsageBlocksMatchHelp keeps the README's and the operations guide's command-line
// sections equal to --help: one source for the flag table.
func TestUsageBlocksMatchHelp(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"../../README.md", "../../docs/operations.md"} {
		doc, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, after, ok := strings.Cut(string(doc), "<!-- usage:begin -->\n```\n")
		block, _, ok2 := strings.Cut(after, "```\n<!-- usage:end -->")
		if !ok || !ok2 {
			t.Fatalf("%s has no usage block", path)
		}
		if block != usage() {
			t.Fatalf("%s's usage block differs from --help; paste this:\n%s", path, usage())
		}
	}
}
