//go:build load

// A load run (make load): 8 concurrent ADC-like clients PUT the 1k fixture for a
// bounded time against each target on loopback, and the run reports throughput and
// p50/p99 latency. Loopback only; every loop is bounded in time and count.

package integration

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/fixture"
)

func TestLoad(t *testing.T) {
	duration := 30 * time.Second
	if d, err := time.ParseDuration(os.Getenv("LOAD_DURATION")); err == nil {
		duration = d
	}
	const clients, maxRequests = 8, 200000
	p := fixture.Stale(1000)
	direct, bare, cs := endpoints(t, p.State)
	digest := sha1Hex(p.Request)
	results := map[string][]time.Duration{}
	for _, ep := range []endpoint{direct, bare, cs} {
		var mu sync.Mutex
		var lat []time.Duration
		var failures int
		deadline := time.Now().Add(duration)
		var wg sync.WaitGroup
		for c := 0; c < clients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < maxRequests/clients && time.Now().Before(deadline); i++ {
					start := time.Now()
					_, err := putOnce(t, ep.url, p.Request, digest)
					d := time.Since(start)
					mu.Lock()
					if err != nil {
						failures++
					} else {
						lat = append(lat, d)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if failures > 0 {
			t.Errorf("%s: %d requests failed", ep.name, failures)
		}
		slices.Sort(lat)
		results[ep.name] = lat
		pct := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
		fmt.Printf("load %-10s clients=%d duration=%s requests=%d throughput=%.1f/s p50=%s p99=%s\n",
			ep.name, clients, duration, len(lat), float64(len(lat))/duration.Seconds(),
			pct(0.50).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond))
	}
	p99 := func(name string) time.Duration { l := results[name]; return l[int(0.99*float64(len(l)-1))] }
	fmt.Printf("load confshim p99 / bareproxy p99 = %.2f\n", float64(p99("confshim"))/float64(p99("bareproxy")))
}
