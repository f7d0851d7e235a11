package rewrite

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func TestDecideWithoutStateDoesNotPanic(t *testing.T) {
	rw := New(DefaultPreserve)
	p, err := rw.Prepare([]byte(`{"routes_conf_version":1,"routes":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Decide(p, Input{}); err != nil && err != ErrStateIncomplete {
		t.Fatal(err)
	}
}

// manyVersionKeys is a body with n stale *_conf_version keys of unknown sections.
func manyVersionKeys(n int) ([]byte, *State) {
	var b strings.Builder
	st := &State{Versions: map[string]float64{}, Items: map[string][]byte{}, ItemsKnown: true}
	b.WriteString("{")
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"s%d_conf_version":1`, i)
		st.Versions[fmt.Sprintf("s%d", i)] = 2
	}
	b.WriteString("}")
	return []byte(b.String()), st
}

// decideTime is the best of five runs. The collector is off while a run is timed: a GC
// cycle of the 70,000-key maps landing inside one timing (on a loaded single CPU) once
// made the ratio look quadratic.
func decideTime(t *testing.T, n int) time.Duration {
	body, st := manyVersionKeys(n)
	rw := New(DefaultPreserve)
	best := time.Duration(1 << 62)
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for i := 0; i < 5; i++ {
		runtime.GC()
		start := time.Now()
		p, err := rw.Prepare(body)
		if err == nil {
			_, err = rw.Decide(p, Input{Body: body, State: st})
		}
		if err != nil {
			t.Fatal(err)
		}
		best = min(best, time.Since(start))
	}
	return best
}

// TestManyVersionKeysCostLinearTime: 70,000 *_conf_version keys once held the PUT lock
// for ~10 s (a search per section). Ten times the keys must cost about ten times the
// time, not a hundred: a ratio, so that a loaded machine does not fail it.
func TestManyVersionKeysCostLinearTime(t *testing.T) {
	small, large := decideTime(t, 7000), decideTime(t, 70000)
	ratio := float64(large) / float64(small)
	t.Logf("7,000 keys %v, 70,000 keys %v: %.1fx", small, large, ratio)
	if ratio > 30 {
		t.Fatalf("10x the keys cost %.1fx the time: not linear", ratio)
	}
}

func TestNextStorable(t *testing.T) {
	for _, tc := range []struct {
		v, want float64
		ok      bool
	}{
		{7, 8, true},
		{99999999999999, 100000000000000, true},
		{123456789012340, 123456789012350, true},
		{1e15, 1000000000000100, true},
		{9007199254740991, 0, false},
		{1e308, 0, false},
	} {
		got, ok := nextStorable(tc.v)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("nextStorable(%v) = %v %v, want %v %v", tc.v, got, ok, tc.want, tc.ok)
		}
		if ok && storable(got) != got {
			t.Errorf("%v does not survive 14 digits", got)
		}
	}
}

func TestLyamlVersionScalars(t *testing.T) {
	for _, tc := range []struct {
		raw     string
		v       float64
		present bool
		err     bool
	}{
		{"15", 15, true, false}, {"0o17", 0, false, true}, {"017", 15, true, false}, {"0x1F", 31, true, false},
		{"1:30", 90, true, false}, {"1_000", 1000, true, false}, {"1.5", 1.5, true, false}, {"1e3", 1000, true, false},
		{"y", 0, false, true}, {"n", 0, false, true}, {"no", 0, false, false}, {"off", 0, false, false},
		{"yes", 0, false, true}, {"~", 0, false, true}, {"null", 0, false, true}, {"'5'", 0, false, true},
		{`"5"`, 0, false, true}, {".inf", 0, false, true}, {"0b101", 5, true, false}, {"-3", -3, true, false},
	} {
		v, present, err := yamlVersion([]byte(tc.raw))
		if (err != nil) != tc.err || present != tc.present || (present && v != tc.v) {
			t.Errorf("%s: got %v %v %v, want %v %v err=%v", tc.raw, v, present, err, tc.v, tc.present, tc.err)
		}
	}
}
