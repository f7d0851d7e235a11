package integration

import (
	"context"
	"fmt"
	"github.com/confshim/confshim/proxy"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/internal/testsupport/wait"
)

// BenchmarkSync measures what APISIX does for ADC-shaped syncs of the 10k configuration
// (10,000 routes, services and upstreams, plugin metadata), sent straight to the
// emulator and through confshim: (a) an identical sync in which ADC re-stamps
// plugin_metadata, (b) a one-route change, (c) a leader change (another replica wrote
// in between; straight to APISIX the stale sync is rejected). The wall time includes
// the emulator's own decoding and validation, the stand-in for APISIX's cost. Reported
// per sync: sections reloaded, items validated, bytes APISIX parsed, share answered 204.
func BenchmarkSync(b *testing.B) {
	const n = 10000
	base := func(variant string) adcclient.Config {
		cfg := largeConfig(n, variant)
		cfg["plugin_metadata"] = []map[string]any{{"id": "http-logger", "log_format": map[string]any{"host": "$host"}}}
		return cfg
	}
	flip := map[string]string{"a": "b", "b": "a"}
	for _, scenario := range []string{"identical-restamp", "one-route", "leader-change"} {
		for _, through := range []bool{false, true} {
			name := scenario + "/direct"
			if through {
				name = scenario + "/confshim"
			}
			b.Run(name, func(b *testing.B) {
				s := newStack(b, stackOptions{})
				ctx := context.Background()
				c := s.client(through)
				c.Restamp = []string{"plugin_metadata"}
				mustLand(b, sync1(b, c, base("a")))
				mustLand(b, sync1(b, c, base("a"))) // confshim learns the state once
				other := s.client(through)
				variant := "a"
				var syncs, noContent, reloads, validated, parsed int
				for b.Loop() {
					b.StopTimer()
					switch scenario {
					case "one-route":
						variant = flip[variant]
					case "leader-change":
						other.Invalidate()
						theirs := base(variant) // another view of the world: other upstream nodes
						theirs["upstreams"][0]["nodes"] = []any{map[string]any{"host": "10.0.0.99", "port": 8080, "weight": 1}}
						if res := sync1(b, other, theirs); res.Status/100 != 2 {
							b.Fatalf("the other leader: %d", res.Status)
						}
					}
					t := c.NextT()
					body := c.Body(base(variant), t)
					preReloads, pre := s.em.TotalReloads(), s.em.Costs()
					b.StartTimer()
					res, err := c.Put(ctx, body, t)
					b.StopTimer()
					if err != nil {
						b.Fatal(err)
					}
					post := s.em.Costs()
					reloads += s.em.TotalReloads() - preReloads
					validated += post.ItemsValidated - pre.ItemsValidated
					parsed += post.BytesParsed - pre.BytesParsed
					if res.Status == http.StatusNoContent {
						noContent++
					}
					syncs++
					b.StartTimer()
				}
				per := func(v int) float64 { return float64(v) / float64(syncs) }
				b.ReportMetric(per(reloads), "reloads/op")
				b.ReportMetric(per(validated), "validated/op")
				b.ReportMetric(per(parsed), "parsed-B/op")
				b.ReportMetric(per(noContent), "204/op")
			})
		}
	}
}

// BenchmarkDecodes counts what matters most to a large APISIX: decodes of its stored
// document (each GET, HEAD and PUT of /configs costs one, ≈ 0.3 s of a worker at 40,000
// routes). Per ADC-shaped sync (identical, one route changed), straight to the
// emulator and through confshim; and at idle, with the watch's clock compressed 100×
// (a 10 ms ping, a 600 ms safety interval standing for the minute), decodes per minute.
func BenchmarkDecodes(b *testing.B) {
	flip := map[string]string{"a": "b", "b": "a"}
	for _, n := range []int{10000, 40000} {
		for _, scenario := range []string{"identical", "one-route", "reordered", "oob-between", "idle", "merged-change", "merged-untouched"} {
			for _, path := range []string{"direct", "confshim", "confshim-never"} {
				through, never := path != "direct", path == "confshim-never"
				if never && scenario != "identical" && scenario != "one-route" && !strings.HasPrefix(scenario, "merged-") {
					continue // --trust-connection never: what reading before every decision costs
				}
				if !through && strings.HasPrefix(scenario, "merged-") {
					continue // straight, the client's stale secrets version is refused: one-route is the row to read beside them
				}
				name := fmt.Sprintf("%dk/%s/%s", n/1000, scenario, path)
				b.Run(name, func(b *testing.B) {
					const tick, minute = 10 * time.Millisecond, 600 * time.Millisecond
					// per sync the watch stays out of the count (it never ticks); at idle it
					// runs only where confshim is in the path
					opts := stackOptions{reseed: time.Hour, adminKey: adminKey}
					if never {
						opts.trust = proxy.TrustNever
					}
					if scenario == "idle" {
						opts = stackOptions{adminKey: adminKey}
						if through {
							opts.reseed, opts.safety = tick, minute
						}
					}
					// --merge secrets with an operator's secret beside the client's: a sync
					// that changes the merged section (its union must stand on a state
					// shown current, §5.4) and one that changes only a route
					merged := strings.HasPrefix(scenario, "merged-")
					secretToken := "a"
					withSecret := func(cfg adcclient.Config) adcclient.Config {
						if merged {
							cfg["secrets"] = []map[string]any{secretItem("vault/ctrl", secretToken)}
						}
						return cfg
					}
					if merged && through {
						opts.merge = []string{"secrets"}
					}
					s := newStack(b, opts)
					c := s.client(through)
					mustLand(b, sync1(b, c, withSecret(largeConfig(n, "a"))))
					if merged {
						oobSecret(b, s, 0)
					}
					mustLand(b, sync1(b, c, withSecret(largeConfig(n, "a"))))
					if scenario == "idle" {
						before, start := s.em.Costs().Decodes(), time.Now()
						for b.Loop() {
							time.Sleep(minute)
						}
						minutes := float64(time.Since(start)) / float64(minute)
						b.ReportMetric(float64(s.em.Costs().Decodes()-before)/minutes, "decodes/idle-min")
						return
					}
					variant, decodes, syncs, reloads := "a", 0, 0, 0
					for b.Loop() {
						cfg := largeConfig(n, variant)
						switch scenario {
						case "one-route":
							variant = flip[variant]
							cfg = largeConfig(n, variant)
						case "reordered": // a replica that led, a bypassCache sync: the same items, another order
							if syncs%2 == 0 {
								slices.Reverse(cfg["upstreams"])
							}
						case "merged-change":
							secretToken = flip[secretToken]
						case "merged-untouched":
							variant = flip[variant]
							cfg = largeConfig(n, variant)
						case "oob-between": // an operator's hand write between two syncs (not counted)
							b.StopTimer()
							oobSecret(b, s, syncs)
							b.StartTimer()
						}
						before, reloaded := s.em.Costs().Decodes(), s.em.TotalReloads()
						res := sync1(b, c, withSecret(cfg))
						if through || scenario != "oob-between" { // straight, that sync is refused
							mustLand(b, res)
						}
						decodes += s.em.Costs().Decodes() - before
						reloads += s.em.TotalReloads() - reloaded
						syncs++
					}
					b.ReportMetric(float64(decodes)/float64(syncs), "decodes/sync")
					b.ReportMetric(float64(reloads)/float64(syncs), "reloads/sync")
				})
			}
		}
	}
}

// oobSecret registers the i-th secrets manager straight on the data plane, at the
// next secrets version, every other section kept (a versions-only PUT).
func oobSecret(b testing.TB, s *stack, i int) {
	v := s.em.SectionVersion("secrets") + 1
	body := fmt.Sprintf(`{"secrets_conf_version":%v,"secrets":[{"id":"vault/%d","uri":"http://vault:8200","prefix":"kv","token":"t"}]`, v, i)
	for _, section := range emulator.Sections {
		if section != "secrets" {
			body += fmt.Sprintf(`,"%s_conf_version":%v`, section, s.em.SectionVersion(section))
		}
	}
	adminPut(b, s.dpURL, body+"}", fmt.Sprintf("oob-%d", i))
}

// BenchmarkFallback: the 10k configuration through confshim with --fallback backfill and
// one route APISIX rejects (an unknown plugin): its first sync (the failed PUT, the
// validate calls, the corrected PUT; a newly rejected route each time) and the steady
// state (the same body again: held back before the PUT), next to the same sync with no
// bad item. Goal: steady state within 1.2x of clean.
func BenchmarkFallback(b *testing.B) {
	const n = 10000
	bad := func(cfg adcclient.Config, i int) adcclient.Config {
		cfg["routes"][i]["plugins"] = map[string]any{"nope": map[string]any{}}
		return cfg
	}
	for _, scenario := range []string{"clean", "held-first-sync", "held-steady"} {
		b.Run(scenario, func(b *testing.B) {
			s := newStack(b, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, reseed: time.Hour, adminKey: adminKey})
			c := s.client(true)
			mustLand(b, sync1(b, c, largeConfig(n, "a")))
			cfgs := []adcclient.Config{largeConfig(n, "a")}
			switch scenario {
			case "held-first-sync":
				cfgs = nil
				for i := 1; i <= 64; i++ { // a route rejected for the first time, each sync
					cfgs = append(cfgs, bad(largeConfig(n, "a"), i))
				}
			case "held-steady":
				cfgs = []adcclient.Config{bad(largeConfig(n, "a"), 1)}
			}
			mustLand(b, sync1(b, c, cfgs[0]))
			i := 0
			for b.Loop() {
				i++
				b.StopTimer()
				cfg := cfgs[i%len(cfgs)]
				t := c.NextT()
				body := c.Body(cfg, t)
				b.StartTimer()
				res, err := c.Put(context.Background(), body, t)
				if err != nil || res.Status/100 != 2 {
					b.Fatalf("%v %v", err, res)
				}
			}
		})
	}
}

// BenchmarkItemLists is issue 33's price end to end: a one-route change of the 10k
// configuration through confshim to the emulator (APISIX's decode costs), with the ids
// each sync touched and without them (the baseline, in the same process), and an
// identical sync, which compares nothing.
func BenchmarkItemLists(b *testing.B) {
	const n = 10000
	for _, scenario := range []string{"one-route", "identical"} {
		for _, skip := range []bool{true, false} {
			name := scenario + "/with-ids"
			if skip {
				name = scenario + "/without"
			}
			b.Run(name, func(b *testing.B) {
				s := newStack(b, stackOptions{reseed: time.Hour, skipItemLists: skip})
				ctx := context.Background()
				c := s.client(true)
				mustLand(b, sync1(b, c, largeConfig(n, "a")))
				mustLand(b, sync1(b, c, largeConfig(n, "a")))
				variant := "a"
				for b.Loop() {
					b.StopTimer()
					if scenario == "one-route" {
						variant = map[string]string{"a": "b", "b": "a"}[variant]
					}
					t := c.NextT()
					body := c.Body(largeConfig(n, variant), t)
					b.StartTimer()
					res, err := c.Put(ctx, body, t)
					if err != nil || res.Status/100 != 2 {
						b.Fatalf("%v %+v", err, res)
					}
				}
			})
		}
	}
}

// BenchmarkWorstFallback is the worst sync with fallback work we can make on the 40k
// configuration against the emulator with APISIX's decode costs (issue 32): an operator's
// out-of-band write just before (so the corrected PUT meets a version conflict and the
// whole sync is decided again on a fresh read), a route APISIX rejects, and the metrics
// rule renamed (rejected for what APISIX holds, landed by a second step once the workers
// applied the first, 300 ms late). Beside it, a clean one-route sync of the same
// configuration. The contract's budget is 10 s (§8.5): the worst sync's ns/op over 1e10
// is its share of it.
func BenchmarkWorstFallback(b *testing.B) {
	const n = 40000
	before := func(variant string) adcclient.Config {
		cfg := largeConfig(n, variant)
		cfg["global_rules"] = []map[string]any{{"id": "1", "plugins": map[string]any{"prometheus": map[string]any{}}}}
		return cfg
	}
	for _, scenario := range []string{"clean", "worst"} {
		b.Run(fmt.Sprintf("40k/%s", scenario), func(b *testing.B) {
			var took time.Duration
			syncs := 0
			for b.Loop() {
				b.StopTimer()
				s := newStack(b, stackOptions{fallback: true, reseed: time.Hour, adminKey: adminKey, appliedLag: 300 * time.Millisecond, timeout: time.Minute})
				c := s.client(true)
				c.HTTP.Timeout = time.Minute
				mustLand(b, sync1(b, c, before("a")))
				wait.For(b, "the workers to apply", s.em.Applied)
				cfg := before("b") // one route changed
				if scenario == "worst" {
					oobSecret(b, s, syncs)
					cfg["routes"][7]["plugins"] = map[string]any{"nope": map[string]any{}}
					cfg["global_rules"] = []map[string]any{{"id": "prometheus", "plugins": map[string]any{"prometheus": map[string]any{"prefer_name": true}}}}
				}
				t := c.NextT()
				body := c.Body(cfg, t)
				b.StartTimer()
				start := time.Now()
				res, err := c.Put(context.Background(), body, t)
				took += time.Since(start)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if scenario == "worst" && (res.Status != http.StatusBadRequest || !strings.Contains(string(res.Body), `"r7"`)) {
					b.Fatalf("the worst sync: %d %s, want the 400 naming r7", res.Status, res.Body)
				}
				if scenario == "clean" && res.Status/100 != 2 {
					b.Fatalf("the clean sync: %d %s", res.Status, res.Body)
				}
				syncs++
				b.StartTimer()
			}
			b.ReportMetric(float64(took)/float64(syncs)/float64(10*time.Second), "budget-share")
		})
	}
}
