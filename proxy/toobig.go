package proxy

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/confshim/confshim/internal/syncmachine"
	"github.com/confshim/confshim/metrics"
)

// dictSetting is APISIX's setting that bounds the configuration it can store.
const dictSetting = "nginx_config.meta.lua_shared_dict.standalone-config"

// tooBig answers a configuration that does not fit APISIX's standalone-config dict:
// 500, as APISIX answered it, with a message that names the size and the setting to
// raise (APISIX's own says only "no memory"). A repeat that confshim did not send says
// when it will be sent again, also as Retry-After.
func (rp replies) tooBig(w http.ResponseWriter, f *syncmachine.Failure, now time.Time) {
	o := f.Oversized
	by := metrics.TooBigByAPISIX
	msg := fmt.Sprintf("APISIX could not store the configuration: %d bytes (%s) as sent do not fit its standalone-config shared dict "+
		"(failed to save config to shared dict: no memory; the dict no longer holds the previous configuration either, the workers keep serving it); "+
		"raise %s in APISIX's config.yaml well above that size (the stored document and the dict's own overhead take more than the body: twice it is safe; default 10m) and restart APISIX",
		o.Bytes, mebibytes(o.Bytes), dictSetting)
	if f.Repeat {
		by = metrics.TooBigByConfshim
		wait := max(f.RetryAt().Sub(now), time.Second).Round(time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)))
		msg += fmt.Sprintf("; APISIX refused this configuration (the same content, whatever its versions) at %s and the data plane holds what it held then, or nothing, "+
			"so it was not sent again: it is sent from %s on, or at once when it changes or another configuration lands on the data plane",
			o.At.UTC().Format(time.RFC3339), f.RetryAt().UTC().Format(time.RFC3339))
	}
	rp.m.ConfigTooBig.WithLabelValues(string(by)).Inc()
	rp.m.ConfigTooBigBytes.Set(float64(o.Bytes))
	rp.log.Error().Str("event", "config_too_big").Int("bytes", o.Bytes).Bool("sent", !f.Repeat).Str("setting", dictSetting).
		Msg("the configuration does not fit APISIX's standalone-config shared dict; raise the setting and restart APISIX")
	writeError(w, http.StatusInternalServerError, msg)
}

// mebibytes spells a size for people: 12.3 MiB.
func mebibytes(n int) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
