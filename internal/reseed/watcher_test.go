package reseed

import (
	"testing"
	"time"
)

// TestLookIntervalFollowsTheCost: the watch's looks cost APISIX at most 0.5 % of a
// worker (0.4 %: a 40k-route configuration stays at one look a minute), bounded by --reseed-interval below and the minute above (contract §8.4); the
// costs are spec §11's decode times.
func TestLookIntervalFollowsTheCost(t *testing.T) {
	w := New(Config{Interval: time.Second})
	for _, tc := range []struct {
		name string
		cost time.Duration
		want time.Duration
	}{
		{"a few hundred routes", time.Millisecond, time.Second},
		{"not measured yet", 0, time.Second},
		{"10k routes (66 ms)", 66 * time.Millisecond, 16500 * time.Millisecond},
		{"40k routes (240 ms)", 240 * time.Millisecond, time.Minute},
		{"40k routes (276 ms)", 276 * time.Millisecond, time.Minute},
		{"40k routes (342 ms)", 342 * time.Millisecond, time.Minute},
	} {
		if got := w.LookInterval(tc.cost); got != tc.want {
			t.Errorf("%s: look every %v, want %v", tc.name, got, tc.want)
		}
	}
}
