package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// statusClientGone is logged and counted for a client that went away: nothing reaches it.
const statusClientGone = 499

// badStateError: APISIX answered the state read, but not with a usable document.
type badStateError struct{ Err error }

func (e badStateError) Error() string { return e.Err.Error() }

// replies answers a request when confshim, not APISIX, has the last word: each answer
// counted and logged once, in APISIX's error shape.
type replies struct {
	log             zerolog.Logger
	m               *metrics.Metrics
	upstreamTimeout time.Duration // --upstream-timeout, named in a timeout's message
}

// writeError answers like APISIX does, so ADC shows the message: {"error_msg":"confshim: …"}.
func writeError(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	body, _ := json.Marshal(struct {
		ErrorMsg string `json:"error_msg"`
	}{"confshim: " + msg})
	_, _ = w.Write(append(body, '\n'))
}

// clientGone counts a client that went away; nothing reaches it.
func (rp replies) clientGone(w http.ResponseWriter) {
	rp.m.ClientDisconnects.Inc()
	w.WriteHeader(statusClientGone) // never reaches the client; keeps the access log honest
}

// upstreamFailed answers a request that got no HTTP answer from APISIX: 504 on a
// timeout, 502 otherwise; a client that went away gets nothing and is counted apart.
func (rp replies) upstreamFailed(w http.ResponseWriter, r *http.Request, err error, what string) {
	kind, status := apisix.Classify(r.Context(), err)
	if kind == apisix.ClientGone {
		rp.log.Debug().Str("path", r.URL.Path).Msg("client went away")
		rp.clientGone(w)
		return
	}
	rp.m.UpstreamError(kind)
	rp.log.Warn().Str("kind", string(kind)).Str("op", what).Str("error", apisix.SafeError(err)).Msg("upstream request failed")
	msg := "upstream " + string(kind) + ": " + what
	switch {
	case errors.Is(err, apisix.ErrConnectionHeld):
		msg = err.Error() + ": " + what
	case kind == metrics.Timeout:
		msg = fmt.Sprintf("upstream did not answer within --upstream-timeout (%s): %s", rp.upstreamTimeout, what)
	}
	writeError(w, status, msg)
}

// stateReadFailed answers a PUT whose data plane state could not be read, saying what
// the sync did (outcome). An answer APISIX gave but confshim cannot use is a 502; no
// answer at all is classified like any upstream failure (502, or 504 on a timeout).
func (rp replies) stateReadFailed(w http.ResponseWriter, r *http.Request, err error, outcome string) {
	var status apisix.StatusError
	var bad badStateError
	if errors.As(err, &status) || errors.As(err, &bad) {
		rp.m.UpstreamError(metrics.OtherError)
		writeError(w, http.StatusBadGateway, "cannot read the data plane's state: "+err.Error()+"; "+outcome)
		return
	}
	rp.upstreamFailed(w, r, err, "read the data plane's state; "+outcome)
}

// tieLost answers a sync whose changed sections a writer's copy at the very version it
// sent kept out (§5.1: APISIX keeps what it holds at an equal version) and that could not
// send them again. The rest of the sync is applied; the client syncs again.
func (rp replies) tieLost(w http.ResponseWriter, ties []rewrite.Change) {
	names := make([]string, 0, len(ties))
	for _, c := range ties {
		names = append(names, fmt.Sprintf("%s (%s)", rewrite.Clip(c.Section), strconv.FormatFloat(c.To, 'f', -1, 64)))
	}
	rp.log.Warn().Str("event", "tie_lost").Strs("sections", names).Msg("a writer set sections to the version the sync sent; the client's change there did not land")
	writeError(w, http.StatusConflict, "another writer set "+strings.Join(names, ", ")+
		" to the very version this sync sent, while it was applied: APISIX keeps what it holds at an equal version, so the client's change there did not land, and the sync could not send it again (decided again once already, or its budget ended); the rest of the sync is applied; sync again")
}

// tieUnverified is the outcome of a sync whose accepted PUT could not be read back.
func tieUnverified(ties []rewrite.Change) string {
	names := make([]string, 0, len(ties))
	for _, c := range ties {
		names = append(names, rewrite.Clip(c.Section))
	}
	return "APISIX accepted this sync's PUT, but reading back " + strings.Join(names, ", ") +
		" failed: sent at the data plane's version + 1, the version a writer's read-modify-write picks too, the 2xx alone does not show the client's change landed (the rest of the sync is applied); sync again"
}

// refuse answers a body confshim must not forward (contract §6): 400, nothing forwarded.
func (rp replies) refuse(w http.ResponseWriter, refuse *rewrite.RefuseError) {
	rp.m.Refuse(metrics.RefusedUnrepairable)
	rp.log.Info().Str("event", "refused").Str("reason", refuse.Reason).Msg("configs PUT refused; nothing forwarded")
	writeError(w, http.StatusBadRequest, refuse.Reason)
}
