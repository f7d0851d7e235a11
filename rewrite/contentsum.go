package rewrite

import (
	"hash/maphash"
	"strings"
)

// ContentSum fingerprints what a body asks the data plane to hold, leaving out what a
// client stamps afresh on every try: the sections' <section>_conf_version and the
// items' top-level modifiedIndex (ADC stamps both on each sync, §8.1). Two tries of the
// same configuration sum the same; a changed item, a section added or removed, or any
// other member changed sums differently. Members are combined order-free, as JSON
// objects are. A YAML body's members are summed by their bytes. It costs one pass over
// the body, so it is for rare questions (is this the configuration APISIX could not
// store?), not for every sync.
func (rw *Rewriter) ContentSum(p *Prepared) uint64 {
	h := rw.hasher()
	var sum, n uint64
	for i, m := range p.obj.members {
		if strings.HasSuffix(m.name, versionSuffix) {
			continue
		}
		v := p.sums[i]
		if !p.yaml && m.valueStart >= 0 && rw.table.Known(m.name) {
			v = h.sectionFingerprint(m.name, p.body[m.valueStart:m.valueEnd])
		}
		sum += fmix(maphash.String(rw.seed, m.name) ^ fmix(v))
		n++
	}
	return fmix(sum ^ n)
}
