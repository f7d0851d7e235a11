package integration

import (
	"context"
	"net/http"
	"testing"

	"github.com/confshim/confshim/integration/adcclient"
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
