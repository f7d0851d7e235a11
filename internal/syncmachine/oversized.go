package syncmachine

import (
	"time"

	"github.com/confshim/confshim/internal/dataplane"
)

// OversizedPatience is how long a configuration APISIX could not store is not sent
// again while neither it nor the data plane changed: each try makes APISIX decode and
// validate all of it before it fails the same way (issue 46; the contract is silent).
const OversizedPatience = time.Minute

// tooBig: APISIX validated the PUT but could not store it (its standalone-config dict
// is smaller). The client is told the size and the setting to raise, and the refusal
// is remembered so that the same configuration is not sent again for a while.
func (s *Sync) tooBig(sent Outgoing) Action {
	o := &dataplane.Oversized{At: s.now, Bytes: len(sent.Body)}
	if s.in.Prepared != nil {
		v := s.tx.View()
		o.Content, o.Digest, o.LastModified = s.cfg.Rewriter.ContentSum(s.in.Prepared), v.Digest, v.LastModified
		s.tx.Oversized(o)
	}
	return s.fail(Failure{Kind: FailTooBig, Oversized: o, RetryAt: o.At.Add(OversizedPatience)})
}

// refusedAgain is the refusal this sync would meet again, if APISIX refused the same
// configuration on the same data plane less than OversizedPatience ago (nil: send it).
// "The same" is the content (rewrite.ContentSum), not the bytes: ADC stamps fresh
// versions and modifiedIndex on every try.
func (s *Sync) refusedAgain() *dataplane.Oversized {
	v := s.tx.View()
	o := v.Oversized
	if o == nil || s.in.Prepared == nil || v.State == nil || o.Digest != v.Digest || o.LastModified != v.LastModified ||
		!s.now.Before(o.At.Add(OversizedPatience)) || s.cfg.Rewriter.ContentSum(s.in.Prepared) != o.Content {
		return nil
	}
	return o
}
