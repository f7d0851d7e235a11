//go:build soak

// The soak (make soak): the confshim binary in front of the emulator, driven by
// ADC-like clients through a few minutes of seeded events — configuration changes,
// out-of-band secrets, leader changes, data-plane restarts at every point of a sync and
// at idle, confshim restarts with and without --state-dir — and after every sync and
// every idle pause a check that the data plane holds exactly the desired configuration
// and the operator's secrets. A failure prints its seed: SOAK_SEED=<seed> make soak
// replays it. SOAK_DURATION (default 2m) sets the length.

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/emulator"
)

// soakHook restarts the data plane at a chosen point of the next sync.
type soakHook struct {
	armed atomic.Int32 // 0 off, 1 after the next configs HEAD, 2 instead of the next PUT, 3 after the next probe
	done  chan struct{}
	s     *stack
	t     *testing.T
}

func (h *soakHook) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mode := h.armed.Load()
		hit := (mode == 1 && r.Method == http.MethodHead && r.URL.Path == "/apisix/admin/configs") ||
			(mode == 2 && r.Method == http.MethodPut) ||
			(mode == 3 && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength <= 2)
		if !hit || !h.armed.CompareAndSwap(mode, 0) {
			next.ServeHTTP(w, r)
			return
		}
		if mode != 2 {
			next.ServeHTTP(w, r)
			http.NewResponseController(w).Flush()
		}
		h.s.restartDataPlane(h.t, time.Duration(50+rand.IntN(300))*time.Millisecond)
		close(h.done)
	})
}

type soak struct {
	t        *testing.T
	rng      *rand.Rand
	seed     uint64
	s        *stack
	hook     *soakHook
	bin      *runningBinary
	listen   string
	stateDir string
	withDir  bool
	clients  [2]*adcclient.Client
	leader   int
	variant  string
	token    string // the operator's vault token; "" before the first
	// known is the newest token confshim is sure to have seen: it learns an out-of-band
	// write at the next sync, at its first look after a start, or at the watch's next
	// look (on this small configuration every interval or so, by the cost budget). A
	// data plane that restarts before that gets the previous token back, the newest one
	// confshim knew: the documented limit of a watch that does not decode the
	// configuration at every ping. pending are the tokens written since known, oldest
	// first; after a restart the data plane may hold any of them (the watch learnt it in
	// time): newer lists those.
	known   string
	pending []string
	newer   []string
	events  map[string]int
}

func (k *soak) fail(format string, a ...any) {
	k.t.Helper()
	k.t.Fatalf("seed %d (replay: SOAK_SEED=%d make soak): %s\nconfshim log tail:\n%s", k.seed, k.seed, fmt.Sprintf(format, a...), tail(k.bin.logs.String(), 40))
}

// startConfshim (re)starts the binary on the same address, with or without the state dir.
func (k *soak) startConfshim(withDir bool) {
	if k.bin != nil {
		_ = k.bin.cmd.Process.Signal(os.Interrupt)
		_ = k.bin.cmd.Wait()
	}
	k.withDir = withDir
	args := []string{"--listen", k.listen, "--admin-key", adminKey, "--reseed-interval", "100ms", "--log-level", "debug"}
	if withDir {
		args = append(args, "--state-dir", k.stateDir)
	}
	k.bin = startBinary(k.t, k.s.dpURL, args...)
}

// holds reports what is wrong with the data plane, or "".
func (k *soak) holds() string {
	doc := k.s.em.Document()
	if doc == nil {
		return "the data plane holds nothing"
	}
	want := config(k.variant)
	for _, section := range []string{"routes", "services", "upstreams", "consumers", "global_rules"} {
		raw, _ := json.Marshal(doc[section])
		if got, w := canonicalItems(raw), wantItems(want, section); got != w {
			return fmt.Sprintf("%s: %s, want %s", section, got, w)
		}
	}
	raw, _ := json.Marshal(doc["secrets"])
	for _, newer := range k.newer {
		if strings.Contains(string(raw), `"token":"`+newer+`"`) {
			k.token, k.known, k.newer, k.pending = newer, newer, nil, nil // the watch had learnt it in time
			return ""
		}
	}
	if k.token == "" {
		if string(raw) != "null" {
			return "secrets appeared: " + string(raw)
		}
	} else if !strings.Contains(string(raw), `"token":"`+k.token+`"`) {
		return fmt.Sprintf("secrets: %s, want token %s", raw, k.token)
	}
	return ""
}

// eventually waits up to d for the data plane to hold the desired configuration.
func (k *soak) eventually(d time.Duration, what string) {
	k.t.Helper()
	deadline := time.Now().Add(d)
	for {
		msg := k.holds()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			k.fail("%s: after %v %s", what, d, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sync is the leader's sync of the current variant, retried as ADC's next tick would
// when it did not land (a restart cut it: nothing was forwarded).
func (k *soak) sync() {
	k.t.Helper()
	c := k.clients[k.leader]
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		res, err := c.Sync(ctx, config(k.variant))
		cancel()
		if err == nil && res.Status/100 == 2 {
			break
		}
		if attempt == 20 {
			k.fail("sync of %s never landed: %v %+v", k.variant, err, res)
		}
		if err == nil && res.Status/100 == 4 {
			k.fail("sync of %s rejected: %d %s", k.variant, res.Status, res.Body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if msg := k.holds(); msg != "" {
		k.fail("after a landed sync of %s: %s", k.variant, msg)
	}
	k.known, k.newer, k.pending = k.token, nil, nil
}

// restarted: the data plane lost what confshim had not seen yet (or it comes back, when
// the watch had seen it).
func (k *soak) restarted() {
	k.newer = append([]string(nil), k.pending...)
	k.token = k.known
}

// rotate is the operator's out-of-band write: a new vault token straight on the data plane.
func (k *soak) rotate() {
	k.token = fmt.Sprintf("token-%d", k.rng.IntN(1e6))
	k.pending = append(k.pending, k.token)
	k.s.oobPut(k.t, func(doc map[string]any) {
		v, _ := doc["secrets_conf_version"].(float64)
		doc["secrets_conf_version"] = v + 1
		doc["secrets"] = []any{map[string]any{"id": "vault/1", "uri": "http://vault:8200", "prefix": "kv", "token": k.token}}
	})
}

func (k *soak) newVariant() { k.variant = fmt.Sprintf("v%d", k.rng.IntN(1000)) }

func (k *soak) step() {
	switch n := k.rng.IntN(12); n {
	case 0, 1:
		k.events["change"]++
		k.newVariant()
		k.sync()
	case 2:
		k.events["same"]++
		k.sync()
	case 3:
		k.events["secrets"]++
		k.rotate()
		if k.rng.IntN(2) == 0 {
			k.sync()
		}
	case 4:
		k.events["restart idle"]++
		k.s.restartDataPlane(k.t, time.Duration(50+k.rng.IntN(500))*time.Millisecond)
		k.restarted()
		k.eventually(3*time.Second, "re-seed after an idle restart")
	case 5, 6:
		// 1: between a state read (a HEAD, the sync's or the watch's) and the PUT, 3:
		// between the sync's probe and its PUT (decided unread on confshim's belief), 2:
		// during the PUT
		mode := int32(n - 4)
		if mode == 1 && k.rng.IntN(2) == 0 {
			mode = 3
		}
		k.events[map[int32]string{1: "restart after a HEAD", 2: "restart during PUT", 3: "restart after the probe"}[mode]]++
		k.hook.done = make(chan struct{})
		k.hook.armed.Store(mode)
		k.restarted() // the sync's own state read tells confshim the newest token first
		if k.rng.IntN(2) == 0 {
			k.newVariant()
		}
		k.sync()
		if k.hook.armed.Swap(0) == 0 {
			<-k.hook.done
		}
		k.eventually(3*time.Second, "after a restart inside a sync")
	case 7:
		k.events["leader change"]++
		k.leader = 1 - k.leader
		if k.rng.IntN(2) == 0 {
			k.newVariant()
		}
		k.sync()
	case 8:
		withDir := k.rng.IntN(3) > 0
		k.events[fmt.Sprintf("confshim restart (state dir %v)", withDir)]++
		k.startConfshim(withDir)
		time.Sleep(300 * time.Millisecond) // its first look at the data plane
		if withDir {
			k.known, k.pending = k.token, nil
		}
		if !withDir {
			// memory only: what the data plane holds is unknown to the new process until a
			// sync lands, so a data-plane restart before it loses the operator's secrets by
			// design (§8.4); the soak syncs first
			k.sync()
		}
	case 10:
		// the restart moments of issue 30: a bypassCache sync (a cold client cache, read
		// from the data plane through confshim) the instant the data plane answers
		// again, sometimes right after the operator rotated the secret
		rotated := k.rng.IntN(2) == 0
		k.events[map[bool]string{false: "bypassCache sync as the data plane returns", true: "secret rotated, restart, bypassCache sync"}[rotated]]++
		if rotated {
			k.rotate()
		}
		k.s.restartDataPlane(k.t, time.Duration(50+k.rng.IntN(300))*time.Millisecond)
		k.restarted()
		k.clients[k.leader].Invalidate()
		k.sync()
		k.eventually(3*time.Second, "after a bypassCache sync as the data plane came back")
	case 11:
		k.events["rotated, then an idle restart"]++
		k.rotate()
		k.s.restartDataPlane(k.t, time.Duration(50+k.rng.IntN(300))*time.Millisecond)
		k.restarted()
		k.eventually(3*time.Second, "re-seed after a restart right behind a rotation")
	case 9:
		k.events["idle"]++
		time.Sleep(time.Duration(200+k.rng.IntN(800)) * time.Millisecond)
		if msg := k.holds(); msg != "" {
			k.fail("at idle: %s", msg)
		}
	}
}

func TestSoak(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SOAK_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	duration := 2 * time.Minute
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		duration = d
	}
	t.Logf("seed %d, %v", seed, duration)
	hook := &soakHook{t: t, done: make(chan struct{})}
	dp := apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{AdminKey: adminKey}, Wrap: hook.wrap})
	s := &stack{em: dp.Emulator, logs: &syncBuffer{}, dp: dp, dpURL: dp.URL, timeout: 10 * time.Second}
	hook.s = s
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	ln.Close()
	k := &soak{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed: seed, s: s, hook: hook,
		listen: listen, stateDir: t.TempDir(), events: map[string]int{}, variant: "v0"}
	k.startConfshim(true)
	url := "http://" + listen
	k.clients = [2]*adcclient.Client{adcclient.New(url, adminKey), adcclient.New(url, adminKey)}
	k.sync()
	steps := 0
	for start := time.Now(); time.Since(start) < duration; steps++ {
		k.step()
	}
	t.Logf("seed %d: %d steps, every check held; events %v", seed, steps, k.events)
}
