// Package emulator is an in-process model of Apache APISIX's API-driven standalone
// Admin API (GET/PUT/HEAD /apisix/admin/configs, POST /apisix/admin/configs/validate,
// HEAD /apisix/admin), following ../shared/spec/apisix-standalone-admin-api.md. Every
// end-to-end test of confshim trusts it, so it models the wire exactly: status codes,
// error texts, headers, the per-section version rules, lua-cjson's encoding quirks, and
// the differences between APISIX 3.13, 3.14 and 3.17.
package emulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Sections is APISIX's resource key set (apisix/constants.lua), in the fixed order the
// emulator uses for Lua's pairs().
var Sections = []string{
	"routes", "services", "upstreams", "consumers", "consumer_groups", "ssls",
	"global_rules", "plugin_configs", "plugin_metadata", "protos", "secrets",
	"stream_routes", "plugins",
}

// Options configure an Emulator.
type Options struct {
	// Version is the APISIX version to model, e.g. "3.13.0", "3.14.1", "3.17.0" (default).
	Version string
	// AdminKey enables authentication (§1.2); empty disables it.
	AdminKey string
	// ViewerKey, if set, is a second key with role viewer (GET only).
	ViewerKey string
	// FillDefaults stores routes and upstreams with default fields added, a stress
	// option proving that confshim does not rely on GET echoing what was PUT.
	FillDefaults bool
	// Now is the clock for X-Last-Modified and the workers' AppliedLag; time.Now when
	// nil. Sleep is how ?wait passes time (time.Sleep when nil): a test that drives
	// the emulator on its own clock advances that instead.
	Now   func() time.Time
	Sleep func(time.Duration)
	// AppliedLag models APISIX's workers applying an accepted document up to about a
	// second after the 202: the state-dependent checks (§4.1.3) see the previous
	// document for this long. 0: at once.
	AppliedLag time.Duration
	// DecodeCost is what one decode of the stored document costs per MiB stored, spent
	// on the emulator's one worker as APISIX spends it (spec §11: ≈ 25 ms per MB on a
	// real 3.17): 0 means that figure, a negative value nothing (not even the decode's
	// CPU: a test that charges its own clock for it).
	DecodeCost time.Duration
	// LoadTime models a restarted APISIX that takes a moment to load: for this long
	// after Restart every request waits (nginx and its workers starting) before it is
	// served, so a client that reaches the port at once meets a slow first answer. 0:
	// ready at once.
	LoadTime time.Duration
	// DictSize is the standalone-config shared dict's size in bytes
	// (nginx_config.meta.lua_shared_dict.standalone-config, default 10m): a PUT whose
	// encoded document does not fit is answered 500 "failed to save config to shared
	// dict: no memory" after it was decoded and validated (spec §2 step 9, §11). The
	// dict then holds nothing: lua-nginx-module's set frees the entry it replaces when
	// the new value has another size, before it allocates the new one
	// (ngx_http_lua_ffi_shdict_store), so GET and HEAD show an empty data plane while
	// the workers keep what they applied (no worker event is posted). 0: 10 MiB.
	DictSize int
}

// defaultDictSize is APISIX's default standalone-config dict (10m).
const defaultDictSize = 10 << 20

// apisixDecodeCost is spec §11's measured cost of get_config() per MiB stored.
const apisixDecodeCost = 25 * time.Millisecond

// Request is a PUT as the emulator received it.
type Request struct {
	Header   http.Header
	Body     []byte
	RawQuery string
}

// Emulator is an http.Handler that behaves like APISIX's standalone Admin API.
type Emulator struct {
	waitPuts int // PUTs that carried ?wait
	opts     Options
	minor    int // 13, 14, … (APISIX 3.x)
	ver      string

	mu      sync.Mutex
	stored  []byte    // the shared dict's "config" value; nil when nothing is stored
	loaded  time.Time // a restarted instance serves from then on (Options.LoadTime)
	doc     table     // stored, decoded
	reloads map[string]int
	lastPut *Request
	puts    int
	costs   Costs
	// what the workers applied before the last accepted PUT, and when that PUT came
	prevDoc   table
	appliedAt time.Time
	// what the workers hold once a PUT too big for the dict emptied it (nil: the dict's)
	workersOnly table
}

// Costs are what the PUTs made APISIX do, the work confshim's §8 takes off it.
type Costs struct {
	ItemsValidated int // items run through a checker (3.15+: every item of every section present)
	BytesParsed    int // request body bytes decoded
	NoContent      int // PUTs answered 204 (same digest: nothing validated, stored or reloaded)
	Accepted       int // PUTs answered 202
	// Decodes of the stored document, by request kind: APISIX's get_config() decodes the
	// whole shared-dict document for every GET, HEAD and PUT of /configs (≈ 0.3 s of a
	// worker at 40,000 routes), never for HEAD /apisix/admin or validate.
	DecodesGET, DecodesHEAD, DecodesPUT int
	Validates                           int // POST /configs/validate calls
	Rejected                            int // PUTs answered 4xx or 5xx
	Pings                               int // HEAD /apisix/admin
}

// StoredBytes is the size of the stored document (what a decode reads).
func (e *Emulator) StoredBytes() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.stored)
}

// Decodes is the stored-document decodes of every kind.
func (c Costs) Decodes() int { return c.DecodesGET + c.DecodesHEAD + c.DecodesPUT }

// decodeStored decodes the stored document as get_config() does, and counts it; the
// caller holds e.mu. Nothing stored: nothing to decode.
func (e *Emulator) decodeStored(count *int) {
	if e.stored == nil {
		return
	}
	*count++
	if e.opts.DecodeCost < 0 {
		return // costs nothing: a test's own clock charges it (its result is unused)
	}
	_, _ = decodeCJSON(e.stored)
	e.chargeDecode(len(e.stored))
}

// SetDecodeCost changes Options.DecodeCost (tests that size a configuration first).
func (e *Emulator) SetDecodeCost(perMiB time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.opts.DecodeCost = perMiB
}

// chargeDecode spends a decode's time as APISIX does: the emulator holds its lock
// meanwhile, as a worker runs Lua to completion (other admin calls wait, as proxied
// requests do on a real one).
func (e *Emulator) chargeDecode(size int) {
	per := e.opts.DecodeCost
	if per == 0 {
		per = apisixDecodeCost
	}
	if per < 0 {
		return
	}
	if d := time.Duration(float64(per) * float64(size) / (1 << 20)); d > 50*time.Microsecond {
		time.Sleep(d)
	}
}

// New returns an emulator for the given options.
func New(opts Options) (*Emulator, error) {
	if opts.Version == "" {
		opts.Version = "3.17.0"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Sleep == nil {
		opts.Sleep = time.Sleep
	}
	parts := strings.SplitN(opts.Version, ".", 3)
	if len(parts) < 2 || parts[0] != "3" {
		return nil, fmt.Errorf("emulator: unsupported APISIX version %q (want 3.13 or later)", opts.Version)
	}
	minor, err := strconv.Atoi(parts[1])
	if err != nil || minor < 13 {
		return nil, fmt.Errorf("emulator: unsupported APISIX version %q (want 3.13 or later)", opts.Version)
	}
	return &Emulator{opts: opts, minor: minor, ver: opts.Version, reloads: map[string]int{}}, nil
}

// Version is the modelled APISIX version.
func (e *Emulator) Version() string { return e.ver }

// sections is the key set of this version: 11 on 3.13 (no plugins, no stream_routes).
func (e *Emulator) sections() []string {
	if e.minor < 14 {
		return Sections[:11]
	}
	return Sections
}

// Reloads returns how often each section's version changed: what an operator would see
// as section rebuilds in APISIX's logs.
func (e *Emulator) Reloads() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int, len(e.reloads))
	for k, v := range e.reloads {
		out[k] = v
	}
	return out
}

// Costs returns the work the PUTs so far made the data plane do.
func (e *Emulator) Costs() Costs {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.costs
}

// TotalReloads sums Reloads over every section.
func (e *Emulator) TotalReloads() int {
	n := 0
	for _, v := range e.Reloads() {
		n += v
	}
	return n
}

// LastPut returns the last PUT /apisix/admin/configs received (nil if none).
func (e *Emulator) LastPut() *Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastPut
}

// Puts returns how many PUT /apisix/admin/configs requests reached the emulator.
func (e *Emulator) Puts() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.puts
}

// Restart drops the stored configuration, as a container restart does (APISIX keeps
// it in a shared dict only). Reload counts are kept: they are the test's log.
func (e *Emulator) Restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stored, e.doc, e.prevDoc, e.workersOnly = nil, nil, nil, nil
	e.loaded = time.Now().Add(e.opts.LoadTime)
}

// awaitLoaded holds a request that reached a restarted instance still loading.
func (e *Emulator) awaitLoaded(r *http.Request) {
	e.mu.Lock()
	wait := time.Until(e.loaded)
	e.mu.Unlock()
	if wait <= 0 {
		return
	}
	select {
	case <-time.After(wait):
	case <-r.Context().Done():
	}
}

// Document returns a copy of the stored document as GET would decode it (nil when
// nothing is stored).
func (e *Emulator) Document() map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stored == nil {
		return nil
	}
	v, _ := decodeCJSON(e.stored)
	return v.(table)
}

// SectionVersion returns the stored K_conf_version (0 when absent).
func (e *Emulator) SectionVersion(section string) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	f, _ := e.doc[section+"_conf_version"].(float64)
	return f
}

// nginx's own pages, as the real APISIX of testdata/apisix-wire sends them.
const nginx404 = "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
const nginx500 = "<html>\r\n<head><title>500 Internal Server Error</title></head>\r\n<body>\r\n<center><h1>500 Internal Server Error</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"

// ServeHTTP routes like APISIX's admin server (INIT http_admin, AI standalone_uri_route).
func (e *Emulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.awaitLoaded(r)
	h := w.Header()
	h.Set("Server", "APISIX/"+e.ver)
	h.Set("Content-Type", "application/json")
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Credentials", "true")
	h.Set("Access-Control-Expose-Headers", "*")
	h.Set("Access-Control-Max-Age", "3600")
	h.Set("Connection", "keep-alive") // nginx says so; net/http replaces it when the request asked to close
	if r.Method == http.MethodOptions {
		h.Set("Access-Control-Allow-Methods", "POST, GET, PUT, OPTIONS, DELETE, PATCH")
		h.Set("Access-Control-Allow-Headers", "*")
		h.Set("Content-Type", "text/plain")
		h.Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return
	}
	uri := normalizePath(r.URL.Path)
	switch {
	case uri == "/apisix/admin" && r.Method == http.MethodHead:
		e.mu.Lock()
		e.costs.Pings++
		e.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	case uri == "/apisix/admin/configs" && r.Method == http.MethodGet:
		e.withAuth(w, r, e.get)
	case uri == "/apisix/admin/configs" && r.Method == http.MethodHead && e.minor >= 14:
		e.withAuth(w, r, e.head)
	case uri == "/apisix/admin/configs" && r.Method == http.MethodPut:
		rec := &rejectRecorder{ResponseWriter: w}
		e.withAuth(rec, r, e.put)
		if rec.status >= 400 {
			e.mu.Lock()
			e.costs.Rejected++
			e.mu.Unlock()
		}
	case uri == "/apisix/admin/configs/validate" && r.Method == http.MethodPost && e.minor >= 15:
		e.withAuth(w, r, e.validate)
	default:
		writeHTML(w, http.StatusNotFound, nginx404)
	}
}

// rejectRecorder notes the status a PUT was answered with.
type rejectRecorder struct {
	http.ResponseWriter
	status int
}

func (r *rejectRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *rejectRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// normalizePath models nginx's $uri: merged slashes and resolved dot segments.
func normalizePath(p string) string {
	if p == "" {
		return "/"
	}
	trailing := strings.HasSuffix(p, "/") && len(strings.Trim(p, "/")) > 0
	clean := path.Clean("/" + p)
	if trailing {
		clean += "/"
	}
	return clean
}

// writeHTML is one of nginx's own pages: the only answers sent with Content-Length
// (net/http sets it for a short body written in one go).
func writeHTML(w http.ResponseWriter, status int, page string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, page)
}

// writeJSON writes a cjson-encoded table followed by "\n", as APISIX's core.response does.
func writeJSON(w http.ResponseWriter, status int, body table) {
	b, err := encodeCJSON(body)
	if err != nil {
		writeHTML(w, http.StatusInternalServerError, nginx500)
		return
	}
	writeLua(w, status, append(b, '\n'))
}

func writeText(w http.ResponseWriter, status int, text string) {
	writeLua(w, status, []byte(text))
}

// writeLua answers as nginx frames what Lua writes (spec §12): the headers go out
// before the body is known, so over HTTP/1.1 the body is chunked, and an empty one is
// just the last chunk. A 204 and a HEAD answer carry no body and no framing at all.
// Wrappers of w must Unwrap for the flush to reach the connection.
func writeLua(w http.ResponseWriter, status int, body []byte) {
	if status == http.StatusNoContent {
		w.Header().Del("Content-Type")
		w.WriteHeader(status)
		return
	}
	w.WriteHeader(status)
	_ = http.NewResponseController(w).Flush()
	if len(body) > 0 {
		_, _ = w.Write(body)
	}
}

func errorMsg(msg string) table { return table{"error_msg": msg} }

// token finds the admin key as APISIX 3.17 does (apisix/admin/init.lua, checked on a
// real one): the api_key query argument by exact name (the first if repeated), else
// the header as nginx's $http_x_api_key matches it (any case, "_" for "-", the first
// such header, surrounding spaces trimmed), else the x_api_key cookie by exact name
// (the last if repeated).
func token(r *http.Request) (string, bool) {
	if q := r.URL.Query(); q.Has("api_key") {
		return q.Get("api_key"), true
	}
	for name, values := range r.Header {
		if len(name) == len("x-api-key") && strings.EqualFold(strings.ReplaceAll(name, "_", "-"), "x-api-key") {
			return strings.TrimSpace(values[0]), true
		}
	}
	var cookie string
	found := false
	for _, c := range r.Cookies() {
		if c.Name == "x_api_key" {
			cookie, found = c.Value, true
		}
	}
	return cookie, found
}

func (e *Emulator) withAuth(w http.ResponseWriter, r *http.Request, next http.HandlerFunc) {
	if e.opts.AdminKey != "" {
		tok, ok := token(r)
		switch {
		case !ok || tok == "":
			writeJSON(w, http.StatusUnauthorized, table{"error_msg": "failed to check token", "description": "missing apikey"})
			return
		case tok == e.opts.AdminKey:
		case e.opts.ViewerKey != "" && tok == e.opts.ViewerKey:
			if r.Method != http.MethodGet {
				writeJSON(w, http.StatusUnauthorized, table{"error_msg": "failed to check token", "description": "invalid method for role viewer"})
				return
			}
		default:
			writeJSON(w, http.StatusUnauthorized, table{"error_msg": "failed to check token", "description": "wrong apikey"})
			return
		}
	}
	next(w, r)
}

func (e *Emulator) setMetaHeaders(w http.ResponseWriter, doc table) {
	if e.minor < 14 || doc == nil {
		return
	}
	if lm, ok := doc["X-Last-Modified"].(float64); ok {
		w.Header().Set("X-Last-Modified", formatLuaNumber(lm))
	}
	if d, ok := doc["X-Digest"].(string); ok {
		w.Header().Set("X-Digest", d)
	}
}

func (e *Emulator) get(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	stored := e.stored
	if stored != nil {
		e.costs.DecodesGET++ // decoded below, outside the lock
		e.chargeDecode(len(stored))
	}
	e.mu.Unlock()
	var doc table
	if stored == nil {
		doc = table{}
		for _, k := range e.sections() {
			doc[k+"_conf_version"] = float64(0)
		}
	} else {
		v, err := decodeCJSON(stored)
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, errorMsg("failed to get config from shared_dict: "+err.Error()))
			return
		}
		doc = v.(table)
		e.setMetaHeaders(w, doc)
	}
	if strings.HasPrefix(r.Header.Get("Accept"), "application/yaml") {
		body, err := encodeYAML(doc)
		if err != nil {
			writeHTML(w, http.StatusInternalServerError, nginx500)
			return
		}
		w.Header().Set("Content-Type", "application/yaml")
		writeText(w, http.StatusOK, string(body))
		return
	}
	body, err := encodeCJSON(doc)
	if err != nil {
		writeHTML(w, http.StatusInternalServerError, nginx500)
		return
	}
	writeText(w, http.StatusOK, string(body))
}

func (e *Emulator) head(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	e.decodeStored(&e.costs.DecodesHEAD)
	doc := e.doc
	e.mu.Unlock()
	e.setMetaHeaders(w, doc)
	w.WriteHeader(http.StatusOK)
}

// errLua is an uncaught Lua error in the handler: nginx answers its HTML 500 page.
var errLua = errors.New("lua error")

// readBody reads and parses a PUT or validate body (§1.3, §2.1 steps 3–4); a YAML
// syntax error is errLua, as the PUT handler does not catch it.
func readBody(r *http.Request) (v any, yamlBody bool, err error) {
	body, rerr := io.ReadAll(r.Body)
	if rerr != nil {
		return nil, false, fmt.Errorf("invalid request body: %v", rerr)
	}
	if len(body) == 0 {
		return nil, false, errors.New("invalid request body: empty request body")
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/yaml") {
		v, err := decodeYAML(body)
		return v, true, err
	}
	v, err = decodeCJSON(body)
	if err != nil {
		return nil, false, fmt.Errorf("invalid request body: %v", err)
	}
	return v, false, nil
}

var errYAMLNonTable = errors.New("invalid request body: invalid yaml request body")

func (e *Emulator) put(w http.ResponseWriter, r *http.Request) {
	digest, hasDigest := "", false
	if e.minor >= 14 {
		if vals := r.Header.Values("X-Digest"); len(vals) > 0 {
			digest, hasDigest = vals[0], true
		}
		if !hasDigest {
			e.notePut(r, nil)
			writeJSON(w, http.StatusBadRequest, errorMsg("missing digest header"))
			return
		}
	}
	raw, rerr := io.ReadAll(r.Body)
	e.notePut(r, raw)
	e.mu.Lock()
	e.costs.BytesParsed += len(raw)
	e.mu.Unlock()
	if rerr != nil {
		writeJSON(w, http.StatusBadRequest, errorMsg("invalid request body: "+rerr.Error()))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
	v, isYAML, err := readBody(r)
	switch {
	case errors.Is(err, errLua):
		writeHTML(w, http.StatusInternalServerError, nginx500)
		return
	case err != nil:
		writeJSON(w, http.StatusBadRequest, errorMsg(err.Error()))
		return
	}
	conf, ok := v.(table)
	if msg := e.shapeError(v, raw, isYAML); msg != "" {
		writeJSON(w, http.StatusBadRequest, errorMsg(msg))
		return
	}
	if !ok {
		_, isArray := v.([]any)
		_, isString := v.(string)
		switch {
		case isArray || (isString && !isYAML):
			conf = table{} // no resource key can be read: behaves like {}
		case isYAML:
			writeJSON(w, http.StatusBadRequest, errorMsg(errYAMLNonTable.Error()))
			return
		default:
			writeHTML(w, http.StatusInternalServerError, nginx500)
			return
		}
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	e.decodeStored(&e.costs.DecodesPUT) // step 5, before the digest is compared
	if e.minor >= 14 && e.doc != nil {
		if stored, _ := e.doc["X-Digest"].(string); stored == digest {
			e.costs.NoContent++
			writeLua(w, http.StatusNoContent, nil)
			return
		}
	}
	newDoc, status, msg := e.apply(conf)
	switch {
	case status == http.StatusInternalServerError && msg == "":
		writeHTML(w, status, nginx500)
		return
	case status != 0:
		writeJSON(w, status, errorMsg(msg))
		return
	}
	lastModified := float64(e.opts.Now().Unix())
	if e.minor >= 14 {
		newDoc["X-Last-Modified"] = lastModified
		newDoc["X-Digest"] = digest
	}
	encoded, encErr := encodeCJSON(newDoc)
	if encErr != nil {
		writeText(w, http.StatusInternalServerError, "failed to encode json: "+encErr.Error())
		return
	}
	if len(encoded) > e.dictSize() {
		if e.doc != nil {
			e.workersOnly = e.doc // its worker event was posted: the workers apply it
		}
		e.stored, e.doc = nil, nil // the old entry was freed before the allocation failed
		writeText(w, http.StatusInternalServerError, "failed to save config to shared dict: no memory")
		return
	}
	e.stored, e.workersOnly = encoded, nil
	decoded, _ := decodeCJSON(encoded) // what the dict now holds (numbers at 14 digits)
	old := e.doc
	e.prevDoc, e.appliedAt = old, e.opts.Now()
	e.doc = decoded.(table)
	// A section reloads when its *stored* version changed: what workers compare.
	for _, k := range e.sections() {
		vk := k + "_conf_version"
		oldV, _ := old[vk].(float64)
		if newV, _ := e.doc[vk].(float64); newV != oldV {
			e.reloads[k]++
		}
	}
	e.costs.Accepted++
	if e.minor >= 14 {
		w.Header().Set("X-Last-Modified", formatLuaNumber(lastModified))
		w.Header().Set("X-Digest", digest)
	}
	answer := http.StatusAccepted
	if wait, ok := e.waitParam(r); ok {
		// §13: answered 200 once every worker applied it within wait, else 202
		lag := e.opts.AppliedLag
		e.mu.Unlock()
		if lag <= wait {
			e.opts.Sleep(max(lag, 0))
			answer = http.StatusOK
		} else {
			e.opts.Sleep(wait)
		}
		e.mu.Lock()
	}
	writeLua(w, answer, nil)
}

// SetDictSize changes the standalone-config dict's size from the next PUT on (0:
// Options.DictSize's default): a test fills it without a restart.
func (e *Emulator) SetDictSize(n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.opts.DictSize = n
}

func (e *Emulator) dictSize() int {
	if e.opts.DictSize > 0 {
		return e.opts.DictSize
	}
	return defaultDictSize
}

// waitParam is PUT's ?wait=<ms> on a data plane that has it (after 3.18, §13); a value
// that is not an integer counts as 0.
func (e *Emulator) waitParam(r *http.Request) (time.Duration, bool) {
	if e.minor < 19 || !r.URL.Query().Has("wait") {
		return 0, false
	}
	ms, _ := strconv.Atoi(r.URL.Query().Get("wait"))
	return time.Duration(max(ms, 0)) * time.Millisecond, true
}

// shapeError is the declarative-body shape check of the data plane after 3.18 (§13,
// apache/apisix#13886): the top level an object, every section an array, every item an
// object (the messages are the emulator's: the sources do not show APISIX's). A JSON
// section is judged by its bytes: [] and {} decode alike (cjson), which is the point.
func (e *Emulator) shapeError(v any, raw []byte, isYAML bool) string {
	if e.minor < 19 {
		return ""
	}
	conf, ok := v.(table)
	if !ok {
		return "invalid configuration: the top level must be an object"
	}
	var members map[string]json.RawMessage
	if !isYAML {
		_ = json.Unmarshal(raw, &members)
	}
	for _, k := range e.sections() {
		value, present := conf[k]
		if !present {
			continue
		}
		if m, ok := members[k]; ok {
			var items []json.RawMessage
			if json.Unmarshal(m, &items) != nil {
				return fmt.Sprintf("invalid configuration: %s must be an array", k)
			}
			for i, it := range items {
				if t := bytes.TrimSpace(it); len(t) == 0 || t[0] != '{' {
					return fmt.Sprintf("invalid configuration: %s[%d] must be an object", k, i)
				}
			}
			continue
		}
		items, isArray := value.([]any)
		if _, isTable := value.(table); !isArray && !(isTable && len(value.(table)) == 0) {
			return fmt.Sprintf("invalid configuration: %s must be an array", k)
		}
		for i, it := range items {
			if _, isObject := it.(table); !isObject {
				return fmt.Sprintf("invalid configuration: %s[%d] must be an object", k, i)
			}
		}
	}
	return ""
}

// WaitPuts is how many PUTs carried ?wait.
func (e *Emulator) WaitPuts() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.waitPuts
}

// Applied reports whether the workers have applied the last accepted PUT (at once
// without AppliedLag): a test waits for it instead of sleeping.
func (e *Emulator) Applied() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.opts.AppliedLag <= 0 || e.opts.Now().Sub(e.appliedAt) >= e.opts.AppliedLag
}

// ApplyNow has the workers apply the last accepted PUT at once, as if AppliedLag had
// passed since: a test whose subject is not the lag skips waiting it out.
func (e *Emulator) ApplyNow() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.appliedAt = e.opts.Now().Add(-e.opts.AppliedLag)
}

// applied is the document the workers have applied (the caller holds e.mu).
func (e *Emulator) applied() table {
	if e.opts.AppliedLag > 0 && e.opts.Now().Sub(e.appliedAt) < e.opts.AppliedLag {
		return e.prevDoc
	}
	if e.doc == nil && e.workersOnly != nil {
		return e.workersOnly
	}
	return e.doc
}

func (e *Emulator) notePut(r *http.Request, body []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.puts++
	e.lastPut = &Request{Header: r.Header.Clone(), Body: body, RawQuery: r.URL.RawQuery}
	if r.URL.Query().Has("wait") {
		e.waitPuts++
	}
}

// versionOf reads V from the request: (value, present, error message).
func versionOf(conf table, key string) (float64, bool, string) {
	vk := key + "_conf_version"
	raw, ok := conf[vk]
	if !ok || raw == false {
		return 0, false, ""
	}
	f, isNum := raw.(float64)
	if !isNum {
		return 0, false, vk + " must be a number"
	}
	return f, true, ""
}

// itemsOf returns the section's items when it holds a non-empty array.
func itemsOf(conf table, key string) []any {
	arr, _ := conf[key].([]any)
	return arr
}

// checkSection validates the items of one section (checker, then duplicate check, fail-fast).
// It returns (status, message); status 500 with an empty message is a Lua error.
func (e *Emulator) checkSection(key string, items []any) (int, string) {
	seen := map[string]bool{}
	for i, raw := range items {
		e.costs.ItemsValidated++
		if cerr := checkItem(key, raw); cerr != nil {
			return http.StatusBadRequest, e.prefixed(key, i, cerr)
		}
		item := raw.(table)
		if cerr := e.checkAgainstApplied(key, item); cerr != nil {
			return http.StatusBadRequest, e.prefixed(key, i, cerr)
		}
		id, field, ok := identifier(key, item)
		if !ok {
			if e.minor < 17 {
				return http.StatusInternalServerError, ""
			}
			continue
		}
		if seen[id] {
			return http.StatusBadRequest, fmt.Sprintf("found duplicate %s %v in %s", field, displayID(item, field), key)
		}
		seen[id] = true
	}
	return 0, ""
}

func (e *Emulator) prefixed(key string, index int, cerr *checkError) string {
	switch {
	case e.minor >= 17:
		return cerr.msg
	case e.minor == 13 && cerr.schema:
		return fmt.Sprintf("invalid %s at index %d, err: %s", key, index, strings.TrimPrefix(cerr.msg, "invalid configuration: "))
	default:
		return fmt.Sprintf("invalid %s at index %d, err: %s", key, index, cerr.msg)
	}
}

// apply runs validation and the per-key version algorithm (§2.1 steps 7–9, §2.3) and
// returns the new document, or a status and message (500 with "" = Lua error).
func (e *Emulator) apply(conf table) (table, int, string) {
	storedVersion := func(key string) float64 {
		f, _ := e.doc[key+"_conf_version"].(float64)
		return f
	}
	if e.minor >= 15 { // everything validated up front, equal versions included
		for _, k := range e.sections() {
			if _, ok := conf[k+"_conf_version"]; ok {
				if _, _, msg := versionOf(conf, k); msg != "" {
					return nil, http.StatusBadRequest, msg
				}
			}
			if status, msg := e.checkSection(k, itemsOf(conf, k)); status != 0 {
				return nil, status, msg
			}
		}
	}
	for _, k := range e.sections() {
		req, present, msg := versionOf(conf, k)
		if msg != "" {
			return nil, http.StatusBadRequest, msg
		}
		stored := storedVersion(k)
		if present && req < stored {
			return nil, http.StatusBadRequest, fmt.Sprintf("%s_conf_version must be greater than or equal to (%s)", k, formatLuaNumber(stored))
		}
		if e.minor < 15 && (!present || req != stored) {
			if status, msg := e.checkSection(k, itemsOf(conf, k)); status != 0 {
				return nil, status, msg
			}
		}
	}
	doc := table{}
	for _, k := range e.sections() {
		req, present, _ := versionOf(conf, k)
		stored := storedVersion(k)
		newV := req
		if !present {
			newV = stored + 1
		}
		if present && req == stored {
			doc[k+"_conf_version"] = stored
			if items, ok := e.doc[k]; ok {
				doc[k] = items
			}
			continue
		}
		switch conf[k].(type) {
		case nil, table, []any, yamlNull:
		case bool:
			if conf[k] == true {
				return nil, http.StatusInternalServerError, ""
			}
		default: // JSON null, a string or a number: Lua error
			return nil, http.StatusInternalServerError, ""
		}
		doc[k+"_conf_version"] = newV
		if items := itemsOf(conf, k); len(items) > 0 {
			if e.opts.FillDefaults {
				items = fillDefaults(k, items)
			}
			doc[k] = items
		}
	}
	return doc, 0, ""
}

// fillDefaults adds the schema defaults a real data plane might report back.
func fillDefaults(key string, items []any) []any {
	defaults := map[string]table{
		"routes":    {"status": float64(1), "priority": float64(0)},
		"upstreams": {"pass_host": "pass", "scheme": "http", "hash_on": "vars"},
	}[key]
	if defaults == nil {
		return items
	}
	out := make([]any, len(items))
	for i, raw := range items {
		item, ok := raw.(table)
		if !ok {
			out[i] = raw
			continue
		}
		filled := make(table, len(item)+len(defaults))
		for k, v := range item {
			filled[k] = v
		}
		for k, v := range defaults {
			if _, has := filled[k]; !has {
				filled[k] = v
			}
		}
		out[i] = filled
	}
	return out
}

// maxValidateBody is CV MAX_REQ_BODY (3.17.0+).
const maxValidateBody = 1572864

func (e *Emulator) validate(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.costs.Validates++
	e.mu.Unlock()
	if e.minor >= 17 {
		if r.ContentLength > maxValidateBody {
			writeJSON(w, http.StatusBadRequest, errorMsg(fmt.Sprintf("invalid request body: request size %d is greater than the maximum size %d allowed", r.ContentLength, maxValidateBody)))
			return
		}
		raw, _ := io.ReadAll(io.LimitReader(r.Body, maxValidateBody+1))
		if len(raw) > maxValidateBody {
			writeJSON(w, http.StatusBadRequest, errorMsg(fmt.Sprintf("invalid request body: request size %d is greater than the maximum size %d allowed", len(raw), maxValidateBody)))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(raw))
	}
	v, isYAML, err := readBody(r)
	if err != nil {
		if isYAML && !strings.Contains(err.Error(), "empty request body") {
			err = errYAMLNonTable // validate catches YAML syntax errors too
		}
		writeJSON(w, http.StatusBadRequest, errorMsg(err.Error()))
		return
	}
	conf, ok := v.(table)
	if !ok {
		if isYAML {
			writeJSON(w, http.StatusBadRequest, errorMsg(errYAMLNonTable.Error()))
			return
		}
		conf = table{}
	}
	e.mu.Lock() // the state-dependent checks read what is applied
	defer e.mu.Unlock()
	var errs []any
	for _, k := range e.sections() {
		vk := k + "_conf_version"
		if raw, present := conf[vk]; present && raw != false {
			if _, isNum := raw.(float64); !isNum {
				errs = append(errs, table{"resource_type": k, "error": fmt.Sprintf("%s must be a number, got %s", vk, luaType(raw))})
			}
		}
		if conf[k] == (luaNull{}) {
			if e.minor < 17 {
				writeHTML(w, http.StatusInternalServerError, nginx500)
				return
			}
			errs = append(errs, table{"error": fmt.Sprintf("bad argument #1 to 'ipairs' (table expected, got userdata) in %s", k)})
			continue
		}
		seen := map[string]bool{}
		for i, raw := range itemsOf(conf, k) {
			item, _ := raw.(table)
			entry := table{"resource_type": k, "index": float64(i)}
			if e.minor >= 17 {
				entry["resource_id"] = ""
				if item != nil {
					if id, field, ok := identifier(k, item); ok {
						_ = id
						entry["resource_id"] = displayID(item, field)
					}
				}
			}
			if cerr := checkItem(k, raw); cerr != nil {
				entry["error"] = e.prefixed(k, i, cerr)
				errs = append(errs, entry)
				continue
			}
			if cerr := e.checkAgainstApplied(k, item); cerr != nil {
				entry["error"] = e.prefixed(k, i, cerr)
				errs = append(errs, entry)
				continue
			}
			id, field, ok := identifier(k, item)
			if !ok {
				continue
			}
			if seen[id] {
				entry["error"] = fmt.Sprintf("found duplicate %s %v in %s", field, displayID(item, field), k)
				errs = append(errs, entry)
			}
			seen[id] = true
		}
	}
	if len(errs) > 0 {
		writeJSON(w, http.StatusBadRequest, table{"error_msg": "Configuration validation failed", "errors": errs})
		return
	}
	if e.minor >= 17 {
		writeText(w, http.StatusOK, "{}\n")
		return
	}
	writeLua(w, http.StatusOK, nil)
}
