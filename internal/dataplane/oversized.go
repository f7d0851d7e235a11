package dataplane

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Oversized is a configuration APISIX validated but could not store: larger than its
// standalone-config shared dict. ADC sends the same configuration again on every sync,
// with fresh versions, and each try costs APISIX a decode of all of it and fails the
// same way; so while neither the configuration (Content, rewrite.ContentSum) nor what
// the data plane holds (Holds) changed, it is not sent again for a while.
type Oversized struct {
	Content uint64    // the client's configuration, without versions or modifiedIndex
	Known   bool      // Content was taken (a body sent as it came is not recognised again)
	Holds   string    // what the data plane held when APISIX refused it (View.Holds)
	At      time.Time // when APISIX refused it
	Bytes   int       // the body sent
}

// maxOversized is how many refused configurations are remembered: two controllers
// taking turns each send their own.
const maxOversized = 4

// Oversized records APISIX's refusal of a configuration that does not fit its dict,
// replacing an earlier refusal of the same content. A PUT that lands forgets them all.
func (t *Tx) Oversized(o Oversized) {
	b := t.b
	defer b.publish()
	b.oversized = slices.DeleteFunc(slices.Clone(b.oversized), func(p Oversized) bool { return o.Known && p.Known && p.Content == o.Content })
	b.oversized = append(b.oversized, o)
	if len(b.oversized) > maxOversized {
		b.oversized = b.oversized[len(b.oversized)-maxOversized:]
	}
}

// Holds names the configuration the data plane holds as the view has it: its digest
// and each section's version; "" when it holds nothing (restarted — or emptied by the
// refusal itself: APISIX's dict frees the document it replaces before it finds the new
// one does not fit) and when the state is not known.
func (v View) Holds() string {
	if v.State == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString(v.Digest)
	for _, s := range slices.Sorted(maps.Keys(v.State.Versions)) {
		if ver := v.State.Versions[s]; ver != 0 {
			b.WriteString("\x00" + s + "=" + strconv.FormatFloat(ver, 'g', -1, 64))
		}
	}
	return b.String()
}
