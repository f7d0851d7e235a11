// Package adcclient is a test client that behaves like ADC's apisix-standalone backend
// (../shared/spec/adc-standalone-client.md): it fills a raw cache from GET
// /apisix/admin/configs, builds every PUT from a clone of that cache, gives a new
// version T only to sections whose items changed, echoes everything else byte for byte
// (other sections, unknown keys, their cached versions), and replaces its cache with
// what it sent after any 2xx. It never re-reads the data plane while its cache is warm.
//
// Gen030 is ADC 0.30, the Rust rewrite (§13): it keeps and sends only its eight
// sections, always all sixteen keys (a section read back as {} is sent as []), PUTs
// with ?wait=3000, takes 200 and 204 as applied (202 too where APISIX predates ?wait:
// before 3.19 every accepted PUT is a 202) and keeps its cache on a 202 from 3.19, and
// after a failed sync re-validates the whole document to report each refused item.
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

// modelled are the sections ADC creates, updates and deletes (secrets: as the controller
// will, apache/apisix-ingress-controller#2831; only when the configuration has them).
var modelled = []string{"routes", "services", "upstreams", "consumers", "ssls", "global_rules", "plugin_metadata", "stream_routes", "secrets"}

// sections030 are the only sections ADC 0.30 reads, keeps and sends (§13): never
// secrets, plugin_configs, consumer_groups, protos or plugins.
var sections030 = []string{"routes", "services", "upstreams", "ssls", "consumers", "global_rules", "plugin_metadata", "stream_routes"}

// UserAgent starts the User-Agent of every request a Client sends.
const UserAgent = "adcclient/"

// Generation is the ADC release a Client behaves like.
type Generation int

const (
	Gen028 Generation = iota // the TypeScript ADC 0.28 (the default)
	Gen030                   // the Rust ADC 0.30
)

func (g Generation) String() string {
	if g == Gen030 {
		return "adc-0.30"
	}
	return "adc-0.28"
}

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
	// Gen is the ADC release modelled (Gen028 by default).
	Gen Generation
	// server is the Server header of the cold sequence's version HEAD
	server string

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
	// Failed are the ids a Gen030 client reports refused after a failed sync: what its
	// re-validation of the whole document named (ADC's failed[], the controller's status)
	Failed []string
}

// New030 returns a cold ADC 0.30 client.
func New030(server, key string) *Client {
	c := New(server, key)
	c.Gen = Gen030
	return c
}

// New returns a cold client. It has a transport of its own: every httptest.Server's
// Close closes http.DefaultTransport's idle connections, and a request that had just
// taken one fails ("CloseIdleConnections called") when another test ends beside it.
func New(server, key string) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &Client{Server: server, Key: key, HTTP: &http.Client{Timeout: 10 * time.Second, Transport: tr}}
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
	req.Header.Set("User-Agent", UserAgent+c.Gen.String()) // a test between confshim and APISIX tells the client's requests apart
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
	c.server = head.Header.Get("Server")
	method := http.MethodHead
	if v := strings.TrimPrefix(c.server, "APISIX/"); strings.HasPrefix(v, "3.13") {
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
	if c.Gen == Gen030 {
		members = only030(members)
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

// only030 keeps what ADC 0.30 reads of a dump: its eight sections and their versions,
// in its own order, all sixteen keys (a missing or {} section is []; a missing version 0).
func only030(members []member) []member {
	byKey := map[string]json.RawMessage{}
	for _, m := range members {
		byKey[m.key] = m.raw
	}
	out := make([]member, 0, 2*len(sections030))
	for _, s := range sections030 {
		v := byKey[s+"_conf_version"]
		if len(v) == 0 {
			v = json.RawMessage("0")
		}
		items := byKey[s]
		if len(items) == 0 || string(items) == "{}" {
			items = json.RawMessage("[]")
		}
		out = append(out, member{key: s + "_conf_version", raw: v}, member{key: s, raw: items})
	}
	return out
}

// itemKey is an item's identity in ADC's diff: its id, or a consumer's username.
func itemKey(it map[string]any) string {
	if id, ok := it["id"]; ok {
		return fmt.Sprint(id)
	}
	return fmt.Sprint(it["username"])
}

// cachedByID are a cached section's items' bytes by identity.
func cachedByID(raw json.RawMessage) map[string]json.RawMessage {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil
	}
	out := make(map[string]json.RawMessage, len(items))
	for _, item := range items {
		var it map[string]any
		if json.Unmarshal(item, &it) == nil {
			out[itemKey(it)] = item
		}
	}
	return out
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
	for _, section := range modelled {
		desired, managed := cfg[section]
		if c.Gen == Gen030 {
			if !slices.Contains(sections030, section) {
				continue // never sent
			}
			if desired == nil {
				desired = []map[string]any{} // declared empty: all sixteen keys always go
			}
			managed = true
		}
		if !managed {
			continue
		}
		var cached json.RawMessage
		if i, ok := index[section]; ok {
			cached = members[i].raw
		}
		if reflect.DeepEqual(normalize(cached), normalizeDesired(desired)) && !slices.Contains(c.Restamp, section) {
			if c.Gen == Gen030 && cached == nil {
				set(section, json.RawMessage("[]"))
				set(section+"_conf_version", json.RawMessage("0"))
			}
			continue
		}
		// items created or replaced get modifiedIndex T; the others keep their cached
		// bytes, modifiedIndex included (§3)
		kept := cachedByID(cached)
		var buf bytes.Buffer
		buf.WriteByte('[')
		for i, it := range desired {
			if i > 0 {
				buf.WriteByte(',')
			}
			if old, ok := kept[itemKey(it)]; ok && reflect.DeepEqual(normalize(json.RawMessage("["+string(old)+"]")), normalizeDesired([]map[string]any{it})) {
				buf.Write(old)
				continue
			}
			cp := map[string]any{"modifiedIndex": t}
			for k, v := range it {
				cp[k] = v
			}
			raw, _ := json.Marshal(cp)
			buf.Write(raw)
		}
		buf.WriteByte(']')
		set(section, buf.Bytes())
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
	path := "/apisix/admin/configs"
	if c.Gen == Gen030 {
		path += "?wait=3000" // ADC_APISIX_STANDALONE_SYNC_WAIT_MS
	}
	res, err := c.do(ctx, http.MethodPut, path, body, map[string]string{
		"X-API-KEY": c.Key, "x-digest": hex.EncodeToString(sum[:]),
	})
	if err != nil {
		return nil, err
	}
	res.Sent, res.T = body, t
	if c.applied(res.Status) {
		if members, err := parseMembers(body); err == nil {
			c.cache, c.latest = members, t
		}
	}
	if c.Gen == Gen030 && res.Status/100 != 2 {
		res.Failed, err = c.revalidate(ctx, body)
	}
	return res, err
}

// applied: the answer makes the client take what it sent as its cache. ADC 0.30
// against APISIX ≥ 3.19 waits for 200 (applied everywhere) or 204; a 202 there means
// accepted only, and the cache stays as it was.
func (c *Client) applied(status int) bool {
	if status/100 != 2 {
		return false
	}
	if c.Gen == Gen030 && status == http.StatusAccepted {
		return !waits(c.server)
	}
	return true
}

// waits: the data plane answers ?wait (APISIX after 3.18).
func waits(server string) bool {
	v := strings.TrimPrefix(server, "APISIX/")
	major, rest, _ := strings.Cut(v, ".")
	minor, _, _ := strings.Cut(rest, ".")
	n, err := strconv.Atoi(minor)
	return major == "3" && err == nil && n >= 19
}

// revalidate is ADC 0.30 after a failed sync: POST /configs/validate of the whole
// document, each refused item's id reported (failed[]).
func (c *Client) revalidate(ctx context.Context, body []byte) ([]string, error) {
	r, err := c.do(ctx, http.MethodPost, "/apisix/admin/configs/validate", body, map[string]string{"X-API-KEY": c.Key})
	if err != nil {
		return nil, err
	}
	var v struct {
		Errors []struct {
			ID any `json:"resource_id"`
		} `json:"errors"`
	}
	_ = json.Unmarshal(r.Body, &v)
	var ids []string
	for _, e := range v.Errors {
		if e.ID != nil {
			ids = append(ids, fmt.Sprint(e.ID))
		}
	}
	return ids, nil
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
