package dataplane

import "time"

// Oversized is a configuration APISIX validated but could not store: larger than its
// standalone-config shared dict. ADC sends the same configuration again on every sync,
// with fresh versions, and each try costs APISIX a decode of all of it and fails the
// same way; so while neither the configuration (its Content, rewrite.ContentSum) nor
// the data plane (Digest and LastModified, as confshim last knew them) changed, it is
// not sent again before a minute has passed.
type Oversized struct {
	Content              uint64    // the client's configuration, without versions or modifiedIndex
	Digest, LastModified string    // the data plane's state when APISIX refused it
	At                   time.Time // when APISIX last refused it
	Bytes                int       // the body sent
}

// Oversized records APISIX's refusal of a configuration that does not fit its dict
// (nil: forget it). An accepted PUT forgets it too.
func (t *Tx) Oversized(o *Oversized) {
	b := t.b
	defer b.publish()
	b.oversized = o
}
