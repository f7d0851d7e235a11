// Command benchplot draws BENCHMARKS.md's plot from `go test -bench` output: the
// latency confshim adds over a plain reverse proxy, against body size, next to the
// cost of validating the body once (the floor for any proxy that looks at it).
//
//	cd tools/benchplot && go run . < ../../bench.txt > ../../docs/added-latency.png
//
// It is its own module so that its font dependency stays out of confshim's.
package main

import (
	"bufio"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

var line = regexp.MustCompile(`^Benchmark(EndToEnd|Validate)/([^/\s-]+)(?:/(\S+?))?(?:-\d+)?\s+\d+\s+([\d.]+) ns/op\s+([\d.]+) MB/s`)

type point struct{ sizeMB, ms float64 }

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

// parse returns the median ns/op and the body size per (series, fixture).
func parse(r io.Reader) (map[string]map[string]float64, map[string]float64, error) {
	samples := map[string]map[string][]float64{}
	sizes := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		series := m[1]
		if m[3] != "" {
			series = m[3]
		}
		ns, _ := strconv.ParseFloat(m[4], 64)
		mbps, _ := strconv.ParseFloat(m[5], 64)
		if samples[series] == nil {
			samples[series] = map[string][]float64{}
		}
		samples[series][m[2]] = append(samples[series][m[2]], ns)
		sizes[m[2]] = mbps * ns / 1e9 // MB
	}
	med := map[string]map[string]float64{}
	for s, byFixture := range samples {
		med[s] = map[string]float64{}
		for f, v := range byFixture {
			sort.Float64s(v)
			med[s][f] = v[len(v)/2]
		}
	}
	return med, sizes, sc.Err()
}

func run(r io.Reader, w io.Writer) error {
	med, sizes, err := parse(r)
	if err != nil {
		return err
	}
	if med["bareproxy"] == nil || med["confshim"] == nil {
		return fmt.Errorf("no BenchmarkEndToEnd bareproxy/confshim lines on stdin")
	}
	series := []struct {
		name  string
		col   color.RGBA
		value func(f string) (float64, bool)
	}{
		{"confshim - bareproxy (3 stale sections + secrets; below 0 drawn at 0)", color.RGBA{200, 40, 40, 255}, diff(med, "confshim")},
		{"confshim-clean - bareproxy (nothing to repair; below 0 drawn at 0)", color.RGBA{40, 110, 200, 255}, diff(med, "confshim-clean")},
		{"confshim-rescan - bareproxy (another length: the whole body scanned)", color.RGBA{230, 140, 20, 255}, diff(med, "confshim-rescan")},
		{"fastjson.ValidateBytes of the body", color.RGBA{90, 90, 90, 255}, func(f string) (float64, bool) { v, ok := med["Validate"][f]; return v / 1e6, ok }},
	}
	fixtures := make([]string, 0, len(sizes))
	for f := range sizes {
		if _, ok := med["confshim"][f]; ok {
			fixtures = append(fixtures, f)
		}
	}
	sort.Slice(fixtures, func(i, j int) bool { return sizes[fixtures[i]] < sizes[fixtures[j]] })

	const W, H, left, right, top, bottom = 900, 560, 80, 30, 40, 130
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	maxX, maxY := 0.0, 0.0
	for _, f := range fixtures {
		maxX = math.Max(maxX, sizes[f])
		for _, s := range series {
			if v, ok := s.value(f); ok {
				maxY = math.Max(maxY, v)
			}
		}
	}
	minX := math.Inf(1)
	for _, f := range fixtures {
		minX = math.Min(minX, sizes[f])
	}
	// body sizes span two orders of magnitude: a log axis
	lo, hi := math.Log10(minX)-0.15, math.Log10(maxX)+0.15
	maxY *= 1.15
	px := func(x float64) int { return left + int((math.Log10(x)-lo)/(hi-lo)*float64(W-left-right)) }
	py := func(y float64) int { return H - bottom - int(y/maxY*float64(H-top-bottom)) }
	grey := color.RGBA{200, 200, 200, 255}
	for i := 0; i <= 5; i++ {
		y := maxY * float64(i) / 5
		hline(img, left, W-right, py(y), grey)
		text(img, 8, py(y)+4, fmt.Sprintf("%6.1f ms", y), color.Black)
	}
	for _, f := range fixtures {
		vline(img, px(sizes[f]), top, H-bottom, grey)
		text(img, px(sizes[f])-20, H-bottom+18, fmt.Sprintf("%s (%.1f MB)", f, sizes[f]), color.Black)
	}
	text(img, left, 22, "Latency confshim adds to one configs PUT, against body size (loopback, median)", color.Black)
	text(img, W/2-90, H-bottom+40, "request body size (MB, log scale)", color.Black)
	for i, s := range series {
		prevX, prevY := -1, -1
		for _, f := range fixtures {
			v, ok := s.value(f)
			if !ok {
				continue
			}
			x, y := px(sizes[f]), py(v)
			dot(img, x, y, s.col)
			if prevX >= 0 {
				segment(img, prevX, prevY, x, y, s.col)
			}
			prevX, prevY = x, y
		}
		ly := H - bottom + 62 + i*18
		segment(img, left, ly-4, left+30, ly-4, s.col)
		text(img, left+40, ly, s.name, color.Black)
	}
	return png.Encode(w, img)
}

func diff(med map[string]map[string]float64, name string) func(string) (float64, bool) {
	return func(f string) (float64, bool) {
		a, ok1 := med[name][f]
		b, ok2 := med["bareproxy"][f]
		return math.Max(0, a-b) / 1e6, ok1 && ok2
	}
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(strings.TrimSpace(s))
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	for y := y0; y <= y1; y++ {
		img.Set(x, y, c)
	}
}

func dot(img *image.RGBA, x, y int, c color.Color) {
	for dx := -3; dx <= 3; dx++ {
		for dy := -3; dy <= 3; dy++ {
			img.Set(x+dx, y+dy, c)
		}
	}
}

func segment(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	steps := int(math.Max(math.Abs(float64(x1-x0)), math.Abs(float64(y1-y0))))
	for i := 0; i <= steps; i++ {
		t := float64(i) / math.Max(1, float64(steps))
		x := x0 + int(t*float64(x1-x0))
		y := y0 + int(t*float64(y1-y0))
		img.Set(x, y, c)
		img.Set(x, y+1, c)
	}
}
