package reseed

import (
	"math"
	"testing"
	"time"
)

// TestLookIntervalFollowsTheCost: the watch's looks cost APISIX at most 0.5 % of a
// worker in every minute (planned at 0.4 %: a 40k-route configuration stays at one look
// a minute), bounded by --reseed-interval below and the minute above (contract §8.4);
// the costs are spec §11's decode times.
func TestLookIntervalFollowsTheCost(t *testing.T) {
	t.Parallel()
	w := New(Config{Interval: time.Second})
	for _, tc := range []struct {
		name string
		cost time.Duration
		want time.Duration
	}{
		{"a few hundred routes", time.Millisecond, time.Second},
		{"not known yet", 0, time.Second},
		{"10k routes (66 ms): 3 a minute", 66 * time.Millisecond, 20 * time.Second},
		{"6 MB (150 ms): one a minute, not two in 75 s", 150 * time.Millisecond, time.Minute},
		{"40k routes (240 ms)", 240 * time.Millisecond, time.Minute},
		{"40k routes (276 ms)", 276 * time.Millisecond, time.Minute},
		{"40k routes (342 ms)", 342 * time.Millisecond, time.Minute},
	} {
		if got := w.lookInterval(tc.cost); got != tc.want {
			t.Errorf("%s: look every %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLookIntervalKeepsEveryMinuteInBudget: looks spaced by lookInterval put at most
// ceil(minute / interval) of them into any minute; for every cost the budget can hold
// at all (a look of up to 0.3 s), they cost at most 0.5 % of it.
func TestLookIntervalKeepsEveryMinuteInBudget(t *testing.T) {
	t.Parallel()
	w := New(Config{Interval: time.Second})
	for cost := 100 * time.Microsecond; cost <= 300*time.Millisecond; cost += 100 * time.Microsecond {
		iv := w.lookInterval(cost)
		perMinute := math.Ceil(float64(time.Minute) / float64(iv))
		if spent := perMinute * float64(cost); spent > 0.005*float64(time.Minute) {
			t.Fatalf("looks of %v every %v: %.0f in a minute cost %v, over 0.5 %%", cost, iv, perMinute, time.Duration(spent))
		}
	}
}
