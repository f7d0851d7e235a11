package integration

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fastjson"

	"github.com/confshim/confshim/internal/testsupport/fixture"
)

// firstByteDataPlane is steadyDataPlane that notes when the first byte of each PUT's
// body reached it.
type firstByteDataPlane struct {
	steadyDataPlane
	firstByte atomic.Int64 // unix nanos
}

func (d *firstByteDataPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPut {
		var one [1]byte
		if n, _ := io.ReadFull(r.Body, one[:]); n == 1 {
			d.firstByte.Store(time.Now().UnixNano())
		}
	}
	d.steadyDataPlane.ServeHTTP(w, r)
}

// pacedBody sends a body at a given rate, in 64 KiB pieces, and notes when it gave
// its last byte.
type pacedBody struct {
	body     []byte
	rate     float64 // bytes per second
	off      int
	start    time.Time
	lastByte time.Time
}

func (p *pacedBody) Read(b []byte) (int, error) {
	if p.off == len(p.body) {
		return 0, io.EOF
	}
	if p.start.IsZero() {
		p.start = time.Now()
	}
	due := p.start.Add(time.Duration(float64(p.off) / p.rate * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
	n := copy(b[:min(len(b), 64<<10)], p.body[p.off:])
	p.off += n
	if p.off == len(p.body) {
		p.lastByte = time.Now()
	}
	return n, nil
}

// validateTime is the fastest of a few fastjson.ValidateBytes of body: the unit of
// the paced figures, measured beside each case.
func validateTime(body []byte) time.Duration {
	best := time.Duration(1 << 62)
	for range 5 {
		start := time.Now()
		if fastjson.ValidateBytes(body) != nil {
			panic("fixture is not JSON")
		}
		best = min(best, time.Since(start))
	}
	return best
}

// BenchmarkPacedSync is a sync whose client sends at a network's pace (1 Gbit/s and
// 100 Mbit/s), as a sidecar's ADC does across the pod network: what confshim adds
// after the client's last byte, to APISIX's first byte (dp/validate) and to the
// client's answer (answer/validate), as multiples of ValidateBytes of the body, beside
// a bare reverse proxy. changed alternates two bodies of different lengths (no layout
// to reuse: the whole body is scanned, as it arrives); repeated sends one body again.
// Slow: make bench-paced runs it.
func BenchmarkPacedSync(b *testing.B) {
	for _, routes := range []int{10000, 40000} {
		runtime.GC()
		stale := fixture.Stale(routes)
		shifted := append([]byte("{ "), stale.Request[1:]...)
		dp := &firstByteDataPlane{steadyDataPlane: steadyDataPlane{state: stale.State}}
		_, bareEP, csEP := endpointsFor(b, dp)
		bare, cs := bareEP.url, csEP.url
		for _, rate := range []float64{125e6, 12.5e6} {
			for _, tc := range []struct {
				name   string
				url    string
				bodies [][]byte
			}{
				{"bareproxy", bare, [][]byte{stale.Request}},
				{"confshim-changed", cs, [][]byte{stale.Request, shifted}},
				{"confshim-repeated", cs, [][]byte{stale.Request}},
			} {
				name := fmt.Sprintf("%dk/%gMBps/%s", routes/1000, rate/1e6, tc.name)
				b.Run(name, func(b *testing.B) { pacedRun(b, tc.url, tc.bodies, rate, dp) })
			}
		}
	}
}

func pacedRun(b *testing.B, target string, bodies [][]byte, rate float64, dp *firstByteDataPlane) {
	digests := make([]string, len(bodies))
	for i, body := range bodies {
		digests[i] = sha1Hex(body)
		if _, err := putOnce(b, target, body, digests[i]); err != nil { // warm: state read, record kept
			b.Fatal(err)
		}
	}
	unit := validateTime(bodies[0]) // beside each case: the machine is shared
	var toDP, toAnswer time.Duration
	n := 0
	for b.Loop() {
		body := bodies[n%len(bodies)]
		pb := &pacedBody{body: body, rate: rate}
		req, _ := http.NewRequest(http.MethodPut, target+"/apisix/admin/configs", pb)
		req.ContentLength = int64(len(body))
		req.Header.Set("X-Digest", digests[n%len(bodies)])
		resp, err := benchClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered := time.Now()
		if resp.StatusCode/100 != 2 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		toDP += time.Unix(0, dp.firstByte.Load()).Sub(pb.lastByte)
		toAnswer += answered.Sub(pb.lastByte)
		n++
	}
	b.ReportMetric(float64(toDP)/float64(n)/float64(unit), "dp/validate")
	b.ReportMetric(float64(toAnswer)/float64(n)/float64(unit), "answer/validate")
	b.ReportMetric(float64(unit.Microseconds()), "validate-µs")
	b.SetBytes(int64(len(bytes.TrimSpace(bodies[0]))))
}
