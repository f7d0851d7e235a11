package integration

import (
	"flag"
	"net/http"
	"runtime"
	"strconv"
	"testing"
)

// TestMain runs more parallel tests at a time than go test's default (GOMAXPROCS): each
// has its own emulator and proxy and spends most of its time waiting on them (the
// workers' lag, a watch's interval, a deadline), not on a CPU. An explicit -parallel
// wins.
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", strconv.Itoa(4*runtime.GOMAXPROCS(0)))
	}
	m.Run()
}

// testHTTP makes the requests the tests send themselves, on a transport of its own:
// every httptest.Server's Close closes http.DefaultTransport's idle connections, and a
// request that had just taken one fails ("CloseIdleConnections called") when another
// test ends beside it.
var testHTTP = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
