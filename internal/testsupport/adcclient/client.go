// Package adcclient is a test client that behaves like ADC's apisix-standalone backend
// (../shared/spec/adc-standalone-client.md): it fills a raw cache from GET
// /apisix/admin/configs, builds every PUT from a clone of that cache, gives a new
// version T only to sections whose items changed, echoes everything else byte for byte
// (other sections, unknown keys, their cached versions), and replaces its cache with
// what it sent after any 2xx. It never re-reads the data plane while its cache is warm.
package adcclient

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Modelled are the sections ADC creates, updates and deletes (secrets: as the controller
// will, apache/apisix-ingress-controller#2831; only when the configuration has them).
var Modelled = []string{"routes", "services", "upstreams", "consumers", "ssls", "global_rules", "plugin_metadata", "stream_routes", "secrets"}

// Config is the desired configuration: items per modelled section.
type Config map[string][]map[string]any

// Client is one ADC instance (one controller replica) with its own cache.
type Client struct {
	Server string
	Key    string
	HTTP   *http.Client
	// Clock gives T in ms; defaults to a strictly increasing clock from time.Now.
	Clock func() int64
	// Restamp lists sections re-stamped on every sync although unchanged (a new
	// version and a new modifiedIndex), as ADC 0.28 does with plugin_metadata.
	Restamp []string

	cache  []member // raw cache, in order; nil when cold
	latest int64
	last   atomic.Int64
}

type member struct {
	key string
	raw json.RawMessage
}

// Result is the PUT's answer.
type Result struct {
	Status int
	Header http.Header
	Body   []byte
	Sent   []byte // the PUT body
	T      int64
}

// New returns a cold client.
func New(server, key string) *Client {
	return &Client{Server: server, Key: key, HTTP: &http.Client{Timeout: 10 * time.Second}}
}

// Invalidate drops the cache, as bypassCache or TTL expiry do.
func (c *Client) Invalidate() { c.cache = nil }

func (c *Client) now() int64 {
	if c.Clock != nil {
		return c.Clock()
	}
	t := time.Now().UnixMilli()
	for {
		prev := c.last.Load()
		if t <= prev {
			t = prev + 1
		}
		if c.last.CompareAndSwap(prev, t) {
			return t
		}
	}
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, hdr map[string]string) (*Result, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.Server+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/plain, */*")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return &Result{Status: resp.StatusCode, Header: resp.Header, Body: b}, err
}

// fill is the cold sequence: version HEAD, HEAD /configs, GET /configs.
func (c *Client) fill(ctx context.Context) error {
	head, err := c.do(ctx, http.MethodHead, "/apisix/admin", nil, nil)
	if err != nil {
		return err
	}
	method := http.MethodHead
	if v := strings.TrimPrefix(head.Header.Get("Server"), "APISIX/"); strings.HasPrefix(v, "3.13") {
		method = http.MethodGet
	}
	if r, err := c.do(ctx, method, "/apisix/admin/configs", nil, map[string]string{"X-API-KEY": c.Key}); err != nil {
		return err
	} else if r.Status/100 != 2 {
		return fmt.Errorf("%s /configs: %d", method, r.Status)
	}
	r, err := c.do(ctx, http.MethodGet, "/apisix/admin/configs", nil, map[string]string{"X-API-KEY": c.Key})
	if err != nil {
		return err
	}
	if r.Status != http.StatusOK {
		return fmt.Errorf("GET /configs: %d %s", r.Status, r.Body)
	}
	members, err := parseMembers(r.Body)
	if err != nil {
		return err
	}
	c.cache, c.latest = members, 0
	for _, m := range members {
		if strings.HasSuffix(m.key, "_conf_version") {
			if v, err := strconv.ParseFloat(string(m.raw), 64); err == nil && int64(v) > c.latest {
				c.latest = int64(v)
			}
		}
	}
	return nil
}

// parseMembers reads the top-level members of an object, in order, raw.
func parseMembers(body []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not an object: %v", err)
	}
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		out = append(out, member{key: tok.(string), raw: raw})
	}
	return out, nil
}

// normalize strips modifiedIndex so that ADC's diff compares content only.
func normalize(raw json.RawMessage) any {
	var items []map[string]any
	if len(raw) == 0 || json.Unmarshal(raw, &items) != nil {
		return []map[string]any{}
	}
	for _, it := range items {
		delete(it, "modifiedIndex")
	}
	if items == nil {
		items = []map[string]any{}
	}
	return items
}

func normalizeDesired(items []map[string]any) any {
	b, _ := json.Marshal(items)
	return normalize(b)
}

// Body builds the PUT body for cfg from the cache, as ADC does, without sending it.
func (c *Client) Body(cfg Config, t int64) []byte {
	members := make([]member, 0, len(c.cache)+len(cfg))
	index := map[string]int{}
	for _, m := range c.cache {
		if m.key == "X-Last-Modified" || m.key == "X-Digest" {
			continue
		}
		index[m.key] = len(members)
		members = append(members, m)
	}
	set := func(key string, raw json.RawMessage) {
		if i, ok := index[key]; ok {
			members[i].raw = raw
			return
		}
		index[key] = len(members)
		members = append(members, member{key: key, raw: raw})
	}
	for _, section := range Modelled {
		desired, managed := cfg[section]
		if !managed {
			continue
		}
		var cached json.RawMessage
		if i, ok := index[section]; ok {
			cached = members[i].raw
		}
		if reflect.DeepEqual(normalize(cached), normalizeDesired(desired)) && !slices.Contains(c.Restamp, section) {
			continue
		}
		items := make([]map[string]any, len(desired))
		for i, it := range desired {
			cp := map[string]any{"modifiedIndex": t}
			for k, v := range it {
				cp[k] = v
			}
			items[i] = cp
		}
		raw, _ := json.Marshal(items)
		set(section, raw)
		set(section+"_conf_version", json.RawMessage(strconv.FormatInt(t, 10)))
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		b.Write(m.raw)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// Sync sends one sync of cfg: the cold sequence when the cache is empty, then the PUT.
func (c *Client) Sync(ctx context.Context, cfg Config) (*Result, error) {
	if c.cache == nil {
		if err := c.fill(ctx); err != nil {
			return nil, fmt.Errorf("cold sync: %w", err)
		}
	}
	t := c.NextT()
	return c.Put(ctx, c.Body(cfg, t), t)
}

// NextT is the T of the next sync: a clock that never goes back past the cache's.
func (c *Client) NextT() int64 {
	t := c.now()
	if c.latest >= t {
		t = c.latest + 1
	}
	return t
}

// Put sends a body built by Body for T t, and on a 2xx takes it as the new cache.
func (c *Client) Put(ctx context.Context, body []byte, t int64) (*Result, error) {
	sum := sha1.Sum(body)
	res, err := c.do(ctx, http.MethodPut, "/apisix/admin/configs", body, map[string]string{
		"X-API-KEY": c.Key, "x-digest": hex.EncodeToString(sum[:]),
	})
	if err != nil {
		return nil, err
	}
	res.Sent, res.T = body, t
	if res.Status/100 == 2 {
		if members, err := parseMembers(body); err == nil {
			c.cache, c.latest = members, t
		}
	}
	return res, nil
}

// CachedVersion returns the cached <section>_conf_version (0 when absent).
func (c *Client) CachedVersion(section string) int64 {
	for _, m := range c.cache {
		if m.key == section+"_conf_version" {
			v, _ := strconv.ParseFloat(string(m.raw), 64)
			return int64(v)
		}
	}
	return 0
}

// Adopt takes a copy of other's cache: the same ADC state, aimed at another server.
func (c *Client) Adopt(other *Client) {
	c.cache = append([]member(nil), other.cache...)
	c.latest = other.latest
}
