// Command adc-server stands in for ADC's server mode (`ADC_RUNNING_MODE=ingress adc
// server`, ../shared/spec/adc-standalone-client.md §10) where the ADC image cannot be
// had: make image-test runs deploy/compose with it. PUT /sync takes the same body as
// ADC's, turns the configuration's services (with their routes and inline upstream)
// into APISIX sections and syncs them with internal/testsupport/adcclient, the client
// that behaves like ADC's apisix-standalone backend (one cache per cacheKey and server);
// the answer is §10.2's, with each server's response headers relayed as axios shows them
// (lower-case names). GET /healthz/ready on --listen-status answers OK. Only services
// are modelled: any other resource type is refused with 400.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "adc-server:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, logOut io.Writer) error {
	if len(args) > 0 && args[0] == "server" { // as ADC's command line: adc server --listen …
		args = args[1:]
	}
	fs := flag.NewFlagSet("adc-server", flag.ContinueOnError)
	fs.SetOutput(logOut)
	listen := fs.String("listen", "http://127.0.0.1:3000", "URL to serve PUT /sync on (http only)")
	status := fs.String("listen-status", "3001", "port serving GET /healthz/ready, on all interfaces as ADC's")
	if err := fs.Parse(args); err != nil {
		return err
	}
	u, err := url.Parse(*listen)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("--listen %q: only http://host:port is served", *listen)
	}
	logger := log.New(logOut, "", log.LstdFlags)
	s := &server{clients: map[string]*adcclient.Client{}, logger: logger}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /sync", s.sync)
	statusMux := http.NewServeMux()
	statusMux.HandleFunc("GET /healthz/ready", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "OK") })

	servers := []*http.Server{
		{Addr: u.Host, Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		{Addr: net.JoinHostPort("", *status), Handler: statusMux, ReadHeaderTimeout: 10 * time.Second},
	}
	errs := make(chan error, len(servers))
	for _, srv := range servers {
		ln, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			return err
		}
		logger.Printf("ADC stand-in listening on %s", ln.Addr())
		go func() { errs <- srv.Serve(ln) }()
	}
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		_ = srv.Shutdown(shutdown)
	}
	return nil
}

type server struct {
	mu      sync.Mutex // one sync at a time, as the controller sends them
	clients map[string]*adcclient.Client
	logger  *log.Logger
}

type syncRequest struct {
	Task struct {
		Opts struct {
			Backend     string          `json:"backend"`
			Server      json.RawMessage `json:"server"`
			Token       string          `json:"token"`
			CacheKey    string          `json:"cacheKey"`
			BypassCache bool            `json:"bypassCache"`
		} `json:"opts"`
		Config map[string]json.RawMessage `json:"config"`
	} `json:"task"`
}

type service struct {
	Name     string           `json:"name"`
	Upstream map[string]any   `json:"upstream"`
	Routes   []map[string]any `json:"routes"`
}

func (s *server) sync(w http.ResponseWriter, r *http.Request) {
	var req syncRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 100<<20))
	if err := dec.Decode(&req); err != nil {
		answer(w, http.StatusBadRequest, map[string]any{"message": "invalid body: " + err.Error(), "errors": []any{}})
		return
	}
	opts := req.Task.Opts
	servers, err := serverList(opts.Server)
	if err != nil || opts.Backend != "apisix-standalone" || opts.Token == "" || opts.CacheKey == "" {
		answer(w, http.StatusBadRequest, map[string]any{"message": "opts: backend apisix-standalone, server, token and cacheKey are required", "errors": []any{}})
		return
	}
	cfg, events, err := translate(req.Task.Config)
	if err != nil {
		answer(w, http.StatusBadRequest, map[string]any{"message": err.Error(), "errors": []any{}})
		return
	}
	tokens := strings.Split(opts.Token, ",")

	s.mu.Lock()
	defer s.mu.Unlock()
	var statuses []map[string]any
	ok := 0
	for i, srv := range servers {
		token := tokens[0]
		if len(tokens) == len(servers) {
			token = tokens[i]
		}
		key := opts.CacheKey + "\x00" + srv + "\x00" + token
		c := s.clients[key]
		if c == nil || opts.BypassCache {
			c = adcclient.New(strings.TrimSuffix(srv, "/"), token)
			s.clients[key] = c
		}
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		res, err := c.Sync(ctx, cfg)
		cancel()
		if err != nil {
			s.logger.Printf("sync to %s: %v", srv, err)
			answer(w, http.StatusInternalServerError, map[string]any{"message": "Error: " + err.Error()})
			return
		}
		st := map[string]any{"server": srv, "success": res.Status/100 == 2, "requested_at": res.Header.Get("Date"),
			"response": map[string]any{"status": res.Status, "headers": lowerHeaders(res.Header), "data": data(res.Body)}}
		if res.Status/100 == 2 {
			ok++
		} else {
			st["reason"] = fmt.Sprintf("Error: %s", strings.TrimSpace(string(res.Body)))
		}
		s.logger.Printf("sync %s to %s: %d %s", opts.CacheKey, srv, res.Status, res.Header.Get("X-Confshim-Actions"))
		statuses = append(statuses, st)
	}
	status := "success"
	switch {
	case ok == 0:
		status = "all_failed"
	case ok < len(servers):
		status = "partial_failure"
	}
	answer(w, http.StatusAccepted, map[string]any{"status": status, "total_resources": 0,
		"success_count": ok, "failed_count": len(servers) - ok, "success": events, "failed": []any{},
		"endpoint_status": statuses})
}

func serverList(raw json.RawMessage) ([]string, error) {
	var one string
	if err := json.Unmarshal(raw, &one); err == nil && one != "" {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil || len(many) == 0 {
		return nil, errors.New("no server")
	}
	return many, nil
}

// translate turns ADC's services into APISIX's services and routes (ids as the
// CRC32 hex of the composed names; each route points at its service).
func translate(config map[string]json.RawMessage) (adcclient.Config, []map[string]any, error) {
	var services []service
	for k, v := range config {
		if k != "services" {
			return nil, nil, fmt.Errorf("the ADC stand-in models only services, not %s", k)
		}
		if err := json.Unmarshal(v, &services); err != nil {
			return nil, nil, fmt.Errorf("services: %w", err)
		}
	}
	cfg := adcclient.Config{"services": {}, "routes": {}}
	var events []map[string]any
	synced := time.Now().UnixMilli()
	for _, svc := range services {
		if svc.Name == "" {
			return nil, nil, errors.New("a service needs a name")
		}
		sid := id(svc.Name)
		item := map[string]any{"id": sid, "name": svc.Name}
		if svc.Upstream != nil {
			item["upstream"] = svc.Upstream
		}
		cfg["services"] = append(cfg["services"], item)
		events = append(events, map[string]any{"event": map[string]any{"resourceType": "service", "type": "create", "resourceId": sid, "resourceName": svc.Name}, "synced_at": synced})
		for _, rt := range svc.Routes {
			name, _ := rt["name"].(string)
			if name == "" {
				return nil, nil, fmt.Errorf("a route of service %s needs a name", svc.Name)
			}
			route := map[string]any{}
			for k, v := range rt {
				route[k] = v
			}
			rid := id(svc.Name + "_" + name)
			route["id"], route["service_id"] = rid, sid
			cfg["routes"] = append(cfg["routes"], route)
			events = append(events, map[string]any{"event": map[string]any{"resourceType": "route", "type": "create", "resourceId": rid, "resourceName": name, "parentId": sid}, "synced_at": synced})
		}
	}
	return cfg, events, nil
}

func id(name string) string { return fmt.Sprintf("%08x", crc32.ChecksumIEEE([]byte(name))) }

func lowerHeaders(h http.Header) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		out[strings.ToLower(k)] = strings.Join(v, ", ")
	}
	return out
}

func data(body []byte) any {
	var v any
	if json.Unmarshal(body, &v) == nil {
		return v
	}
	return string(body)
}

func answer(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
