package syncmachine

// Phase is where a sync is: each phase has issued one action and waits for its answer.
type Phase string

// The phases, in the order a sync meets them.
const (
	PhaseLook         Phase = "look"          // HEAD: does the data plane still hold the belief?
	PhaseRead         Phase = "read"          // GET: the state to decide on
	PhaseReseed       Phase = "reseed"        // the kept configuration put back into an emptied data plane
	PhaseReseedRead   Phase = "reseed-read"   // GET: what the data plane holds after a re-seed that did not go
	PhaseSteadyCheck  Phase = "steady-check"  // validate alone an item held for what the data plane held
	PhaseSteadyCopies Phase = "steady-copies" // GET: the accepted copies for items held before the PUT
	PhaseProve        Phase = "prove"         // HEAD: is the state a decision needs still current?
	PhaseProveRead    Phase = "prove-read"    // GET: the state, to decide again on it
	PhasePut          Phase = "put"           // the decided PUT
	PhaseReturn       Phase = "return"        // the decide connection closed: wait for the data plane
	PhaseFind         Phase = "find"          // validate: which items APISIX rejects (a section a call)
	PhaseCopies       Phase = "copies"        // GET: the accepted copies for the backfill
	PhaseCheckCopies  Phase = "check-copies"  // validate: does APISIX take the accepted copies?
	PhaseHolds        Phase = "holds"         // HEAD: the state unchanged before the corrected PUT
	PhaseCorrected    Phase = "corrected"     // the corrected PUT
	PhaseAwait        Phase = "await"         // validate alone an item that waits for what the data plane holds
	PhasePause        Phase = "pause"         // between two looks of the second step
	PhaseDone         Phase = "done"          // the client is answered from the final state
)
