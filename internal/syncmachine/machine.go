// Package syncmachine is one configs PUT's sync (contract §5.4, §8.4, §8.5) as an
// explicit state machine. Step takes what the data plane answered to the last action
// and returns the next action: look (HEAD), read (GET), put the kept configuration
// back, validate items, PUT a body, wait, or answer the client. It does no I/O and
// reads no clock: every fact from outside — APISIX's answers, the connection, the
// time — arrives in an Event, so a test drives it through every sequence of answers
// without a socket. proxy's driver does the I/O and nothing else.
//
// The sync's state is one value (Sync): the decision round (on which state, proven or
// believed, which body), what was sent, what APISIX last accepted in this sync and
// what that PUT held back, the retries and the budget left. The client's answer is a
// function of the final state alone (Final.Reply), so §8.5's "a 2xx only when
// everything the client sent is programmed" is one rule in one place, whatever path
// led there. The phases and their transitions are listed in Table.
package syncmachine

import (
	"errors"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// Config is what every sync of one confshim shares; read-only but for the layouts it
// learns.
type Config struct {
	Rewriter *rewrite.Rewriter
	Fallback bool // --fallback backfill (§8.5)
	// RejectHeld: --fallback-answer rejection, the client is told of held items with
	// APISIX's rejection of them while the rest is applied
	RejectHeld bool
	Budget     time.Duration // a sync with fallback work is answered within it (§8.5)
	Reseeds    bool          // a configuration is kept and put back into an emptied data plane (§8.4)
	Buffers    Buffers       // the rewritten bodies' buffers
	// Layouts remembers the last corrected body's shape (PrepareLike), nil for none.
	Layouts *LayoutMemory
}

// Buffers lends the buffers rewritten bodies are written into.
type Buffers interface {
	Get() *[]byte
	Put(*[]byte)
}

// Belief is the PUT lock's transaction on what confshim believes of the data plane
// (*dataplane.Tx): the sync reads it and makes its transitions, one per answer.
type Belief interface {
	View() dataplane.View
	Read(st *rewrite.State, digest, lastModified string, noHead bool, conn uint64) []dataplane.Move
	Confirm(conn uint64)
	Doubt()
	Forget()
	TieLost(sections []string, st *rewrite.State, digest, lastModified string)
	Answered(o dataplane.Outcome) []rewrite.MergeReport
	Oversized(o dataplane.Oversized)
	AskRefresh()
}

// Input is one client's PUT, as received and scanned before the lock.
type Input struct {
	Client    rewrite.Input           // the body and X-Digest as the client sent them
	Prepared  *rewrite.Prepared       // as scanned (nil: not scanned; Untouched says why)
	Untouched metrics.UntouchedReason // why it goes to APISIX as it came ("" to decide)
	Start     time.Time               // its arrival: the fallback's budget counts from it
	Deadline  time.Time               // the PUT's one deadline (--upstream-timeout)
}

// Conn is what the driver knows of the connection to the data plane when an event
// happens.
type Conn struct {
	ID          uint64 // the decide connection (apisix.Client.DecideConn; 0: none open)
	Closing     bool   // an answer announced that the decide connection closes
	Trusted     bool   // --trust-connection trusts this path (§5.4)
	Server      string // APISIX's version (Server)
	HasValidate bool   // POST /configs/validate exists (3.15+)
	NoHead      bool   // HEAD /configs does not exist (3.13)
}

// Event is what an action found; which fields count depends on the action.
type Event struct {
	Now  time.Time
	Conn Conn
	// Err: the action got no usable answer (a transport error, a refusal, an odd
	// document; validate: APISIX could not say). Broke: that error is the connection
	// breaking (a reset, a close), not the client leaving nor the time running out.
	Err   error
	Broke bool

	Meta     *apisix.Meta        // Head: the metadata of a 200 (nil: another status)
	Read     StateRead           // Read
	Reseeded bool                // Reseed: the kept configuration is back
	Found    []rewrite.Rejection // Validate: the items APISIX rejects
	Answer   *apisix.Answer      // Put: APISIX's answer, read whole
	Took     time.Duration       // Put: how long it took
}

// StateRead is GET /apisix/admin/configs, parsed.
type StateRead struct {
	State                *rewrite.State
	Digest, LastModified string
}

// Action is what the driver does next.
type Action interface{ isAction() }

// Head asks HEAD /apisix/admin/configs on the decide connection, with the caller's
// credentials.
type Head struct{}

// Read asks GET /apisix/admin/configs on the decide connection (the driver only reads;
// what the state means is the machine's).
type Read struct {
	Until time.Time // zero: within the PUT's deadline
}

// Reseed puts the kept configuration back into the emptied data plane (§8.4).
type Reseed struct{}

// Validate asks POST /apisix/admin/configs/validate which of a section's items APISIX
// rejects (in pieces under its cap), within Until.
type Validate struct {
	Section string
	Items   [][]byte
	Until   time.Time
}

// Put forwards one complete PUT: on the decide connection (a decided body: sent there
// or not at all) or the shared one (a body that goes as it came). Release, when set,
// goes back to Buffers once the transport lets go of Body.
type Put struct {
	Conn    apisix.Conn
	Out     Outgoing
	Release *[]byte
}

// AwaitReturn waits until the data plane answers again (HEAD /apisix/admin), or Until.
type AwaitReturn struct {
	Until time.Time
}

// Pause waits until Until (the PUT's deadline may end it first: Event.Err).
type Pause struct {
	Until time.Time
}

// Done: the sync is over; Final says what the client is answered.
type Done struct{ Final *Final }

func (Head) isAction()        {}
func (Read) isAction()        {}
func (Reseed) isAction()      {}
func (Validate) isAction()    {}
func (Put) isAction()         {}
func (AwaitReturn) isAction() {}
func (Pause) isAction()       {}
func (Done) isAction()        {}

// Outgoing is a PUT confshim forwards: the body and the X-Digest to send.
type Outgoing struct {
	Body      []byte
	Digest    string
	SetDigest bool
	NoOp      bool // the data plane's own digest, so that APISIX answers 204 (§8.2)
}

// Limits of one sync.
const (
	// maxRedials bounds how often one PUT is decided again because the connection its
	// state was read on closed (a restarting data plane).
	maxRedials = 2
	// maxPrefixRounds bounds the rounds on 3.13/3.14, one held item per round.
	maxPrefixRounds = 8
	// restartPatience is how long after its arrival a sync whose connection broke waits
	// for the data plane to answer again before a fresh decision.
	restartPatience = 5 * time.Second
	// secondStepWindow and secondStepPause: how long and how often items rejected for
	// what the data plane holds are validated again after a PUT that held them
	// (APISIX's workers apply an accepted PUT within about a second).
	secondStepWindow = 2 * time.Second
	secondStepPause  = 200 * time.Millisecond
)

// How confshim learnt of an out-of-band write.
const (
	learntByConflict = "version_conflict" // APISIX refused a PUT decided on the old versions
	learntByReread   = "re_read"          // the state read before a PUT found another digest
	learntByTie      = "equal_version"    // a read after a PUT sent at vS+1 found a writer's copy at it
)

// errReseedPending: the data plane was found empty and the kept configuration could not
// be put back first; the sync is not decided on the empty state.
var errReseedPending = errors.New("the data plane lost its configuration; re-seeding it did not succeed")

// Sync is one sync's state: everything Step needs, in one value.
type Sync struct {
	cfg  *Config
	in   Input
	tx   Belief
	now  time.Time
	conn Conn

	phase Phase
	round round // the decision being made or sent

	// what lasts across decisions
	learnt     string            // how a fresh read learns an out-of-band write
	body       upfront           // the body decided: the client's, or its correction before the PUT
	holdAgain  bool              // the next decision works the steady state out again
	carried    []HeldItem        // held by a fallback of this sync before it was decided again
	recheck    rewrite.Recheck   // what validating held items alone said in this sync
	conflicted bool              // decided again once after the data plane moved
	redials    int               // decided again after the decide connection closed
	second     secondStep        // §8.5's second step
	fb         *fallbackWork     // the rounds after a decided PUT's 400
	rejection  *apisix.Answer    // APISIX's answer to the last decided PUT, when not a 2xx
	applied    *appliedPut       // the last PUT APISIX accepted since the data plane last moved
	touched    []Touched         // what each accepted PUT took, for the ids it touched
	took       time.Duration     // how long the last PUT took (a PUT as long must fit the budget)
	tiesLost   []rewrite.Change  // sections a writer's equal version kept out of an accepted PUT, not yet sent again
	earlier    []*rewrite.Result // accepted decisions the sync's answer is no longer drawn from (a lost tie's)
	notes      []Note            // what happened since the driver last asked
	final      *Final
}

// HeldItem is one item held back (rewrite's).
type HeldItem = rewrite.HeldItem

// upfront is a body a sync is decided on: the client's, or its correction before the
// PUT (§8.5's steady state: the items this APISIX is known to reject held back).
type upfront struct {
	in       rewrite.Input
	prepared *rewrite.Prepared
	held     []HeldItem
}

// round is one decision: the state it is made on, and what it sent.
type round struct {
	fresh     bool // read, whatever is believed
	reseeded  bool // the kept configuration was put back (or tried)
	proven    bool // the state was shown current for this sync (read, or a HEAD matched)
	state     *rewrite.State
	steady    *steadyWork // the steady state being worked out
	in        rewrite.Input
	res       *rewrite.Result
	buf       *[]byte
	untouched metrics.UntouchedReason
	sent      Outgoing
}

// appliedPut is a PUT APISIX accepted (2xx) in this sync.
type appliedPut struct {
	answer   *apisix.Answer
	res      *rewrite.Result
	sent     Outgoing
	prepared *rewrite.Prepared // what APISIX took
	held     []HeldItem        // the client's items it did not take as sent
}

// secondStep is §8.5's second step: held items that wait for what the data plane holds.
type secondStep struct {
	taken    bool       // it was started (once a sync)
	deciding bool       // the decision being made is its second PUT's
	waiting  []HeldItem // the items validated again, alone
	index    int        // the next one to validate in this pass
	passed   bool       // one passed in this pass
	until    time.Time  // the window's end (and the budget's, less a PUT's time)
}

// Start begins a sync under the PUT lock: ev carries the time and the connection as
// the lock was taken.
func Start(cfg *Config, in Input, tx Belief, ev Event) (*Sync, Action) {
	s := &Sync{cfg: cfg, in: in, tx: tx, learnt: learntByReread, holdAgain: true, recheck: rewrite.Recheck{},
		body: upfront{in: in.Client, prepared: in.Prepared}}
	s.observe(ev)
	return s, s.decide(false)
}

// earliest is the earlier of two times.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Step is what the answer to the last action makes of the sync: the next action.
func (s *Sync) Step(ev Event) Action {
	s.observe(ev)
	switch s.phase {
	case phaseLook:
		return s.looked(ev)
	case phaseRead:
		return s.readState(ev)
	case phaseReseed:
		return s.reseeded(ev)
	case phaseReseedRead:
		return s.rereadAfterReseed(ev)
	case phaseSteadyCheck:
		return s.steadyChecked(ev)
	case phaseSteadyCopies:
		return s.steadyCopies(ev)
	case phaseProve:
		return s.proved(ev)
	case phaseProveRead:
		return s.readForProof(ev)
	case phasePut:
		return s.putAnswered(ev)
	case phaseReturn:
		return s.decide(true)
	case phaseTie:
		return s.tieRead(ev)
	case phaseFind:
		return s.found(ev)
	case phaseCopies:
		return s.copiesRead(ev)
	case phaseCheckCopies:
		return s.copiesChecked(ev)
	case phaseHolds:
		return s.stillHolds(ev)
	case phaseCorrected:
		return s.correctedAnswered(ev)
	case phaseAwait:
		return s.awaited(ev)
	case phasePause:
		return s.paused(ev)
	}
	panic("syncmachine: Step after Done, or in an unknown phase " + string(s.phase))
}

// Notes returns what happened since it was last called, for the log and the metrics.
func (s *Sync) Notes() []Note {
	n := s.notes
	s.notes = nil
	return n
}

// Phase is where the sync is.
func (s *Sync) Phase() Phase { return s.phase }

func (s *Sync) observe(ev Event) {
	s.now, s.conn = ev.Now, ev.Conn
}

func (s *Sync) note(n Note) { s.notes = append(s.notes, n) }

// budgetEnd is when fallback work must stop (§8.5), counted from the arrival.
func (s *Sync) budgetEnd() time.Time { return s.in.Start.Add(s.cfg.Budget) }

// affords: a PUT as long as the last one still fits in the budget and before the
// PUT's deadline; otherwise it says why not, and nothing more is sent.
func (s *Sync) affords(what string) bool {
	switch {
	case !s.now.Before(s.in.Deadline):
		s.unavailable("the PUT's deadline passed before "+what, nil)
		return false
	case s.budgetEnd().Sub(s.now) <= s.took:
		s.unavailable("the budget of a sync with fallback work ("+s.cfg.Budget.String()+") ends before "+what, nil)
		return false
	}
	return true
}

// nowMillis is the clock a bump may stamp (§5.1).
func (s *Sync) nowMillis() float64 { return float64(s.now.UnixMilli()) }
