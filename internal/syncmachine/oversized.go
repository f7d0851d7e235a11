package syncmachine

import (
	"time"

	"github.com/confshim/confshim/internal/dataplane"
)

// OversizedPatience is how long a configuration APISIX could not store is not sent
// again while neither it nor what the data plane holds changed: each try makes APISIX
// decode and validate all of it before it fails the same way (issue 46; the contract
// is silent).
const OversizedPatience = time.Minute

// tooBig: APISIX validated the PUT but could not store it (its standalone-config dict
// is smaller). The client is told the size and the setting to raise, and the refusal
// is remembered so that the same configuration is not sent again for a while. What the
// data plane held is taken from the belief before the PUT: the refusal itself empties
// APISIX's dict.
func (s *Sync) tooBig(sent Outgoing) Action {
	o := dataplane.Oversized{At: s.now, Bytes: len(sent.Body), Holds: s.tx.View().Holds()}
	if s.in.Prepared != nil {
		o.Content, o.Known = s.cfg.Rewriter.ContentSum(s.in.Prepared), true
	}
	s.tx.Oversized(o)
	s.tx.AskRefresh() // APISIX's dict lost what it held: the watch looks, and puts it back, at once
	return s.fail(Failure{Kind: FailTooBig, Oversized: &o})
}

// refusedAgain is the refusal this sync would meet again (nil: send it): APISIX refused
// the same configuration less than OversizedPatience ago, and the data plane holds what
// it held then, or nothing (APISIX emptied its dict when it refused it; a restart looks
// the same, so a restart with a larger dict is tried at the latest a minute after the
// refusal). "The same" is the content (rewrite.ContentSum), not the bytes: ADC stamps
// fresh versions and modifiedIndex on every try.
func (s *Sync) refusedAgain(v dataplane.View) *dataplane.Oversized {
	if len(v.Oversized) == 0 || s.in.Prepared == nil || v.State == nil || s.round.res == nil || s.round.untouched != "" {
		return nil
	}
	holds := v.Holds()
	var sum uint64
	summed := false
	for i := len(v.Oversized) - 1; i >= 0; i-- {
		o := v.Oversized[i]
		if !o.Known || !s.now.Before(o.At.Add(OversizedPatience)) || (holds != "" && holds != o.Holds) {
			continue
		}
		if !summed {
			sum, summed = s.cfg.Rewriter.ContentSum(s.in.Prepared), true
		}
		if sum == o.Content {
			return &o
		}
	}
	return nil
}
