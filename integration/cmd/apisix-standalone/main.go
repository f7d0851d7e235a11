// Command apisix-standalone serves the APISIX standalone Admin API emulator, so that
// confshim can be tried (make run) and tested without a real APISIX. It logs its start
// and, with -v, one line per request; quiet by default, so that `make run` shows
// confshim's log, not confshim's once-a-second ping answered.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/confshim/confshim/internal/testsupport/emulator"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "apisix-standalone:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends; its log goes to logOut.
func run(ctx context.Context, args []string, logOut io.Writer) error {
	fs := flag.NewFlagSet("apisix-standalone", flag.ContinueOnError)
	fs.SetOutput(logOut)
	listen := fs.String("listen", "127.0.0.1:9180", "address of the emulated Admin API")
	adminKey := fs.String("admin-key", os.Getenv("APISIX_ADMIN_KEY"), "admin key (X-API-KEY); empty disables authentication (default $APISIX_ADMIN_KEY, as an APISIX config.yaml may read it)")
	version := fs.String("apisix-version", "3.17.0", "APISIX version to model: 3.13.x, 3.14.x, 3.17.x …")
	fill := fs.Bool("fill-defaults", false, "store routes and upstreams with default fields filled in (stress option)")
	dictSize := fs.String("standalone-config-size", "10m", "size of the standalone-config shared dict, as nginx spells it (10m, 512k, 2097152): a configuration that does not fit is answered 500 \"failed to save config to shared dict: no memory\"")
	var verbose bool
	fs.BoolVar(&verbose, "v", false, "log one line per request (method, path, status, size, time)")
	fs.BoolVar(&verbose, "verbose", false, "same as -v")
	if err := fs.Parse(args); err != nil {
		return err
	}
	size, err := nginxSize(*dictSize)
	if err != nil {
		return fmt.Errorf("--standalone-config-size: %w", err)
	}
	em, err := emulator.New(emulator.Options{Version: *version, AdminKey: *adminKey, FillDefaults: *fill, DictSize: size})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	logger := log.New(logOut, "", log.LstdFlags)
	var handler http.Handler = em
	if verbose {
		handler = logRequests(logger, em)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	logger.Printf("APISIX %s standalone Admin API emulator on http://%s", em.Version(), ln.Addr())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-done
	return nil
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets the emulator flush its headers early, as nginx does (chunked answers).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// logRequests logs one line per request; never the query (it may carry api_key).
func logRequests(logger *log.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		logger.Printf("%s %s %d %dB %s", r.Method, r.URL.Path, rec.status, r.ContentLength, time.Since(start).Round(time.Microsecond))
	})
}

// nginxSize reads a size as nginx's configuration spells it: bytes, or k/m/g (either
// case) for KiB, MiB and GiB.
func nginxSize(s string) (int, error) {
	unit := 1
	switch {
	case strings.HasSuffix(s, "k"), strings.HasSuffix(s, "K"):
		unit = 1 << 10
	case strings.HasSuffix(s, "m"), strings.HasSuffix(s, "M"):
		unit = 1 << 20
	case strings.HasSuffix(s, "g"), strings.HasSuffix(s, "G"):
		unit = 1 << 30
	}
	digits := s
	if unit > 1 {
		digits = s[:len(s)-1]
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n <= 0 || n > math.MaxInt/unit {
		return 0, fmt.Errorf("%q is not a size (bytes, or a number with k, m or g)", s)
	}
	return n * unit, nil
}
