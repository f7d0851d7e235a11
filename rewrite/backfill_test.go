package rewrite

import (
	"testing"

	"github.com/valyala/fastjson"
)

// TestBackfillSplice: held items are replaced or left out inside their section, set
// versions change, and every other byte is the client's.
func TestBackfillSplice(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
		splice           func(*Splice)
	}{
		{"replace one, leave one out",
			`{"routes_conf_version":5, "routes":[{"id":"r1","uri":"/a"}, {"id":"r2","plugins":{"nope":{}}} ,{"id":"r3"}],"services":[{"id":"s1"}]}`,
			`{"routes_conf_version":5, "routes":[{"id":"r1","uri":"/a"},{"id":"r2","uri":"/old"}],"services":[{"id":"s1"}]}`,
			func(s *Splice) { s.Hold("routes", 1, []byte(`{"id":"r2","uri":"/old"}`)); s.Hold("routes", 2, nil) }},
		{"the first left out, a version set",
			`{"routes":[{"id":"bad"},{"id":"r1"}],"routes_conf_version":5}`,
			`{"routes":[{"id":"r1"}],"routes_conf_version":6}`,
			func(s *Splice) { s.Hold("routes", 0, nil); s.Versions = map[string]float64{"routes": 6} }},
		{"every item left out",
			`{"routes":[{"id":"bad"}],"routes_conf_version":5}`,
			`{"routes":[],"routes_conf_version":5}`,
			func(s *Splice) { s.Hold("routes", 0, nil) }},
		{"escaped strings with brackets and commas stay whole",
			`{"routes":[{"id":"r1","desc":"a],[\"b"},{"id":"r2"}]}`,
			`{"routes":[{"id":"r1","desc":"a],[\"b"}]}`,
			func(s *Splice) { s.Hold("routes", 1, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Splice
			tc.splice(&s)
			got, err := s.Apply([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if err := fastjson.ValidateBytes(got); err != nil {
				t.Fatalf("not JSON: %v", err)
			}
		})
	}
}

func TestReferences(t *testing.T) {
	refs := References([]byte(`{"id":"r1","service_id":"s1","upstream_id":7,"plugin_config_id":"","labels":{"service_id":"x"}}`))
	if len(refs) != 2 || refs[0] != (Reference{"services", "s1"}) || refs[1] != (Reference{"upstreams", "7"}) {
		t.Fatalf("%v", refs)
	}
}
