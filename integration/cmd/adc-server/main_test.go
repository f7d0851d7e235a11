package main

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/emulator"
)

// syncBody is deploy/compose/README.md's sync, for server.
func syncBody(server, token string) string {
	return `{"task": {"opts": {"backend": "apisix-standalone", "server": ["` + server + `"],
	  "token": "` + token + `", "cacheKey": "demo"},
	  "config": {"services": [{"name": "httpbin", "upstream": {"nodes": [{"host": "httpbin.org", "port": 80, "weight": 1}]},
	    "routes": [{"name": "get", "uris": ["/get"]}]}]}}}`
}

func put(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// The README's sync lands on the data plane as a service with its upstream and a route
// pointing at it; after an operator's PUT behind ADC (no confshim in between) the next
// sync carries stale versions and fails as ADC's would: 202 all_failed, APISIX's
// rejection relayed as the server's reason and response.
func TestSyncAsADC(t *testing.T) {
	em, err := emulator.New(emulator.Options{Version: "3.17.0", AdminKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	apisix := httptest.NewServer(em)
	defer apisix.Close()
	s := &server{clients: map[string]*adcclient.Client{}, logger: log.New(io.Discard, "", 0)}
	adc := httptest.NewServer(http.HandlerFunc(s.sync))
	defer adc.Close()

	code, out := put(t, adc.URL, syncBody(apisix.URL, "k"))
	if code != http.StatusAccepted || out["status"] != "success" || out["success_count"] != 1.0 {
		t.Fatalf("first sync: %d %v", code, out)
	}
	resp, err := http.Get(apisix.URL + "/apisix/admin/configs?api_key=k")
	if err != nil {
		t.Fatal(err)
	}
	var stored struct {
		Services []map[string]any `json:"services"`
		Routes   []map[string]any `json:"routes"`
	}
	err = json.NewDecoder(resp.Body).Decode(&stored)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(stored.Services) != 1 || len(stored.Routes) != 1 || stored.Routes[0]["service_id"] != stored.Services[0]["id"] ||
		stored.Services[0]["upstream"] == nil {
		t.Fatalf("stored %+v", stored)
	}

	req, _ := http.NewRequest(http.MethodPut, apisix.URL+"/apisix/admin/configs",
		strings.NewReader(`{"secrets_conf_version":1,"secrets":[{"id":"vault/1","uri":"http://vault:8200","prefix":"kv","token":"t"}]}`))
	req.Header.Set("X-API-KEY", "k")
	req.Header.Set("X-Digest", "operator-1")
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("operator's PUT: %v %v", resp, err)
	}
	resp.Body.Close()
	code, out = put(t, adc.URL, syncBody(apisix.URL, "k"))
	status := out["endpoint_status"].([]any)[0].(map[string]any)
	if code != http.StatusAccepted || out["status"] != "all_failed" || status["success"] != false ||
		!strings.Contains(status["reason"].(string), "_conf_version must be greater than or equal to") {
		t.Fatalf("sync behind the operator's secrets: %d %v", code, out)
	}
	if h := status["response"].(map[string]any)["headers"].(map[string]any); h["content-type"] == nil {
		t.Fatalf("response headers are relayed with lower-case names: %v", h)
	}
}

func TestRefusals(t *testing.T) {
	s := &server{clients: map[string]*adcclient.Client{}, logger: log.New(io.Discard, "", 0)}
	adc := httptest.NewServer(http.HandlerFunc(s.sync))
	defer adc.Close()
	for name, body := range map[string]string{
		"not json":      `{`,
		"no server":     `{"task":{"opts":{"backend":"apisix-standalone","token":"k","cacheKey":"c"},"config":{}}}`,
		"not modelled":  `{"task":{"opts":{"backend":"apisix-standalone","server":"http://x","token":"k","cacheKey":"c"},"config":{"ssls":[]}}}`,
		"unnamed route": `{"task":{"opts":{"backend":"apisix-standalone","server":"http://x","token":"k","cacheKey":"c"},"config":{"services":[{"name":"s","routes":[{"uris":["/"]}]}]}}}`,
	} {
		if code, out := put(t, adc.URL, body); code != http.StatusBadRequest || out["message"] == "" {
			t.Errorf("%s: %d %v", name, code, out)
		}
	}
}
