package rewrite

import (
	"testing"

	"github.com/confshim/confshim/internal/sections"
)

func TestContentSum(t *testing.T) {
	t.Parallel()
	rw := New(nil)
	base := `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a","modifiedIndex":1},{"id":"r2","uri":"/b"}],"upstreams":[{"id":"u1","nodes":{"a:80":1}}],"upstreams_conf_version":4}`
	cases := []struct {
		name string
		body string
		same bool
	}{
		{"versions stamped afresh", `{"routes_conf_version":1796185322734,"routes":[{"id":"r1","uri":"/a","modifiedIndex":1},{"id":"r2","uri":"/b"}],"upstreams":[{"id":"u1","nodes":{"a:80":1}}],"upstreams_conf_version":1796185322735}`, true},
		{"modifiedIndex re-stamped", `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a","modifiedIndex":99},{"id":"r2","uri":"/b","modifiedIndex":7}],"upstreams":[{"id":"u1","nodes":{"a:80":1}}],"upstreams_conf_version":4}`, true},
		{"members and keys reordered, spaces", `{ "upstreams":[{"nodes":{"a:80":1},"id":"u1"}], "routes":[{"uri":"/a","id":"r1"},{"id":"r2","uri":"/b"}], "routes_conf_version":1}`, true},
		{"a version dropped", `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"},{"id":"r2","uri":"/b"}],"upstreams":[{"id":"u1","nodes":{"a:80":1}}]}`, true},
		{"an item changed", `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/c"},{"id":"r2","uri":"/b"}],"upstreams":[{"id":"u1","nodes":{"a:80":1}}],"upstreams_conf_version":4}`, false},
		{"an item removed", `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"}],"upstreams":[{"id":"u1","nodes":{"a:80":1}}],"upstreams_conf_version":4}`, false},
		{"a section removed", `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"},{"id":"r2","uri":"/b"}],"upstreams_conf_version":4}`, false},
		{"a section added", `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"},{"id":"r2","uri":"/b"}],"upstreams":[{"id":"u1","nodes":{"a:80":1}}],"services":[{"id":"s1"}],"upstreams_conf_version":4}`, false},
		{"routes keep their order", `{"routes_conf_version":1,"routes":[{"id":"r2","uri":"/b"},{"id":"r1","uri":"/a"}],"upstreams":[{"id":"u1","nodes":{"a:80":1}}],"upstreams_conf_version":4}`, routesOrderFree()},
	}
	want := contentSum(t, rw, base)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := contentSum(t, rw, c.body); (got == want) != c.same {
				t.Fatalf("same content = %v, want %v", got == want, c.same)
			}
		})
	}
}

func routesOrderFree() bool { return orderFree(sections.APISIX(), "routes") }

func contentSum(t *testing.T, rw *Rewriter, body string) uint64 {
	t.Helper()
	p, err := rw.Prepare([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return rw.ContentSum(p)
}
