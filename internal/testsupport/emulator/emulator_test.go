package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const key = "edd1c9f034335f136f87ad84b625c8f1"

type call struct {
	method, path, body string
	header             map[string]string
}

func newEm(t *testing.T, version string) *Emulator {
	t.Helper()
	em, err := New(Options{Version: version, AdminKey: key, ViewerKey: "viewer-key",
		Now: func() time.Time { return time.Unix(1764441600, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	return em
}

func (c call) do(t *testing.T, h http.Handler) *http.Response {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req := httptest.NewRequest(c.method, c.path, body)
	if _, ok := c.header["X-API-KEY"]; !ok {
		req.Header.Set("X-API-KEY", key)
	}
	for k, v := range c.header {
		if v == "" && k == "X-API-KEY" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func put(body, digest string) call {
	return call{method: "PUT", path: "/apisix/admin/configs", body: body, header: map[string]string{"X-Digest": digest}}
}

func putYAML(body, digest string) call {
	c := put(body, digest)
	c.header["Content-Type"] = "application/yaml"
	return c
}

var get = call{method: "GET", path: "/apisix/admin/configs"}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func expect(t *testing.T, resp *http.Response, status int, body string) {
	t.Helper()
	got := readAll(t, resp)
	if resp.StatusCode != status || (body != "*" && got != body) {
		t.Fatalf("got %d %q, want %d %q", resp.StatusCode, got, status, body)
	}
	if resp.Header.Get("Server") == "" || !strings.HasPrefix(resp.Header.Get("Server"), "APISIX/") {
		t.Fatalf("missing Server header: %v", resp.Header)
	}
}

func getDoc(t *testing.T, h http.Handler) (map[string]any, *http.Response) {
	t.Helper()
	resp := get.do(t, h)
	var doc map[string]any
	if err := json.Unmarshal([]byte(readAll(t, resp)), &doc); err != nil {
		t.Fatal(err)
	}
	return doc, resp
}

const config1 = `{"routes":[{"id":"r1","uri":"/r1","upstream":{"nodes":{"127.0.0.1:1980":1},"type":"roundrobin"},"plugins":{"proxy-rewrite":{"uri":"/hello"}}}]}`

// TestSpecNormalFlow walks the spec's §7 items 1–15 that concern the Admin API wire.
func TestSpecNormalFlow(t *testing.T) {
	t.Parallel()
	em := newEm(t, "3.17.0")

	t.Run("1 fresh GET has zero versions and no metadata headers", func(t *testing.T) {
		doc, resp := getDoc(t, em)
		if resp.StatusCode != 200 || resp.Header.Get("X-Last-Modified") != "" || resp.Header.Get("X-Digest") != "" {
			t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
		}
		if len(doc) != 13 {
			t.Fatalf("want the 13 version keys, got %v", doc)
		}
		for _, k := range []string{"routes", "ssls", "services", "upstreams", "consumers"} {
			if doc[k+"_conf_version"] != float64(0) {
				t.Fatalf("%s version %v", k, doc[k+"_conf_version"])
			}
		}
	})
	t.Run("2 fresh GET as YAML", func(t *testing.T) {
		resp := call{method: "GET", path: "/apisix/admin/configs", header: map[string]string{"Accept": "application/yaml"}}.do(t, em)
		body := readAll(t, resp)
		if resp.Header.Get("Content-Type") != "application/yaml" || !strings.Contains(body, "routes_conf_version: 0") {
			t.Fatalf("%v %q", resp.Header, body)
		}
	})
	t.Run("3 PUT config1 is 202 with metadata headers", func(t *testing.T) {
		resp := put(config1, "1").do(t, em)
		expect(t, resp, 202, "")
		if resp.Header.Get("X-Last-Modified") != "1764441600" || resp.Header.Get("X-Digest") != "1" {
			t.Fatalf("headers %v", resp.Header)
		}
	})
	t.Run("4 same digest is 204 without metadata", func(t *testing.T) {
		resp := put(config1, "1").do(t, em)
		expect(t, resp, 204, "")
		if resp.Header.Get("X-Digest") != "" {
			t.Fatal("204 must not carry X-Digest")
		}
	})
	t.Run("5 HEAD has the metadata", func(t *testing.T) {
		resp := call{method: "HEAD", path: "/apisix/admin/configs"}.do(t, em)
		expect(t, resp, 200, "")
		if resp.Header.Get("X-Last-Modified") != "1764441600" || resp.Header.Get("X-Digest") != "1" {
			t.Fatalf("headers %v", resp.Header)
		}
	})
	t.Run("6 GET returns versions 1, the routes, and the metadata keys", func(t *testing.T) {
		doc, resp := getDoc(t, em)
		if doc["routes_conf_version"] != float64(1) || doc["X-Digest"] != "1" || doc["X-Last-Modified"] != float64(1764441600) {
			t.Fatalf("doc %v", doc)
		}
		var sent map[string]any
		_ = json.Unmarshal([]byte(config1), &sent)
		gotRoutes, _ := json.Marshal(doc["routes"])
		wantRoutes, _ := json.Marshal(sent["routes"])
		if string(gotRoutes) != string(wantRoutes) || resp.Header.Get("X-Digest") != "1" {
			t.Fatalf("routes %s want %s", gotRoutes, wantRoutes)
		}
	})
	t.Run("7 GET as YAML", func(t *testing.T) {
		resp := call{method: "GET", path: "/apisix/admin/configs", header: map[string]string{"Accept": "application/yaml"}}.do(t, em)
		body := readAll(t, resp)
		if !strings.Contains(body, "routes:") || !strings.Contains(body, "id: r1") || strings.HasPrefix(body, "---") || strings.HasSuffix(body, "...\n") {
			t.Fatalf("%q", body)
		}
	})
	t.Run("YAML strings that look like other scalars are single-quoted", func(t *testing.T) {
		em := newEm(t, "3.17.0")
		expect(t, put(`{"routes":[{"id":"r1","uri":"/a","desc":"yes","name":"0755"}]}`, "q").do(t, em), 202, "")
		resp := call{method: "GET", path: "/apisix/admin/configs", header: map[string]string{"Accept": "application/yaml"}}.do(t, em)
		body := readAll(t, resp)
		for _, want := range []string{"desc: 'yes'", "name: '0755'", "uri: /a", "X-Digest: q"} {
			if !strings.Contains(body, want) {
				t.Fatalf("YAML GET %q lacks %q", body, want)
			}
		}
	})
	t.Run("9 PUT YAML config2", func(t *testing.T) {
		expect(t, putYAML("routes:\n  - id: r2\n    uri: /r2\n    upstream:\n      type: roundrobin\n      nodes:\n        \"127.0.0.1:1980\": 1\n", "2").do(t, em), 202, "")
		doc, _ := getDoc(t, em)
		if doc["routes_conf_version"] != float64(2) || doc["X-Digest"] != "2" || !strings.Contains(mustJSON(doc["routes"]), `"r2"`) {
			t.Fatalf("doc %v", doc)
		}
	})
	t.Run("11 PUT {} empties every section and bumps every version", func(t *testing.T) {
		expect(t, put(`{}`, "3").do(t, em), 202, "")
		doc, _ := getDoc(t, em)
		if _, has := doc["routes"]; has || doc["routes_conf_version"] != float64(3) || doc["plugins_conf_version"] != float64(3) {
			t.Fatalf("doc %v", doc)
		}
	})
	t.Run("12 a given version is taken, absent ones auto-increment", func(t *testing.T) {
		expect(t, putYAML("routes_conf_version: 15", "4").do(t, em), 202, "")
		doc, _ := getDoc(t, em)
		if doc["routes_conf_version"] != float64(15) || doc["ssls_conf_version"] != float64(4) {
			t.Fatalf("doc %v", doc)
		}
		expect(t, putYAML("routes_conf_version: 17", "5").do(t, em), 202, "")
		doc, _ = getDoc(t, em)
		if doc["routes_conf_version"] != float64(17) || doc["services_conf_version"] != float64(5) {
			t.Fatalf("doc %v", doc)
		}
	})
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestSpecErrors covers the spec's §7 items 16–23 and 38–44, per version where the text differs.
func TestSpecErrors(t *testing.T) {
	t.Parallel()
	uri123 := `{"routes":[{"id":"r1","uri":123}]}`
	badPlugin := `{"services":[{"id":"s1","name":"s1","plugins":{"invalid-plugin":{}}}]}`
	chash := `{"routes":[{"id":"r1","uri":"/r1","upstream":{"type":"chash","hash_on":"vars","key":"args_invalid","nodes":{"127.0.0.1:1980":1}}}]}`
	chashMsg := `invalid configuration: failed to match pattern \"^((uri|server_name|server_addr|request_uri|remote_port|remote_addr|query_string|host|hostname|mqtt_client_id)|arg_[0-9a-zA-z_-]+)$\" with \"args_invalid\"`
	cases := []struct {
		name, version string
		seed          string // a body stored first
		req           call
		status        int
		body          string
	}{
		{"16 missing digest", "3.17.0", "", call{method: "PUT", path: "/apisix/admin/configs", body: `{"routes_conf_version":100}`}, 400, `{"error_msg":"missing digest header"}` + "\n"},
		{"17 stale version", "3.17.0", `{"routes_conf_version":100}`, putYAML("routes_conf_version: -1", "b"), 400, `{"error_msg":"routes_conf_version must be greater than or equal to (100)"}` + "\n"},
		{"18 string version", "3.17.0", "", putYAML("routes_conf_version: 'adc'", "b"), 400, `{"error_msg":"routes_conf_version must be a number"}` + "\n"},
		{"18 null version", "3.17.0", "", put(`{"routes_conf_version":null}`, "b"), 400, `{"error_msg":"routes_conf_version must be a number"}` + "\n"},
		{"18 true version", "3.17.0", "", put(`{"routes_conf_version":true}`, "b"), 400, `{"error_msg":"routes_conf_version must be a number"}` + "\n"},
		{"19 broken JSON", "3.17.0", "", put(`{abcd`, "b"), 400, `{"error_msg":"invalid request body: Expected object key string but found invalid token at character 2"}` + "\n"},
		{"19 trailing garbage", "3.17.0", "", put(`{} x`, "b"), 400, `{"error_msg":"invalid request body: Expected the end but found invalid token at character 4"}` + "\n"},
		{"19 missing colon", "3.17.0", "", put(`{"a" 1}`, "b"), 400, `{"error_msg":"invalid request body: Expected colon but found T_NUMBER at character 6"}` + "\n"},
		{"20 schema error 3.17", "3.17.0", "", put(uri123, "b"), 400, `{"error_msg":"invalid configuration: property \"uri\" validation failed: wrong type: expected string, got number"}` + "\n"},
		{"20 schema error 3.14", "3.14.1", "", put(uri123, "b"), 400, `{"error_msg":"invalid routes at index 0, err: invalid configuration: property \"uri\" validation failed: wrong type: expected string, got number"}` + "\n"},
		{"20 schema error 3.13", "3.13.0", "", put(uri123, "b"), 400, `{"error_msg":"invalid routes at index 0, err: property \"uri\" validation failed: wrong type: expected string, got number"}` + "\n"},
		{"21 empty body", "3.17.0", "", put("", "b"), 400, `{"error_msg":"invalid request body: empty request body"}` + "\n"},
		{"22 unknown plugin 3.17", "3.17.0", "", put(badPlugin, "b"), 400, `{"error_msg":"unknown plugin [invalid-plugin]"}` + "\n"},
		{"22 unknown plugin 3.14", "3.14.1", "", put(badPlugin, "b"), 400, `{"error_msg":"invalid services at index 0, err: unknown plugin [invalid-plugin]"}` + "\n"},
		{"23 chash key pattern", "3.17.0", "", put(chash, "b"), 400, `{"error_msg":"` + chashMsg + `"}` + "\n"},
		{"41 stale against 1062", "3.17.0", `{"routes_conf_version":1062}`, put(`{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/r1"}]}`, "b"), 400, `{"error_msg":"routes_conf_version must be greater than or equal to (1062)"}` + "\n"},
		{"stale message uses %.14g", "3.17.0", `{"routes_conf_version":1e15}`, put(`{"routes_conf_version":1}`, "b"), 400, `{"error_msg":"routes_conf_version must be greater than or equal to (1e+15)"}` + "\n"},
		{"42 duplicate route id", "3.17.0", "", put(`{"routes_conf_version":1063,"routes":[{"id":"r1","uri":"/a"},{"id":"r1","uri":"/b"}]}`, "b"), 400, `{"error_msg":"found duplicate id r1 in routes"}` + "\n"},
		{"43 duplicate username", "3.17.0", "", put(`{"consumers":[{"username":"consumer1"},{"username":"consumer1"}]}`, "b"), 400, `{"error_msg":"found duplicate username consumer1 in consumers"}` + "\n"},
		{"44 duplicate credential", "3.17.0", "", put(`{"consumers":[{"username":"john_1"},{"id":"john_1/credentials/john-a","plugins":{"key-auth":{"key":"a"}}},{"id":"john_1/credentials/john-a","plugins":{"key-auth":{"key":"b"}}}]}`, "b"), 400, `{"error_msg":"found duplicate credential id john_1/credentials/john-a in consumers"}` + "\n"}, // core.json leaves "/" unescaped (spec §7 44)
		{"id 1 and \"1\" are not duplicates", "3.17.0", "", put(`{"routes":[{"id":1,"uri":"/a"},{"id":"1","uri":"/b"}]}`, "b"), 202, ""},
		{"secret id needs a slash", "3.17.0", "", put(`{"secrets":[{"id":"vault1","uri":"http://v"}]}`, "b"), 400, `{"error_msg":"invalid secret id: vault1"}` + "\n"},
		{"route without id is fine on 3.17", "3.17.0", "", put(`{"routes":[{"uri":"/a"}]}`, "b"), 202, ""},
		{"route without id crashes 3.14", "3.14.1", "", put(`{"routes":[{"uri":"/a"}]}`, "b"), 500, "*"},
		{"null section is a Lua error", "3.17.0", "", put(`{"routes":null}`, "b"), 500, "*"},
		{"string section is a Lua error", "3.17.0", "", put(`{"routes":"x"}`, "b"), 500, "*"},
		{"number body is a Lua error", "3.17.0", "", put(`5`, "b"), 500, "*"},
		{"null body is a Lua error", "3.17.0", "", put(`null`, "b"), 500, "*"},
		{"YAML scalar body", "3.17.0", "", putYAML("just a string", "b"), 400, `{"error_msg":"invalid request body: invalid yaml request body"}` + "\n"},
		{"YAML syntax error is a Lua error", "3.17.0", "", putYAML("routes: [", "b"), 500, "*"},
		{"NaN version cannot be encoded", "3.17.0", "", put(`{"routes_conf_version":NaN}`, "b"), 500, "failed to encode json: Cannot serialise number: must not be NaN or Infinity"},
		{"validation covers equal-version sections on 3.17", "3.17.0", `{"routes_conf_version":5}`, put(`{"routes_conf_version":5,"routes":[{"id":"r1","uri":5}]}`, "b"), 400, "*"},
		{"3.14 skips items of equal-version sections", "3.14.1", `{"routes_conf_version":5}`, put(`{"routes_conf_version":5,"routes":[{"id":"r1","uri":5}]}`, "b"), 202, ""},
		{"3.13 needs no digest", "3.13.0", "", call{method: "PUT", path: "/apisix/admin/configs", body: `{"routes_conf_version":3}`}, 202, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			em := newEm(t, tc.version)
			if tc.seed != "" {
				expect(t, put(tc.seed, "seed").do(t, em), 202, "")
			}
			expect(t, tc.req.do(t, em), tc.status, tc.body)
		})
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	em := newEm(t, "3.17.0")
	missing := `{"description":"missing apikey","error_msg":"failed to check token"}` + "\n"
	wrong := `{"description":"wrong apikey","error_msg":"failed to check token"}` + "\n"
	viewer := `{"description":"invalid method for role viewer","error_msg":"failed to check token"}` + "\n"
	cases := []struct {
		name   string
		req    call
		cookie string
		status int
		body   string
	}{
		{"no key", call{method: "GET", path: "/apisix/admin/configs", header: map[string]string{"X-API-KEY": ""}}, "", 401, missing},
		{"wrong header key", call{method: "GET", path: "/apisix/admin/configs", header: map[string]string{"X-API-KEY": "nope"}}, "", 401, wrong},
		{"query key", call{method: "GET", path: "/apisix/admin/configs?api_key=" + key, header: map[string]string{"X-API-KEY": ""}}, "", 200, "*"},
		{"wrong query key is not rescued by the header", call{method: "GET", path: "/apisix/admin/configs?api_key=nope"}, "", 401, wrong},
		{"cookie key", call{method: "GET", path: "/apisix/admin/configs", header: map[string]string{"X-API-KEY": ""}}, key, 200, "*"},
		{"viewer may GET", call{method: "GET", path: "/apisix/admin/configs", header: map[string]string{"X-API-KEY": "viewer-key"}}, "", 200, "*"},
		{"viewer may not HEAD", call{method: "HEAD", path: "/apisix/admin/configs", header: map[string]string{"X-API-KEY": "viewer-key"}}, "", 401, viewer},
		{"viewer may not PUT", call{method: "PUT", path: "/apisix/admin/configs", body: "{}", header: map[string]string{"X-API-KEY": "viewer-key", "X-Digest": "x"}}, "", 401, viewer},
		{"auth before the digest check", call{method: "PUT", path: "/apisix/admin/configs", body: "{}", header: map[string]string{"X-API-KEY": ""}}, "", 401, missing},
		{"HEAD /apisix/admin needs no key", call{method: "HEAD", path: "/apisix/admin", header: map[string]string{"X-API-KEY": ""}}, "", 200, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.req.method, tc.req.path, strings.NewReader(tc.req.body))
			req.Header.Set("X-API-KEY", key)
			for k, v := range tc.req.header {
				if v == "" {
					req.Header.Del(k)
				} else {
					req.Header.Set(k, v)
				}
			}
			if tc.cookie != "" {
				req.AddCookie(&http.Cookie{Name: "x_api_key", Value: tc.cookie})
			}
			rec := httptest.NewRecorder()
			em.ServeHTTP(rec, req)
			expect(t, rec.Result(), tc.status, tc.body)
		})
	}
}

func TestRouting(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, version, method, path string
		status                      int
	}{
		{"DELETE configs", "3.17.0", "DELETE", "/apisix/admin/configs", 404},
		{"etcd-style path", "3.17.0", "GET", "/apisix/admin/routes", 404},
		{"trailing slash", "3.17.0", "GET", "/apisix/admin/configs/", 404},
		{"PUT validate", "3.17.0", "PUT", "/apisix/admin/configs/validate", 404},
		{"merged slashes reach the handler", "3.17.0", "GET", "//apisix/admin/configs", 200},
		{"HEAD configs on 3.13", "3.13.0", "HEAD", "/apisix/admin/configs", 404},
		{"validate on 3.14", "3.14.1", "POST", "/apisix/admin/configs/validate", 404},
		{"HEAD configs on 3.14", "3.14.1", "HEAD", "/apisix/admin/configs", 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := call{method: tc.method, path: tc.path}.do(t, newEm(t, tc.version))
			expect(t, resp, tc.status, "*")
			if tc.status == 404 && resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
				t.Fatalf("404 must be nginx's HTML page, got %v", resp.Header)
			}
		})
	}
	t.Run("OPTIONS is answered by CORS", func(t *testing.T) {
		resp := call{method: "OPTIONS", path: "/anything", header: map[string]string{"X-API-KEY": ""}}.do(t, newEm(t, "3.17.0"))
		expect(t, resp, 200, "")
		if resp.Header.Get("Access-Control-Allow-Methods") != "POST, GET, PUT, OPTIONS, DELETE, PATCH" {
			t.Fatalf("%v", resp.Header)
		}
	})
}

func TestVersionRules(t *testing.T) {
	t.Parallel()
	t.Run("40 equal version keeps the stored items", func(t *testing.T) {
		em := newEm(t, "3.17.0")
		expect(t, put(`{"routes_conf_version":1060,"routes":[{"id":"r1","uri":"/r1","upstream_id":"u1"}],"upstreams_conf_version":1060,"upstreams":[{"id":"u1","type":"roundrobin","nodes":{"127.0.0.1:1980":1}}]}`, "a").do(t, em), 202, "")
		expect(t, put(`{"routes_conf_version":1062,"routes":[{"id":"r1","uri":"/r2","upstream_id":"u1"}],"upstreams_conf_version":1060,"upstreams":[{"id":"u1","type":"roundrobin","nodes":{"127.0.0.2:1980":1}}]}`, "b").do(t, em), 202, "")
		doc, _ := getDoc(t, em)
		if !strings.Contains(mustJSON(doc["upstreams"]), "127.0.0.1:1980") || !strings.Contains(mustJSON(doc["routes"]), `"/r2"`) {
			t.Fatalf("doc %v", doc)
		}
	})
	t.Run("13-15 modifiedIndex, consumers and credentials are accepted", func(t *testing.T) {
		em := newEm(t, "3.17.0")
		expect(t, put(`{"routes":[{"id":"r1","uri":"/r1","modifiedIndex":1,"plugins":{"key-auth":{}}}]}`, "a").do(t, em), 202, "")
		expect(t, put(`{"routes":[{"id":"r1","uri":"/r2","modifiedIndex":1}]}`, "b").do(t, em), 202, "")
		expect(t, put(`{"routes":[{"id":"r1","uri":"/r2","modifiedIndex":1.5}]}`, "c").do(t, em), 400, `{"error_msg":"invalid configuration: property \"modifiedIndex\" validation failed: wrong type: expected integer, got number"}`+"\n")
		expect(t, put(credentialSet, "d").do(t, em), 202, "")
		if doc, _ := getDoc(t, em); len(doc["consumers"].([]any)) != 3 {
			t.Fatalf("consumers %v", doc["consumers"])
		}
	})
	t.Run("38 twelve versions at 1000", func(t *testing.T) {
		em := newEm(t, "3.17.0")
		var parts []string
		for _, k := range Sections[:12] {
			parts = append(parts, `"`+k+`_conf_version":1000`)
		}
		expect(t, put("{"+strings.Join(parts, ",")+"}", "t2").do(t, em), 202, "")
		doc, _ := getDoc(t, em)
		for _, k := range Sections[:12] {
			if doc[k+"_conf_version"] != float64(1000) {
				t.Fatalf("%s: %v", k, doc[k+"_conf_version"])
			}
		}
		if doc["plugins_conf_version"] != float64(1) {
			t.Fatalf("absent plugins version: %v", doc["plugins_conf_version"])
		}
	})
	t.Run("floats are kept and auto-increment", func(t *testing.T) {
		em := newEm(t, "3.17.0")
		expect(t, put(`{"routes_conf_version":1.5}`, "a").do(t, em), 202, "")
		expect(t, put(`{}`, "b").do(t, em), 202, "")
		if v := em.SectionVersion("routes"); v != 2.5 {
			t.Fatalf("got %v", v)
		}
	})
	t.Run("false counts as absent", func(t *testing.T) {
		em := newEm(t, "3.17.0")
		expect(t, put(`{"routes_conf_version":7}`, "a").do(t, em), 202, "")
		expect(t, put(`{"routes_conf_version":false}`, "b").do(t, em), 202, "")
		if v := em.SectionVersion("routes"); v != 8 {
			t.Fatalf("got %v", v)
		}
	})
	t.Run("equal version 0 on a fresh instance stores nothing", func(t *testing.T) {
		em := newEm(t, "3.17.0")
		expect(t, put(`{"routes_conf_version":0,"routes":[{"id":"r1","uri":"/a"}]}`, "a").do(t, em), 202, "")
		if doc, _ := getDoc(t, em); doc["routes"] != nil {
			t.Fatalf("routes stored: %v", doc["routes"])
		}
	})
	t.Run("an object section empties it", func(t *testing.T) {
		em := newEm(t, "3.17.0")
		expect(t, put(`{"routes":[{"id":"r1","uri":"/a"}]}`, "a").do(t, em), 202, "")
		expect(t, put(`{"routes":{"r1":{"uri":"/a"}}}`, "b").do(t, em), 202, "")
		if doc, _ := getDoc(t, em); doc["routes"] != nil {
			t.Fatalf("routes kept: %v", doc["routes"])
		}
	})
	t.Run("array and string bodies behave like {}", func(t *testing.T) {
		for i, body := range []string{`[1,2]`, `"x"`} {
			em := newEm(t, "3.17.0")
			expect(t, put(`{"routes":[{"id":"r1","uri":"/a"}]}`, "a").do(t, em), 202, "")
			expect(t, put(body, "b").do(t, em), 202, "")
			if doc, _ := getDoc(t, em); doc["routes"] != nil || doc["routes_conf_version"] != float64(2) {
				t.Fatalf("case %d: %v", i, doc)
			}
		}
	})
	t.Run("a rejected PUT does not store its digest", func(t *testing.T) {
		em := newEm(t, "3.17.0")
		expect(t, put(`{"routes_conf_version":5}`, "a").do(t, em), 202, "")
		expect(t, put(`{"routes_conf_version":1}`, "b").do(t, em), 400, "*")
		expect(t, put(`{"routes_conf_version":6}`, "b").do(t, em), 202, "")
	})
	t.Run("the same digest is 204 even for a stale body", func(t *testing.T) {
		em := newEm(t, "3.17.0")
		expect(t, put(`{"routes_conf_version":5}`, "a").do(t, em), 202, "")
		expect(t, put(`{"routes_conf_version":1}`, "a").do(t, em), 204, "")
	})
	t.Run("3.13 has 11 sections and no metadata", func(t *testing.T) {
		em := newEm(t, "3.13.0")
		doc, _ := getDoc(t, em)
		if len(doc) != 11 || doc["plugins_conf_version"] != nil || doc["stream_routes_conf_version"] != nil {
			t.Fatalf("doc %v", doc)
		}
		resp := call{method: "PUT", path: "/apisix/admin/configs", body: `{"routes_conf_version":3}`}.do(t, em)
		if resp.Header.Get("X-Last-Modified") != "" {
			t.Fatal("3.13 has no metadata headers")
		}
		doc, _ = getDoc(t, em)
		if doc["X-Digest"] != nil || doc["routes_conf_version"] != float64(3) {
			t.Fatalf("doc %v", doc)
		}
	})
}

func TestGetIsNotAnEcho(t *testing.T) {
	t.Parallel()
	em := newEm(t, "3.17.0")
	expect(t, put(`{"routes":[{"uri":"/a/b","methods":[],"id":"r1","vars":[]}]}`, "a").do(t, em), 202, "")
	body := readAll(t, get.do(t, em))
	for _, want := range []string{`"methods":{}`, `"/a/b"`, `"X-Digest":"a"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("GET body %s lacks %s", body, want)
		}
	}
	if strings.HasSuffix(body, "\n") {
		t.Fatal("GET JSON has no trailing newline")
	}
}

func TestFillDefaults(t *testing.T) {
	t.Parallel()
	em, _ := New(Options{FillDefaults: true})
	expect(t, put(`{"routes":[{"id":"r1","uri":"/a"}],"upstreams":[{"id":"u1","type":"roundrobin","nodes":{"a:1":1}}]}`, "a").do(t, em), 202, "")
	doc, _ := getDoc(t, em)
	route := doc["routes"].([]any)[0].(map[string]any)
	up := doc["upstreams"].([]any)[0].(map[string]any)
	if route["status"] != float64(1) || route["priority"] != float64(0) || up["pass_host"] != "pass" || up["scheme"] != "http" || up["hash_on"] != "vars" {
		t.Fatalf("defaults not filled: %v %v", route, up)
	}
}

func TestReloadsRestartAndLastPut(t *testing.T) {
	t.Parallel()
	em := newEm(t, "3.17.0")
	expect(t, put(`{"routes_conf_version":5,"upstreams_conf_version":5}`, "a").do(t, em), 202, "")
	expect(t, put(`{"routes_conf_version":6,"upstreams_conf_version":5}`, "b").do(t, em), 202, "")
	got := em.Reloads()
	if got["routes"] != 2 || got["upstreams"] != 1 || got["secrets"] != 2 {
		t.Fatalf("reloads %v", got)
	}
	if lp := em.LastPut(); lp == nil || string(lp.Body) != `{"routes_conf_version":6,"upstreams_conf_version":5}` || lp.Header.Get("X-Digest") != "b" {
		t.Fatalf("last put %+v", lp)
	}
	em.Restart()
	doc, resp := getDoc(t, em)
	if doc["routes_conf_version"] != float64(0) || resp.Header.Get("X-Digest") != "" {
		t.Fatalf("after restart %v", doc)
	}
	expect(t, put(`{"routes_conf_version":1}`, "b").do(t, em), 202, "")
}

const credentialSet = `{"consumers":[{"username":"john_1"},{"id":"john_1/credentials/john-a","plugins":{"key-auth":{"key":"auth-a"}}},{"id":"john_1/credentials/john-b","plugins":{"key-auth":{"key":"auth-b"}}}]}`

func TestValidateEndpoint(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, version string
		req           call
		status        int
		contains      []string
	}{
		{"24 valid config", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: config1}, 200, []string{"{}\n"}},
		{"25 valid YAML", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: "routes:\n  - id: r1\n    uri: /r1\n", header: map[string]string{"Content-Type": "application/yaml"}}, 200, nil},
		{"29 duplicate ids", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"id":"r1","uri":"/a"},{"id":"r1","uri":"/b"}]}`}, 400, []string{`"error_msg":"Configuration validation failed"`, `found duplicate id r1 in routes`, `"resource_id":"r1"`, `"index":1`}},
		{"31 version type", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes_conf_version":"not_a_number"}`}, 400, []string{`routes_conf_version must be a number, got string`}},
		{"32 empty body", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate"}, 400, []string{`invalid request body: empty request body`}},
		{"33 YAML syntax", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: "invalid: yaml: [", header: map[string]string{"Content-Type": "application/yaml"}}, 400, []string{`"error_msg":"invalid request body: invalid yaml request body"`}},
		{"54 collects every error", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"id":"a","uri":1},{"id":"b","uri":2}]}`}, 400, []string{`"index":0`, `"index":1`}},
		{"3.15 keeps the prefix and answers empty", "3.15.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"id":"a","uri":1}]}`}, 400, []string{`invalid routes at index 0, err: invalid configuration`}},
		{"26 versions are not compared with the stored ones", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes_conf_version":1,"services_conf_version":1,"routes":[{"id":"r1","uri":"/a"},{"id":"r2","uri":"/b"}],"services":[{"id":"s1"}]}`}, 200, nil},
		{"27 a credential set", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: credentialSet}, 200, nil},
		{"30 unknown upstream field", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"id":"r1","uri":"/a","upstream":{"type":"roundrobin","nodes":{"a:1":1},"invalid_field":1}}]}`}, 400, []string{`"resource_type":"routes"`, `additional properties forbidden`}},
		{"34 duplicate consumers", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"consumers":[{"username":"consumer1"},{"username":"consumer1"}]}`}, 400, []string{`"resource_type":"consumers"`, `found duplicate username consumer1 in consumers`}},
		{"35 duplicate credential", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"consumers":[{"username":"john_1"},{"id":"john_1/credentials/john-a","plugins":{"key-auth":{"key":"a"}}},{"id":"john_1/credentials/john-a","plugins":{"key-auth":{"key":"b"}}}]}`}, 400, []string{`found duplicate credential id john_1/credentials/john-a in consumers`}},
		{"36 unknown plugin", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"id":"r1","uri":"/a","plugins":{"invalid-plugin":{}}}]}`}, 400, []string{`"resource_type":"routes"`, `unknown plugin [invalid-plugin]`}},
		{"37 chash key pattern", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"id":"r1","uri":"/a","upstream":{"type":"chash","hash_on":"vars","key":"args_invalid","nodes":{"a:1":1}}}]}`}, 400, []string{`failed to match pattern`}},
		{"51 one error with resource_id and index", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"id":"r1","uri":123}]}`}, 400, []string{`"resource_id":"r1"`, `"index":0`, `"resource_type":"routes"`}},
		{"53 cors credentials with a wildcard", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"id":"r1","uri":"/a","plugins":{"cors":{"allow_credential":true,"allow_origins":"*"}}}]}`}, 400, []string{`allow_credential`, `"resource_id":"r1"`}},
		{"56 limit-count count -1", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"id":"r1","uri":"/a","plugins":{"limit-count":{"count":-1,"time_window":60}}}]}`}, 400, []string{`limit-count`}},
		{"57 chash without key", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"upstreams":[{"id":"ups-1","type":"chash","hash_on":"vars","nodes":{"a:1":1}}]}`}, 400, []string{`"resource_type":"upstreams"`, `"resource_id":"ups-1"`, `missing key`}},
		{"58 items without ids", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"uri":"/a"},{"uri":"/b"}],"services":[{"name":"s"}]}`}, 200, nil},
		{"60 only the invalid section reports", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"routes":[{"id":"r1","uri":"/a"}],"upstreams":[{"id":"ups-bad","type":"nope","nodes":{"a:1":1}}]}`}, 400, []string{`"resource_id":"ups-bad"`, `"resource_type":"upstreams"`}},
		{"size cap on 3.17", "3.17.0", call{method: "POST", path: "/apisix/admin/configs/validate", body: `{"x":"` + strings.Repeat("a", maxValidateBody) + `"}`}, 400, []string{`is greater than the maximum size 1572864 allowed`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			em := newEm(t, tc.version)
			resp := tc.req.do(t, em)
			body := readAll(t, resp)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d body %s", resp.StatusCode, body)
			}
			for _, want := range tc.contains {
				if !strings.Contains(body, want) {
					t.Fatalf("body %s lacks %s", body, want)
				}
			}
			if doc, _ := getDoc(t, em); doc["routes"] != nil {
				t.Fatal("28: validate must not store anything")
			}
		})
	}
}

// TestYAML11Semantics: the body as lyaml reads it (contract §5.6, APISIX spec §10).
func TestYAML11Semantics(t *testing.T) {
	t.Parallel()
	v, err := decodeYAML([]byte("a: yes\nb: off\nc: 0755\nd: 'yes'\ne: y\nf: n\ng: 0o17\nh: 1:30\ni: 1e3\nj: 0x1F\nk: 1_000\nl: ~\n---\nsecond: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	doc := v.(table)
	want := table{"a": true, "b": false, "c": float64(493), "d": "yes", "e": "y", "f": "n", "g": "0o17", "h": float64(90), "i": float64(1000), "j": float64(31), "k": float64(1000), "l": yamlNull{}}
	for k, w := range want {
		if doc[k] != w {
			t.Errorf("%s: got %#v, want %#v", k, doc[k], w)
		}
	}
	if doc["second"] != nil {
		t.Fatal("only the first document counts")
	}
	// merge keys: explicit keys win over merged ones, earlier maps over later ones
	v, err = decodeYAML([]byte("base: &b {plugins: {key-auth: {}}, uri: /base}\nother: &o {uri: /other, name: o}\nroute:\n  <<: [*b, *o]\n  uri: /admin\n"))
	if err != nil {
		t.Fatal(err)
	}
	route := v.(table)["route"].(table)
	if route["uri"] != "/admin" || route["name"] != "o" || route["plugins"] == nil {
		t.Fatalf("merged route %v", route)
	}
	for _, empty := range []string{"", "~", "# only a comment\n"} {
		if v, err := decodeYAML([]byte(empty)); err != nil || fmt.Sprint(v) != "map[]" {
			t.Fatalf("%q reads as %v %v, want an empty table", empty, v, err)
		}
	}
	if _, err := decodeYAML([]byte("a: 1\n---\nb: [\n")); !errors.Is(err, errLua) {
		t.Fatal("every document must parse")
	}
}

// TestStateDependentChecks: §4.1.3, checks against what the data plane has applied.
func TestStateDependentChecks(t *testing.T) {
	t.Parallel()
	globalA := `{"global_rules":[{"id":"a","plugins":{"prometheus":{}}}]}`
	cases := []struct {
		name, version, seed, req string
		status                   int
		body                     string
	}{
		{"3.17 global rule plugin moved to another id", "3.17.0", globalA, `{"global_rules":[{"id":"b","plugins":{"prometheus":{}}}]}`, 400, `{"error_msg":"plugin 'prometheus' already exists in global rule with id 'a'"}` + "\n"},
		{"3.17 same global rule id is fine", "3.17.0", globalA, `{"global_rules":[{"id":"a","plugins":{"prometheus":{"prefer_name":true}}}]}`, 202, ""},
		{"3.14 has no such check", "3.14.1", globalA, `{"global_rules":[{"id":"b","plugins":{"prometheus":{}}}]}`, 202, ""},
		{"3.18 consumer key owned by another consumer", "3.18.0", `{"consumers":[{"username":"jack","plugins":{"key-auth":{"key":"k"}}}]}`, `{"consumers":[{"username":"john","plugins":{"key-auth":{"key":"k"}}}]}`, 400, `{"error_msg":"duplicate key of plugin key-auth found with consumer: jack"}` + "\n"},
		{"3.18 consumer key owned by a credential", "3.18.0", `{"consumers":[{"username":"jack"},{"id":"jack/credentials/c1","plugins":{"key-auth":{"key":"k2"}}}]}`, `{"consumers":[{"username":"john","plugins":{"key-auth":{"key":"k2"}}}]}`, 400, `{"error_msg":"duplicate key of plugin key-auth found with credential: jack/credentials/c1 of consumer: jack"}` + "\n"},
		{"3.18 a key pair accepted once refuses the consumer loaded earlier", "3.18.0", `{"consumers":[{"username":"team-a","plugins":{"key-auth":{"key":"k"}}},{"username":"team-b","plugins":{"key-auth":{"key":"k"}}}]}`, `{"consumers":[{"username":"team-a","desc":"x","plugins":{"key-auth":{"key":"k"}}},{"username":"team-b","plugins":{"key-auth":{"key":"k"}}}]}`, 400, `{"error_msg":"duplicate key of plugin key-auth found with consumer: team-b"}` + "\n"},
		{"3.18 a key pair: the later consumer alone passes", "3.18.0", `{"consumers":[{"username":"team-a","plugins":{"key-auth":{"key":"k"}}},{"username":"team-b","plugins":{"key-auth":{"key":"k"}}}]}`, `{"consumers":[{"username":"team-b","desc":"x","plugins":{"key-auth":{"key":"k"}}}]}`, 202, ""},
		{"3.18 the same consumer keeps its key", "3.18.0", `{"consumers":[{"username":"jack","plugins":{"key-auth":{"key":"k"}}}]}`, `{"consumers":[{"username":"jack","desc":"x","plugins":{"key-auth":{"key":"k"}}}]}`, 202, ""},
		{"3.17 has no consumer check", "3.17.0", `{"consumers":[{"username":"jack","plugins":{"key-auth":{"key":"k"}}}]}`, `{"consumers":[{"username":"john","plugins":{"key-auth":{"key":"k"}}}]}`, 202, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			em := newEm(t, tc.version)
			expect(t, put(tc.seed, "seed").do(t, em), 202, "")
			expect(t, put(tc.req, "req").do(t, em), tc.status, tc.body)
		})
	}
}

// TestReloadsFollowTheStoredVersion: APISIX keeps 14 significant digits, so a version
// that rounds to the stored one changes nothing a worker can see (no reload).
func TestReloadsFollowTheStoredVersion(t *testing.T) {
	t.Parallel()
	em := newEm(t, "3.17.0")
	expect(t, put(`{"routes_conf_version":123456789012340,"routes":[{"id":"r1","uri":"/a"}]}`, "a").do(t, em), 202, "")
	before := em.Reloads()["routes"]
	expect(t, put(`{"routes_conf_version":123456789012341,"routes":[{"id":"r1","uri":"/b"}]}`, "b").do(t, em), 202, "")
	if got := em.Reloads()["routes"]; got != before {
		t.Fatalf("a version stored as the same 14 digits counted a reload (%d → %d)", before, got)
	}
	if v := em.SectionVersion("routes"); v != 123456789012340 {
		t.Fatalf("stored %v", v)
	}
	expect(t, put(`{"routes_conf_version":123456789012350,"routes":[{"id":"r1","uri":"/b"}]}`, "c").do(t, em), 202, "")
	if got := em.Reloads()["routes"]; got != before+1 {
		t.Fatalf("a version that survives 14 digits must reload (%d → %d)", before, got)
	}
}

// TestCosts: what a PUT makes APISIX do (validation is version-gated, §2.1).
func TestCosts(t *testing.T) {
	t.Parallel()
	body := `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"},{"id":"r2","uri":"/b"}],"upstreams_conf_version":1,"upstreams":[{"id":"u1","type":"roundrobin","nodes":{"127.0.0.1:80":1}}]}`
	again := `{"routes_conf_version":2,"routes":[{"id":"r1","uri":"/a"},{"id":"r2","uri":"/b"}],"upstreams_conf_version":1,"upstreams":[{"id":"u1","type":"roundrobin","nodes":{"127.0.0.1:80":1}}]}`
	for _, tc := range []struct {
		version       string
		wantValidated int // for the second PUT: 3.15+ validates sections kept at their version too
	}{{"3.17.0", 3}, {"3.15.0", 3}, {"3.14.1", 2}, {"3.13.0", 2}} {
		em := newEm(t, tc.version)
		expect(t, put(body, "a").do(t, em), 202, "")
		c := em.Costs()
		expect(t, put(again, "b").do(t, em), 202, "")
		if got := em.Costs().ItemsValidated - c.ItemsValidated; got != tc.wantValidated {
			t.Fatalf("%s: validated %d items, want %d", tc.version, got, tc.wantValidated)
		}
		if got := em.Costs().BytesParsed - c.BytesParsed; got != len(again) {
			t.Fatalf("%s: parsed %d bytes", tc.version, got)
		}
		if tc.version != "3.13.0" {
			expect(t, put(body, "b").do(t, em), 204, "") // the stored digest
			if got := em.Costs(); got.NoContent != 1 || got.Accepted != 2 {
				t.Fatalf("%s: costs %+v", tc.version, got)
			}
		}
	}
}

// TestCredentialSpellings: the key as APISIX 3.17 reads it (spec §10).
func TestCredentialSpellings(t *testing.T) {
	t.Parallel()
	em := newEm(t, "3.17.0")
	for _, tc := range []struct {
		name   string
		path   string
		header map[string]string
		status int
	}{
		{"X_API_KEY", "/apisix/admin/configs", map[string]string{"X_API_KEY": key}, 200},
		{"X-Api_Key", "/apisix/admin/configs", map[string]string{"X-Api_Key": key}, 200},
		{"spaces trimmed", "/apisix/admin/configs", map[string]string{"X-API-KEY": " " + key + " "}, 200},
		{"the last of two cookies", "/apisix/admin/configs", map[string]string{"Cookie": "x_api_key=nope; x_api_key=" + key}, 200},
		{"the first of two cookies is not it", "/apisix/admin/configs", map[string]string{"Cookie": "x_api_key=" + key + "; x_api_key=nope"}, 401},
		{"?API_KEY= is not a key", "/apisix/admin/configs?API_KEY=" + key, nil, 401},
		{"cookie X_API_KEY is not a key", "/apisix/admin/configs", map[string]string{"Cookie": "X_API_KEY=" + key}, 401},
		{"the first api_key argument", "/apisix/admin/configs?api_key=" + key + "&api_key=nope", nil, 200},
	} {
		req := httptest.NewRequest("GET", tc.path, nil)
		for k, v := range tc.header {
			req.Header[k] = []string{v}
		}
		rec := httptest.NewRecorder()
		em.ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Errorf("%s: %d, want %d", tc.name, rec.Code, tc.status)
		}
	}
}

// TestDecodeCounts: every GET, HEAD and PUT of /configs decodes the stored document
// (once something is stored); HEAD /apisix/admin and validate never do (spec §11).
func TestDecodeCounts(t *testing.T) {
	t.Parallel()
	em := newEm(t, "3.17.0")
	head := call{method: "HEAD", path: "/apisix/admin/configs"}
	ping := call{method: "HEAD", path: "/apisix/admin"}
	validate := call{method: "POST", path: "/apisix/admin/configs/validate", body: "{}"}
	expect(t, head.do(t, em), 200, "")
	expect(t, get.do(t, em), 200, "*")
	if got := em.Costs().Decodes(); got != 0 {
		t.Fatalf("an empty data plane decoded %d times", got)
	}
	expect(t, put(`{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"}]}`, "a").do(t, em), 202, "")
	for _, c := range []call{head, head, get, ping, ping, validate, put(`{"routes_conf_version":1}`, "a")} {
		c.do(t, em).Body.Close()
	}
	got := em.Costs()
	if got.DecodesHEAD != 2 || got.DecodesGET != 1 || got.DecodesPUT != 1 || got.Pings != 2 || got.Validates != 1 {
		t.Fatalf("costs %+v: want 2 HEAD, 1 GET, 1 PUT decode (the 204), 2 pings, 1 validate", got)
	}
	expect(t, put(`{"routes_conf_version":9,"routes":[{"id":"r1","uri":123}]}`, "b").do(t, em), 400, "*")
	if got := em.Costs().Rejected; got != 1 {
		t.Fatalf("rejected PUTs = %d, want 1", got)
	}
	em.Restart()
	expect(t, head.do(t, em), 200, "")
	if em.Costs().DecodesHEAD != 2 {
		t.Fatal("a restarted, empty data plane has nothing to decode")
	}
}

// TestAfter318WaitAndShape: the 3.19 profile (§13): ?wait answers 200 once the workers
// applied the PUT within the wait, else 202; without wait, or before 3.19, 202; an
// unchanged digest stays 204; a section that is not an array or an item that is not an
// object is refused and nothing changes.
func TestAfter318WaitAndShape(t *testing.T) {
	t.Parallel()
	waitPut := func(body, digest, wait string) call {
		c := put(body, digest)
		c.path += "?wait=" + wait
		return c
	}
	em := newEm(t, "3.19.0")
	expect(t, waitPut(config1, "d1", "3000").do(t, em), http.StatusOK, "")
	expect(t, waitPut(config1, "d1", "3000").do(t, em), http.StatusNoContent, "")
	expect(t, put(`{"routes":[]}`, "d2").do(t, em), http.StatusAccepted, "")
	lagged, _ := New(Options{Version: "3.19.0", AdminKey: key, AppliedLag: 200 * time.Millisecond})
	expect(t, waitPut(config1, "d1", "50").do(t, lagged), http.StatusAccepted, "")
	expect(t, waitPut(config1, "d2", "soon").do(t, lagged), http.StatusAccepted, "") // not an integer: 0
	if em.WaitPuts() != 2 || lagged.WaitPuts() != 2 {
		t.Fatalf("wait PUTs counted %d and %d", em.WaitPuts(), lagged.WaitPuts())
	}
	old := newEm(t, "3.18.0")
	expect(t, waitPut(config1, "d1", "3000").do(t, old), http.StatusAccepted, "")
	expect(t, put(`{"routes":{}}`, "d3").do(t, old), http.StatusAccepted, "") // 3.18 takes {} as an empty table
	for body, msg := range map[string]string{
		`{"routes":{}}`:      "routes must be an array",
		`{"routes":[1]}`:     "routes[0] must be an object",
		`["routes"]`:         "the top level must be an object",
		`{"secrets":"none"}`: "secrets must be an array",
	} {
		resp := put(body, "shape").do(t, em)
		if got := readAll(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, msg) {
			t.Fatalf("%s: %d %s, want 400 naming %q", body, resp.StatusCode, got, msg)
		}
	}
	if doc, _ := getDoc(t, em); doc["routes_conf_version"] == nil {
		t.Fatal("a refused shape changed the stored document")
	}
}

// TestDictSize: a document larger than the standalone-config dict is decoded and
// validated, then refused with APISIX's plain-text 500; the dict then holds nothing (the
// entry it replaced was freed before the allocation failed), so GET shows an empty data
// plane (spec §2 step 9, §11; lua-nginx-module's shdict store).
func TestDictSize(t *testing.T) {
	t.Parallel()
	em, err := New(Options{Version: "3.17.0", AdminKey: key, DictSize: 2048, Now: func() time.Time { return time.Unix(1764441600, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, put(config1, "small").do(t, em), 202, "")
	var routes []string
	for i := range 40 {
		routes = append(routes, fmt.Sprintf(`{"id":"r%d","uri":"/r%d","upstream":{"nodes":{"127.0.0.1:1980":1},"type":"roundrobin"}}`, i, i))
	}
	big := `{"routes_conf_version":2,"routes":[` + strings.Join(routes, ",") + `]}`
	resp := put(big, "big").do(t, em)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want the Admin API's application/json (spec §1.2) over a text body", ct)
	}
	if resp.Header.Get("X-Digest") != "" || resp.Header.Get("X-Last-Modified") != "" {
		t.Errorf("a refused PUT carries the stored document's headers: %v", resp.Header)
	}
	expect(t, resp, 500, "failed to save config to shared dict: no memory")
	if em.StoredBytes() != 0 || em.Document() != nil {
		t.Fatalf("stored %d bytes after the refusal, want the dict emptied", em.StoredBytes())
	}
	doc, resp := getDoc(t, em)
	if resp.Header.Get("X-Digest") != "" || resp.Header.Get("X-Last-Modified") != "" || doc["routes_conf_version"] != float64(0) {
		t.Fatalf("after the refusal: digest %q, doc %v, want an empty data plane", resp.Header.Get("X-Digest"), doc)
	}
	if c := em.Costs(); c.Rejected != 1 || c.ItemsValidated < 41 {
		t.Fatalf("costs %+v: the refused document was not validated, or not counted rejected", c)
	}
	if got := em.applied(); got == nil || len(got["routes"].([]any)) != 1 {
		t.Fatalf("the workers hold %v, want what they applied before the refusal", got)
	}
	expect(t, put(config1, "again").do(t, em), 202, "") // a document that fits is stored again
	em2, _ := New(Options{Version: "3.17.0", AdminKey: key, Now: func() time.Time { return time.Unix(1764441600, 0) }})
	expect(t, put(big, "big").do(t, em2), 202, "") // the default 10m takes it
}
