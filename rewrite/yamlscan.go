package rewrite

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// A YAML body is repaired like a JSON one (contract §5.6): the client's own bytes go
// to APISIX with only top-level version values changed and dropped sections' lines
// removed, so lyaml reads every item exactly as the client wrote it (merge keys,
// anchors, YAML 1.1 scalars and all). confshim never builds a tree of the document:
// one pass follows the token structure that decides where top-level keys are — quoted
// scalars, flow collections, block scalars, multi-line plain scalars and the block
// indentation libyaml keeps — and nothing else. Memory is the member list; time is
// linear in the body.
//
// What the pass cannot place with certainty is refused (400), never guessed: a
// top-level mapping that is not a block mapping at column 0 (except a body that is
// plain JSON), tags, anchors or aliases on the document or on its keys, a top-level
// merge key, directives, tabs as indentation, a version that is not a one-line scalar.

// checkAnchors refuses a splice that would leave an alias without its anchor.
func (o *object) checkAnchors(drop []bool) error {
	if o.yaml == nil || len(o.yaml.aliases) == 0 {
		return nil
	}
	dropped := map[string]bool{}
	for _, a := range o.yaml.anchors {
		if a.member >= 0 && drop[a.member] {
			dropped[a.name] = true
		}
	}
	for _, a := range o.yaml.aliases {
		if dropped[a.name] && (a.member < 0 || !drop[a.member]) {
			return &RefuseError{Reason: fmt.Sprintf("the YAML alias *%s refers to an anchor in a section confshim removes (%s): send the section without it, or JSON", clip(a.name), o.members[o.anchorMember(a.name)].name)}
		}
	}
	return nil
}

// aliasedMembers marks the members holding an anchor that an alias in another member
// refers to: such a member is never thinned (§8.3), since leaving its items out would
// leave the alias without its anchor, although the body needs no repair.
func (o *object) aliasedMembers() []bool {
	if o.yaml == nil || len(o.yaml.aliases) == 0 {
		return nil
	}
	aliased := map[string][]int{} // anchor name → members whose aliases use it
	for _, a := range o.yaml.aliases {
		aliased[a.name] = append(aliased[a.name], a.member)
	}
	out := make([]bool, len(o.members))
	for _, a := range o.yaml.anchors {
		if a.member < 0 {
			continue
		}
		for _, user := range aliased[a.name] {
			if user != a.member {
				out[a.member] = true
			}
		}
	}
	return out
}

func (o *object) anchorMember(name string) int {
	for _, a := range o.yaml.anchors {
		if a.name == name && a.member >= 0 {
			return a.member
		}
	}
	return 0
}

func yamlRefuse(format string, a ...any) error {
	return &RefuseError{Reason: "YAML body: " + fmt.Sprintf(format, a...)}
}

// yscan is the pass over one YAML document.
type yscan struct {
	b       []byte
	ls      int // the start of the line being read
	doc     *yamlDoc
	obj     object
	member  int   // the top-level member being read (-1 before the first)
	indents []int // libyaml's block indentation stack
	flow    int   // flow collection depth

	// state carried from one line to the next
	quote      byte // inside a multi-line quoted scalar: '"' or '\''
	blockAbove int  // inside a block scalar: its parent's indentation
	blockInd   int  // the block scalar's content indentation (0: not yet known)
	inBlock    bool
	plainMin   int  // inside a multi-line block plain scalar: the least continuation column
	inPlain    bool //
	flowPlain  bool // inside a multi-line flow plain scalar
	versionCut int  // member whose one-line version value a continuation spoils (-1: none)
}

func scanYAML(body []byte) (object, error) {
	s := &yscan{b: body, doc: &yamlDoc{}, member: -1, versionCut: -1, obj: object{members: make([]member, 0, 32)}}
	s.obj.yaml = s.doc
	if hasHiddenLineBreak(body) {
		return object{}, yamlRefuse("line breaks other than \\n and \\r\\n (a bare \\r, NEL, U+2028, U+2029) are not supported")
	}
	i := 0
	if bytes.HasPrefix(body, []byte("\xef\xbb\xbf")) {
		i = 3
	}
	ls, ind, c, err := s.preamble(i)
	if err != nil {
		return object{}, err
	}
	return s.document(ls, ind, c)
}

// preamble reads blank lines, comments and one --- from i, up to the first content
// line: where it starts, its indentation and its first character.
func (s *yscan) preamble(i int) (ls, ind, c int, err error) {
	body := s.b
	sawStart := false
	for ; i < len(body); i = nextLine(body, i) {
		ind, c := s.indentAt(i)
		switch {
		case c < 0 || body[c] == '#':
			continue
		case ind == 0 && body[i] == '%':
			return 0, 0, 0, yamlRefuse("directives (%%YAML, %%TAG) are not supported")
		case ind == 0 && isDocMarker(body, i, '-'):
			if sawStart {
				return 0, 0, 0, refuseNotObject // an empty first document is {} to APISIX
			}
			sawStart = true
			if rest := skipBlank(body, i+3); rest < len(body) && body[rest] != '\n' && body[rest] != '#' {
				return 0, 0, 0, yamlRefuse("content on the --- line")
			}
			continue
		case ind == 0 && isDocMarker(body, i, '.'):
			return 0, 0, 0, refuseNotObject
		}
		return i, ind, c, nil
	}
	return 0, 0, 0, refuseNotObject // an empty document: {} to APISIX, which empties every section
}

// notABlockMapping says why a first document whose first character is b[c] is not a
// block mapping confshim reads (nil: it may be one).
func notABlockMapping(b []byte, c int) error {
	switch b[c] {
	case '[', '|', '>':
		return refuseNotObject
	case '-':
		if c+1 >= len(b) || isBlankByte(b[c+1]) {
			return refuseNotObject
		}
	case '&', '!', '*':
		return yamlRefuse("anchors, tags or aliases on the document are not supported")
	case '?':
		return yamlRefuse("complex keys are not supported")
	case '\t':
		return yamlRefuse("a tab where indentation is expected")
	}
	return nil
}

// document reads the first document, whose first content line starts at ls.
func (s *yscan) document(ls, ind, c int) (object, error) {
	b := s.b
	if b[c] == '{' {
		// Flow style: only JSON is read (its structure is the same in YAML).
		obj, err := scanObject(b, make([]member, 0, 32))
		if err != nil {
			return object{}, yamlRefuse("a flow-style mapping that is not plain JSON cannot be repaired; send JSON or block-style YAML")
		}
		return obj, nil
	}
	if err := notABlockMapping(b, c); err != nil {
		return object{}, err
	}
	if ind != 0 {
		return object{}, yamlRefuse("the top-level mapping must start at column 0")
	}
	s.ls = ls
	if _, _, ok := s.keyAt(c, lineEnd(b, c)); !ok {
		return object{}, refuseNotObject // a scalar document
	}
	s.indents = []int{0}
	i := ls
	for i < len(b) {
		next, end, err := s.line(i)
		if err != nil {
			return object{}, err
		}
		if end {
			s.closeAt(i)
			return s.obj, nil
		}
		i = next
	}
	if s.quote != 0 || s.flow > 0 {
		return object{}, yamlRefuse("the document ends inside a quoted scalar or a flow collection")
	}
	s.closeAt(len(b))
	return s.obj, nil
}

func (s *yscan) closeAt(i int) {
	s.obj.close = i
	s.endMember(i)
}

// endMember closes the current member's lines at i.
func (s *yscan) endMember(i int) {
	if s.member < 0 {
		return
	}
	m := &s.obj.members[s.member]
	m.end = i
	if !strings.HasSuffix(m.name, versionSuffix) {
		m.valueEnd = i
	}
}

// line handles the line starting at ls; it returns the next line's start, or end when
// the line ends the first document.
func (s *yscan) line(ls int) (next int, end bool, err error) {
	b := s.b
	s.ls = ls
	le := lineEnd(b, ls)
	next = nextLine(b, ls)
	if s.quote != 0 {
		return next, false, s.quotedLine(ls, le)
	}
	ind, c := s.indentAt(ls)
	if s.inBlockScalar(ind, c) || c < 0 {
		return next, false, nil // blank, or a block scalar's
	}
	if s.flow > 0 {
		return next, false, s.flowLine(ls, le, ind, c)
	}
	if b[c] == '#' {
		s.inPlain = false
		return next, false, nil
	}
	if ind == 0 && (isDocMarker(b, ls, '-') || isDocMarker(b, ls, '.')) {
		return 0, true, nil
	}
	return next, false, s.blockLine(ls, le, ind, c)
}

// quotedLine goes on with a quoted scalar that an earlier line opened.
func (s *yscan) quotedLine(ls, le int) error {
	if isDocMarker(s.b, ls, '-') || isDocMarker(s.b, ls, '.') {
		return yamlRefuse("a document marker inside a quoted scalar")
	}
	i, closed := s.quoted(ls, le, s.quote)
	if !closed {
		return nil
	}
	s.quote = 0
	return s.tokens(i, le, false)
}

// inBlockScalar: the line (indented ind, its first character at c, < 0 for none)
// belongs to the block scalar an earlier line opened; a line less indented ends it.
func (s *yscan) inBlockScalar(ind, c int) bool {
	if !s.inBlock {
		return false
	}
	if c < 0 {
		return true // blank lines belong to the block scalar
	}
	if s.blockInd == 0 {
		s.blockInd = max(ind, s.blockAbove+1)
	}
	if ind >= s.blockInd {
		return true
	}
	s.inBlock = false
	return false
}

// flowLine goes on with a flow collection that an earlier line opened.
func (s *yscan) flowLine(ls, le, ind, c int) error {
	b := s.b
	if ind == 0 && (isDocMarker(b, ls, '-') || isDocMarker(b, ls, '.')) {
		return yamlRefuse("a document marker inside a flow collection")
	}
	if s.flowPlain {
		s.flowPlain = false
		if !strings.ContainsRune(",[]{}#", rune(b[c])) && !(b[c] == ':' && (c+1 >= le || isBlankByte(b[c+1]) || strings.ContainsRune(",[]{}", rune(b[c+1])))) {
			return s.plainFlowFrom(c, le)
		}
	}
	return s.tokens(c, le, true)
}

// blockLine is a line of the block context: a plain scalar's continuation, an
// indented node, or a top-level key.
func (s *yscan) blockLine(ls, le, ind, c int) error {
	b := s.b
	if b[c] == '\t' || (c > ls && bytes.IndexByte(b[ls:c], '\t') >= 0) {
		return yamlRefuse("a tab where indentation is expected")
	}
	if s.inPlain {
		if ind >= s.plainMin {
			if s.versionCut >= 0 {
				s.obj.members[s.versionCut].valueStart = -1 // a multi-line version
			}
			return s.plainRest(c, le)
		}
		s.inPlain = false
	}
	s.versionCut = -1
	for len(s.indents) > 1 && s.indents[len(s.indents)-1] > ind {
		s.indents = s.indents[:len(s.indents)-1]
	}
	if ind > 0 || (b[c] == '-' && (c+1 >= le || isBlankByte(b[c+1]))) {
		return s.tokens(c, le, true)
	}
	return s.topKey(ls, le)
}

// topKey reads a top-level "key: value" line.
func (s *yscan) topKey(ls, le int) error {
	b := s.b
	switch b[ls] {
	case '?', '&', '!', '*', '[', '{', '|', '>', '%', '@', '`', ',', ']', '}':
		return yamlRefuse("a top-level key must be a plain or quoted scalar")
	}
	if b[ls] == '"' {
		if end, closed := s.quoted(ls+1, le, '"'); closed && bytes.IndexByte(b[ls:end], '\\') >= 0 {
			// YAML has escapes JSON lacks (\x5f, \U…): "secrets\x5fconf_version" must not
			// slip past as some other key
			return yamlRefuse("escapes in a double-quoted top-level key are not supported")
		}
	}
	name, after, ok := s.keyAt(ls, le)
	if !ok {
		return yamlRefuse("a top-level line that is not a key")
	}
	if name == "<<" {
		return yamlRefuse("a top-level merge key (<<) is not supported")
	}
	s.endMember(ls)
	s.obj.members = append(s.obj.members, member{key: []byte(name), name: name, start: ls, valueStart: after, valueEnd: le})
	s.member = len(s.obj.members) - 1
	s.indents = s.indents[:1]
	if strings.HasSuffix(name, versionSuffix) {
		return s.versionValue(after, le)
	}
	return s.tokens(after, le, true)
}

// versionValue records the one-line scalar after a top-level version key.
func (s *yscan) versionValue(i, le int) error {
	b := s.b
	m := &s.obj.members[s.member]
	i = skipBlank(b, i)
	if i >= le || b[i] == '#' {
		m.valueStart = -1 // the value is on later lines (or null)
		s.versionCut = -1
		return s.tokens(i, le, true)
	}
	start := i
	switch c := b[i]; {
	case c == '"' || c == '\'':
		end, closed := s.quoted(i+1, le, c)
		if !closed {
			m.valueStart = -1
			s.quote = c
			return nil
		}
		m.valueStart, m.valueEnd = start, end
		return s.tokens(end, le, false)
	case strings.IndexByte("&!*[{|>", c) >= 0, (c == '-' || c == '?') && (i+1 >= le || isBlankByte(b[i+1])):
		m.valueStart = -1 // an anchor, tag, alias, collection or block scalar: not spliced
		return s.tokens(i, le, true)
	}
	end := plainEnd(b, i, le)
	m.valueStart, m.valueEnd = start, trimBlankEnd(b, start, end)
	s.inPlain, s.plainMin, s.versionCut = true, 1, s.member
	return s.tokens(end, le, false)
}

// keyAt reads a key at i: a plain or quoted scalar followed by ':' and a blank or the
// line's end. It returns the key's name and where the value starts.
func (s *yscan) keyAt(i, le int) (string, int, bool) {
	b := s.b
	var name string
	var j int
	switch b[i] {
	case '"', '\'':
		end, closed := s.quoted(i+1, le, b[i])
		if !closed {
			return "", 0, false
		}
		name = unquoteYAML(b[i:end])
		j = skipBlank(b, end)
	default:
		k := i
		for k < le {
			if b[k] == ':' && (k+1 >= le || isBlankByte(b[k+1])) {
				break
			}
			if b[k] == '#' && k > i && isBlankByte(b[k-1]) {
				return "", 0, false
			}
			k++
		}
		if k >= le {
			return "", 0, false
		}
		name = string(b[i:trimBlankEnd(b, i, k)])
		j = k
	}
	if j >= le || b[j] != ':' || (j+1 < le && !isBlankByte(b[j+1])) {
		return "", 0, false
	}
	return name, j + 1, true
}

// tokens follows the tokens of a line from i to le; node says a node may start at i.
func (s *yscan) tokens(i, le int, node bool) error {
	b := s.b
	for {
		i = skipBlank(b, i)
		if i >= le {
			return nil
		}
		c := b[i]
		if c == '#' && (i == 0 || isBlankByte(b[i-1]) || b[i-1] == '\n') {
			return nil
		}
		st, ok, err := s.indicator(i, le, c, node)
		if !ok {
			st, err = s.token(i, le, c, node)
		}
		if err != nil || st.done {
			return err
		}
		i, node = st.i, st.node
	}
}

// step is what one token of a line did: where the line goes on, whether a node may
// start there, or that the line is done.
type step struct {
	i    int
	node bool
	done bool
}

// indicator reads the indicator at i, if one is there (ok): a flow collection's
// brackets, commas and key marks, or a block sequence, key, value or block scalar.
func (s *yscan) indicator(i, le int, c byte, node bool) (step, bool, error) {
	blankAfter := i+1 >= le || isBlankByte(s.b[i+1])
	if s.flow > 0 {
		return s.flowIndicator(i, c, blankAfter)
	}
	switch {
	case node && (c == '[' || c == '{'):
		s.flow++
		return step{i: i + 1, node: true}, true, nil
	case (c == '-' || c == '?') && blankAfter:
		s.roll(s.column(i))
		return step{i: i + 1, node: true}, true, nil
	case c == ':' && blankAfter:
		return step{i: i + 1, node: true}, true, nil
	case node && (c == '|' || c == '>'):
		return step{done: true}, true, s.blockScalar(i, le)
	}
	return step{}, false, nil
}

// flowIndicator is indicator inside a flow collection.
func (s *yscan) flowIndicator(i int, c byte, blankAfter bool) (step, bool, error) {
	switch {
	case c == '[' || c == '{':
		s.flow++
		return step{i: i + 1, node: true}, true, nil
	case c == ']' || c == '}':
		s.flow--
		return step{i: i + 1}, true, nil
	case c == ',',
		c == ':' && (blankAfter || strings.IndexByte(",[]{}", s.b[i+1]) >= 0),
		c == '?' && blankAfter:
		return step{i: i + 1, node: true}, true, nil
	}
	return step{}, false, nil
}

// token reads the scalar or node property at i: a quoted scalar, an anchor, alias or
// tag, a flow plain scalar, or a block plain scalar (a key when ':' follows it).
func (s *yscan) token(i, le int, c byte, node bool) (step, error) {
	b := s.b
	switch {
	case c == '"' || c == '\'':
		return s.quotedToken(i, le, c), nil
	case c == '&' || c == '*' || c == '!':
		return s.property(i, le, c, node), nil
	case s.flow > 0:
		return step{done: true}, s.plainFlowFrom(i, le)
	}
	// a block plain scalar: a key when ": " follows on this line
	col := s.column(i)
	end := plainEnd(b, i, le)
	if end < le && b[end] == ':' {
		s.roll(col)
		return step{i: end + 1, node: true}, nil
	}
	s.inPlain, s.plainMin = true, s.indents[len(s.indents)-1]+1
	return step{i: end}, nil
}

// quotedToken reads a quoted scalar at i, a block key when ": " follows it; one that
// goes on to the next line ends this one.
func (s *yscan) quotedToken(i, le int, c byte) step {
	b := s.b
	col := s.column(i)
	end, closed := s.quoted(i+1, le, c)
	if !closed {
		s.quote = c
		return step{done: true}
	}
	if s.flow == 0 {
		if j := skipBlank(b, end); j < le && b[j] == ':' && (j+1 >= le || isBlankByte(b[j+1])) {
			s.roll(col)
		}
	}
	return step{i: end}
}

// property reads an anchor (&), alias (*) or tag (!) at i; an alias is a whole node.
func (s *yscan) property(i, le int, c byte, node bool) step {
	b := s.b
	end := i + 1
	for end < le && !isBlankByte(b[end]) && (s.flow == 0 || strings.IndexByte(",[]{}", b[end]) < 0) {
		end++
	}
	ref := yamlRef{name: string(b[i+1 : end]), member: s.member}
	switch c {
	case '&':
		s.doc.anchors = append(s.doc.anchors, ref)
	case '*':
		s.doc.aliases = append(s.doc.aliases, ref)
		node = false
	}
	return step{i: end, node: node}
}

// roll opens a block collection at col, as libyaml's roll_indent does.
func (s *yscan) roll(col int) {
	if s.flow == 0 && col > s.indents[len(s.indents)-1] {
		s.indents = append(s.indents, col)
	}
}

// column is i's column on the line being read.
func (s *yscan) column(i int) int { return i - s.ls }

// blockScalar reads a | or > header; the content lines follow.
func (s *yscan) blockScalar(i, le int) error {
	b := s.b
	explicit := 0
	for i++; i < le && !isBlankByte(b[i]) && b[i] != '#'; i++ {
		switch c := b[i]; {
		case c >= '1' && c <= '9':
			explicit = int(c - '0')
		case c == '+' || c == '-':
		default:
			return yamlRefuse("an invalid block scalar header")
		}
	}
	s.inBlock, s.blockAbove, s.blockInd = true, s.indents[len(s.indents)-1], 0
	if explicit > 0 {
		s.blockInd = max(s.blockAbove, 0) + explicit
	}
	return nil
}

// plainRest consumes a block plain scalar's continuation line (up to a comment).
func (s *yscan) plainRest(i, le int) error {
	b := s.b
	for k := i; k < le; k++ {
		if b[k] == '#' && k > i && isBlankByte(b[k-1]) {
			s.inPlain = false
			return nil
		}
		if b[k] == ':' && (k+1 >= le || isBlankByte(b[k+1])) {
			return yamlRefuse("a key inside a multi-line scalar")
		}
	}
	return nil
}

// plainFlowFrom reads a plain scalar inside a flow collection, then the line's rest.
func (s *yscan) plainFlowFrom(i, le int) error {
	b := s.b
	k := i
	for k < le {
		c := b[k]
		if strings.IndexByte(",[]{}", c) >= 0 {
			break
		}
		if c == ':' && (k+1 >= le || isBlankByte(b[k+1]) || strings.IndexByte(",[]{}", b[k+1]) >= 0) {
			break
		}
		if c == '#' && isBlankByte(b[k-1]) {
			return nil
		}
		k++
	}
	if k >= le {
		s.flowPlain = true
		return nil
	}
	return s.tokens(k, le, false)
}

// quoted scans a quoted scalar's content from i; it returns the offset past the
// closing quote, or false when the line ends first.
func (s *yscan) quoted(i, le int, q byte) (int, bool) {
	b := s.b
	for i < le {
		switch c := b[i]; {
		case q == '"' && c == '\\':
			i += 2
		case c == q && q == '\'' && i+1 < le && b[i+1] == '\'':
			i += 2
		case c == q:
			return i + 1, true
		default:
			i++
		}
	}
	return le, false
}

// indentAt returns a line's indentation and where its content starts (-1: blank).
func (s *yscan) indentAt(ls int) (int, int) {
	b := s.b
	i := ls
	for i < len(b) && b[i] == ' ' {
		i++
	}
	j := i
	for j < len(b) && (b[j] == '\t' || b[j] == '\r') {
		j++
	}
	if j >= len(b) || b[j] == '\n' {
		return i - ls, -1
	}
	return i - ls, i
}

// plainEnd is where a block plain scalar starting at i ends on its line: before
// ": ", " #" or the line's end (trailing blanks included).
func plainEnd(b []byte, i, le int) int {
	for k := i; k < le; k++ {
		if b[k] == ':' && (k+1 >= le || isBlankByte(b[k+1])) {
			return k
		}
		if b[k] == '#' && k > i && isBlankByte(b[k-1]) {
			return k
		}
	}
	return le
}

func isBlankByte(c byte) bool { return c == ' ' || c == '\t' || c == '\r' }

func skipBlank(b []byte, i int) int {
	for i < len(b) && isBlankByte(b[i]) {
		i++
	}
	return i
}

func trimBlankEnd(b []byte, start, end int) int {
	for end > start && isBlankByte(b[end-1]) {
		end--
	}
	return end
}

func lineEnd(b []byte, i int) int {
	if j := bytes.IndexByte(b[i:], '\n'); j >= 0 {
		return i + j
	}
	return len(b)
}

func nextLine(b []byte, i int) int {
	if j := bytes.IndexByte(b[i:], '\n'); j >= 0 {
		return i + j + 1
	}
	return len(b)
}

// hasHiddenLineBreak reports a line break libyaml sees and a line-based pass would
// not: a \r not before \n, NEL (U+0085), LS (U+2028), PS (U+2029).
func hasHiddenLineBreak(b []byte) bool {
	for i := bytes.IndexByte(b, '\r'); i >= 0; {
		if i+1 >= len(b) || b[i+1] != '\n' {
			return true
		}
		j := bytes.IndexByte(b[i+1:], '\r')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return bytes.Contains(b, []byte("\xc2\x85")) || bytes.Contains(b, []byte("\xe2\x80\xa8")) || bytes.Contains(b, []byte("\xe2\x80\xa9"))
}

// isDocMarker reports "---" or "..." at ls followed by a blank or the line's end.
func isDocMarker(b []byte, ls int, c byte) bool {
	if ls+3 > len(b) || b[ls] != c || b[ls+1] != c || b[ls+2] != c {
		return false
	}
	return ls+3 == len(b) || isBlankByte(b[ls+3]) || b[ls+3] == '\n'
}

// unquoteYAML decodes a one-line quoted key (a top-level one has no escapes: topKey
// refuses them).
func unquoteYAML(q []byte) string {
	inner := q[1 : len(q)-1]
	if q[0] == '\'' {
		return strings.ReplaceAll(string(inner), "''", "'")
	}
	return string(inner)
}

// yamlVersion reads a version scalar as lyaml resolves it (lyaml/implicit.lua): null
// and true are not numbers, false counts as absent (as in APISIX), a quoted scalar is
// a string; integers may be octal (leading 0), hexadecimal, binary or sexagesimal, and
// may hold underscores.
func yamlVersion(raw []byte) (float64, bool, error) {
	if len(raw) == 0 {
		return 0, false, &RefuseError{Reason: "YAML body: a version that is not a one-line scalar cannot be repaired"}
	}
	switch raw[0] {
	case '"', '\'':
		return 0, false, errors.New("is not a number")
	}
	v, kind := lyamlScalar(string(raw))
	switch kind {
	case "number":
		if math.IsInf(v, 0) || math.IsNaN(v) {
			return 0, false, errors.New("is not a finite number")
		}
		return v, true, nil
	case "false":
		return 0, false, nil
	}
	return 0, false, errors.New("is not a number")
}

var (
	reOctal    = regexp.MustCompile(`^([+-]?)0_*([0-7][0-7_]*)$`)
	reDecimal  = regexp.MustCompile(`^([+-]?)_*([0-9][0-9_]*)$`)
	reFloat    = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$`)
	reHex      = regexp.MustCompile(`^([+-]?)0x_*([0-9a-fA-F][0-9a-fA-F_]*)$`)
	reBinary   = regexp.MustCompile(`^([+-]?)0b_*([01][01_]+)$`)
	reSexagint = regexp.MustCompile(`^([+-]?)([0-9]+:[0-5]?[0-9][:0-9]*)$`)
	reSexfloat = regexp.MustCompile(`^([+-]?)([0-9]+:[0-5]?[0-9][:0-9]*)(\.[0-9]+)$`)
	reDigits   = regexp.MustCompile(`[0-9]+`)
)

// lyamlScalar resolves a plain scalar in lyaml's order: null, octal, decimal, float,
// bool, inf, nan, hexadecimal, binary, sexagesimal, sexfloat; anything else is a
// string. Only numbers and booleans matter for a version.
func lyamlScalar(t string) (float64, string) {
	for _, resolve := range lyamlResolvers {
		if v, kind, ok := resolve(t); ok {
			return v, kind
		}
	}
	return 0, "string"
}

// lyamlResolvers are lyaml's implicit resolvers, in its order; each says whether the
// scalar is its kind.
var lyamlResolvers = []func(t string) (float64, string, bool){
	lyamlNull,
	lyamlRadix(reOctal, 8),
	lyamlDecimal,
	lyamlFloat,
	lyamlConstant,
	lyamlRadix(reHex, 16),
	lyamlRadix(reBinary, 2),
	lyamlSexfloat,
	lyamlSexagint,
}

func signed(sign string, v float64) float64 {
	if sign == "-" {
		return -v
	}
	return v
}

// lyamlNull is null.
func lyamlNull(t string) (float64, string, bool) {
	switch t {
	case "", "~", "null", "Null", "NULL":
		return 0, "null", true
	}
	return 0, "", false
}

// lyamlRadix is an integer in base (octal, hexadecimal, binary), sign and digits
// captured by re.
func lyamlRadix(re *regexp.Regexp, base int) func(string) (float64, string, bool) {
	return func(t string) (float64, string, bool) {
		m := re.FindStringSubmatch(t)
		if m == nil {
			return 0, "", false
		}
		n, err := strconv.ParseUint(strings.ReplaceAll(m[2], "_", ""), base, 64)
		return signed(m[1], float64(n)), "number", err == nil
	}
}

func lyamlDecimal(t string) (float64, string, bool) {
	m := reDecimal.FindStringSubmatch(t)
	if m == nil {
		return 0, "", false
	}
	digits := strings.ReplaceAll(m[2], "_", "")
	if digits == "0" || len(digits) > 1 || digits[0] != '0' {
		f, _ := strconv.ParseFloat(digits, 64)
		return signed(m[1], f), "number", true
	}
	return 0, "", false
}

func lyamlFloat(t string) (float64, string, bool) {
	f := strings.ReplaceAll(t, "_", "")
	if !strings.ContainsAny(t, ".eE") || !reFloat.MatchString(f) {
		return 0, "", false
	}
	v, err := strconv.ParseFloat(f, 64)
	return v, "number", err == nil || errors.Is(err, strconv.ErrRange)
}

// lyamlConstant is a boolean, an infinity or not-a-number.
func lyamlConstant(t string) (float64, string, bool) {
	switch t {
	case "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON":
		return 0, "true", true
	case "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF":
		return 0, "false", true
	case ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF":
		return math.Inf(1), "number", true
	case "-.inf", "-.Inf", "-.INF":
		return math.Inf(-1), "number", true
	case ".nan", ".NaN", ".NAN":
		return math.NaN(), "number", true
	}
	return 0, "", false
}

func lyamlSexfloat(t string) (float64, string, bool) {
	m := reSexfloat.FindStringSubmatch(t)
	if m == nil {
		return 0, "", false
	}
	frac, _ := strconv.ParseFloat(m[3], 64)
	return signed(m[1], sexagesimal(m[2])+frac), "number", true
}

func lyamlSexagint(t string) (float64, string, bool) {
	m := reSexagint.FindStringSubmatch(t)
	if m == nil {
		return 0, "", false
	}
	return signed(m[1], sexagesimal(m[2])), "number", true
}

func sexagesimal(s string) float64 {
	var r float64
	for _, d := range reDigits.FindAllString(s, -1) {
		n, _ := strconv.ParseFloat(d, 64)
		r = r*60 + n
	}
	return r
}
