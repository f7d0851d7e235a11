package metrics

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/confshim/confshim/internal/sections"
	"github.com/confshim/confshim/rewrite"
)

func TestLabelsAreBounded(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, section, method string }{
		{"routes", "routes", "GET"},
		{"stream_routes", "stream_routes", "PURGE"},
		{"widgets", "other", "BREW"},
		{"", "other", ""},
	}
	for _, tc := range cases {
		if got := SectionLabel(tc.in); got != tc.section {
			t.Errorf("SectionLabel(%q) = %q, want %q", tc.in, got, tc.section)
		}
	}
	if MethodLabel("GET") != "GET" || MethodLabel("PURGE") != "other" || MethodLabel("") != "other" {
		t.Error("unknown methods must collapse to other")
	}
}

// TestSectionLabelsAreTheTables: every section of APISIX's table is a label value of
// its own, in the table's order (a section APISIX grows is one entry there).
func TestSectionLabelsAreTheTables(t *testing.T) {
	t.Parallel()
	table := sections.APISIX()
	if !slices.Equal(SectionLabels(), table.Names()) {
		t.Fatalf("SectionLabels %v, the table %v", SectionLabels(), table.Names())
	}
	for _, s := range table {
		if got := SectionLabel(s.Name); got != s.Name {
			t.Errorf("SectionLabel(%q) = %q", s.Name, got)
		}
	}
}

func TestNewRegistersEverything(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg, "v1.2.3")
	m.ConflictRetries.Inc()
	n, err := testutil.GatherAndCount(reg,
		"confshim_build_info", "confshim_conflict_retries_total", "confshim_upstream_errors_total",
		"go_goroutines", "process_open_fds")
	if err != nil {
		t.Fatal(err)
	}
	// build info 1 + retries 1 + upstream error kinds 5 + go 1 + process 1
	if n != 9 {
		t.Fatalf("got %d series", n)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("registering twice on one registry must fail: collectors are never global")
		}
	}()
	New(reg, "again")
}

// TestLabelsFollowTheRewrite: the label values metrics pre-creates are the rewrite's
// sections and words, in its order.
func TestLabelsFollowTheRewrite(t *testing.T) {
	t.Parallel()
	if !slices.Equal(SectionLabels(), rewrite.KnownSections) {
		t.Fatalf("SectionLabels %v, rewrite.KnownSections %v", SectionLabels(), rewrite.KnownSections)
	}
	var actions []string
	for _, a := range rewrite.AllActions {
		actions = append(actions, string(a))
	}
	if !slices.Equal(actionLabels, actions) {
		t.Fatalf("ActionLabels %v, rewrite.AllActions %v", actionLabels, actions)
	}
}
