package rewrite

import (
	"github.com/confshim/confshim/internal/sections"
	"hash/maphash"
	"math"
	"math/bits"
	"strconv"
)

// The semantic fingerprint answers "are the client's items the data plane's items?"
// (contract §5.1) without building a tree: one streaming pass per side, no allocation.
// Object key order and whitespace do not change it, nor do escapes ("\/" and "/" are
// the same string) or number spelling (1.0 and 1); an empty array and an empty object
// are the same (APISIX reads [] back as {}), nor an item's top-level modifiedIndex.
// The string hash is seeded per process, so nobody can aim a
// collision at it; 64 bits make an accidental one negligible.

const (
	tagEmpty  = 0x6a09e667f3bcc908
	tagObject = 0xbb67ae8584caa73b
	tagArray  = 0x3c6ef372fe94f82b
	tagString = 0xa54ff53a5f1d36f1
	tagNumber = 0x510e527fade682d1
	tagTrue   = 0x9b05688c2b3e6c1f
	tagFalse  = 0x1f83d9abfb41bd6b
	tagNull   = 0x5be0cd19137e2179
	tagSet    = 0xcbbb9d5dc1059ed8
)

// fmix is murmur3's 64-bit finaliser: a bijection with full avalanche.
func fmix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// orderFree reports whether section's items are compared as a set (§8.1, the table of
// sections): a section the table does not hold keeps its order.
func orderFree(table sections.Table, section string) bool {
	s, _ := table.Lookup(section)
	return s.OrderFree
}

// sectionFingerprint fingerprints a section value (nil: absent, which equals no
// items). Items are combined in order, except in the order-free sections, where the
// same items in another order fingerprint the same (a multiset: the sum of the items'
// mixed hashes; an item's hash covers its id).
func (h *semHasher) sectionFingerprint(section string, b []byte) uint64 {
	h.b, h.i = b, skipWS(b, 0)
	if h.i >= len(b) {
		return tagEmpty
	}
	if b[h.i] != '[' {
		return h.value()
	}
	h.i = skipWS(b, h.i+1)
	if b[h.i] == ']' {
		return tagEmpty
	}
	free := orderFree(h.table, section)
	var ordered, set uint64 = tagArray, 0
	n := uint64(1)
	for ; ; n++ {
		if free {
			set += fmix(h.item() ^ tagSet)
		} else {
			ordered = fmix(ordered ^ bits.RotateLeft64(h.item(), int(n%63)) ^ n)
		}
		h.i = skipWS(b, h.i)
		if b[h.i] == ']' {
			break
		}
		h.i = skipWS(b, h.i+1) // ','
	}
	if free {
		return fmix(set ^ fmix(n^tagSet^tagArray))
	}
	return ordered
}

// item fingerprints one item; its top-level modifiedIndex is not content (§8.1: ADC
// re-stamps it on items it did not change).
func (h *semHasher) item() uint64 {
	if h.b[h.i] != '{' {
		return h.value()
	}
	return h.object(true)
}

func (h *semHasher) value() uint64 {
	b := h.b
	switch c := b[h.i]; c {
	case '{':
		return h.object(false)
	case '[':
		h.i = skipWS(b, h.i+1)
		if b[h.i] == ']' {
			h.i++
			return tagEmpty
		}
		acc := uint64(tagArray)
		for n := uint64(1); ; n++ {
			acc = fmix(acc ^ bits.RotateLeft64(h.value(), int(n%63)) ^ n)
			h.i = skipWS(b, h.i)
			if b[h.i] == ']' {
				h.i++
				return acc
			}
			h.i = skipWS(b, h.i+1)
		}
	case '"':
		return fmix(h.str() ^ tagString)
	case 't':
		h.i += 4
		return tagTrue
	case 'f':
		h.i += 5
		return tagFalse
	case 'n':
		h.i += 4
		return tagNull
	default:
		return h.number()
	}
}

// object fingerprints {…} at h.i, order-independently; an item leaves out its
// modifiedIndex.
func (h *semHasher) object(isItem bool) uint64 {
	b := h.b
	h.i = skipWS(b, h.i+1)
	if b[h.i] == '}' {
		h.i++
		return tagEmpty
	}
	sum := uint64(tagObject)
	for {
		keyStart := h.i + 1
		k := h.str()
		skip := isItem && string(b[keyStart:h.i-1]) == "modifiedIndex"
		h.i = skipWS(b, h.i)
		h.i = skipWS(b, h.i+1) // ':'
		v := h.value()
		if !skip {
			sum += fmix(k*0x9e3779b97f4a7c15 ^ bits.RotateLeft64(v, 29))
		}
		h.i = skipWS(b, h.i)
		if b[h.i] == '}' {
			h.i++
			return fmix(sum)
		}
		h.i = skipWS(b, h.i+1)
	}
}

// str hashes the unescaped content of the string at h.i and moves past it.
func (h *semHasher) str() uint64 {
	b := h.b
	start := h.i + 1
	end, _ := scanString(b, start) // validated already
	h.i = end
	raw := b[start : end-1]
	escaped := false
	for _, c := range raw {
		if c == '\\' {
			escaped = true
			break
		}
	}
	if !escaped {
		return maphash.Bytes(h.seed, raw)
	}
	h.scratch = appendUnescaped(h.scratch[:0], raw)
	return maphash.Bytes(h.seed, h.scratch)
}

func (h *semHasher) number() uint64 {
	b := h.b
	start := h.i
	end, _ := scanNumber(b, start)
	h.i = end
	var f float64
	if v, ok := smallInt(b[start:end]); ok && v < 1e14 && v > -1e14 {
		f = float64(v)
	} else {
		lit := b[start:end]
		f, _ = strconv.ParseFloat(string(lit), 64)
		if significantDigits(lit) > 14 {
			f = asStored(f, h.scratch[:0])
		}
	}
	if f == 0 {
		f = 0 // -0 is 0
	}
	return fmix(math.Float64bits(f) ^ tagNumber)
}

// significantDigits counts a JSON number's mantissa digits from its first non-zero one
// (trailing zeros included: a few more numbers take asStored's slow path, to no harm).
func significantDigits(lit []byte) int {
	n, started := 0, false
	for _, c := range lit {
		switch {
		case c == 'e' || c == 'E':
			return n
		case c >= '1' && c <= '9', c == '0' && started:
			started = true
			n++
		}
	}
	return n
}

// asStored is f as APISIX keeps it: cjson encodes numbers with 14 significant digits
// (%.14g), so a 16-digit float or a 15-digit integer is read back rounded. Two values
// APISIX stores alike are the same content.
func asStored(f float64, scratch []byte) float64 {
	if f == math.Trunc(f) && math.Abs(f) < 1e14 || math.IsInf(f, 0) || math.IsNaN(f) {
		return f
	}
	r, err := strconv.ParseFloat(string(strconv.AppendFloat(scratch, f, 'g', 14, 64)), 64)
	if err != nil {
		return f
	}
	return r
}

// smallInt parses an integer of at most 15 digits without allocating.
func smallInt(s []byte) (int64, bool) {
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		s = s[1:]
	}
	if len(s) == 0 || len(s) > 15 {
		return 0, false
	}
	var v int64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}
