package syncmachine

// Phase is where a sync is: each phase has issued one action and waits for its answer.
type Phase string

// The phases, in the order a sync meets them.
const (
	phaseLook         Phase = "look"          // HEAD: does the data plane still hold the belief?
	phaseRead         Phase = "read"          // GET: the state to decide on
	phaseReseed       Phase = "reseed"        // the kept configuration put back into an emptied data plane
	phaseReseedRead   Phase = "reseed-read"   // GET: what the data plane holds after a re-seed that did not go
	phaseSteadyCheck  Phase = "steady-check"  // validate alone an item held for what the data plane held
	phaseSteadyCopies Phase = "steady-copies" // GET: the accepted copies for items held before the PUT
	phaseProve        Phase = "prove"         // HEAD: is the state a decision needs still current?
	phaseProveRead    Phase = "prove-read"    // GET: the state, to decide again on it
	phasePut          Phase = "put"           // the decided PUT
	phaseReturn       Phase = "return"        // the decide connection closed: wait for the data plane
	phaseTie          Phase = "tie"           // GET: did a section sent at vS+1 land, or a writer's equal version?
	phaseFind         Phase = "find"          // validate: which items APISIX rejects (a section a call)
	phaseCopies       Phase = "copies"        // GET: the accepted copies for the backfill
	phaseCheckCopies  Phase = "check-copies"  // validate: does APISIX take the accepted copies?
	phaseHolds        Phase = "holds"         // HEAD: the state unchanged before the corrected PUT
	phaseCorrected    Phase = "corrected"     // the corrected PUT
	phaseAwait        Phase = "await"         // validate alone an item that waits for what the data plane holds
	phasePause        Phase = "pause"         // between two looks of the second step
	phaseDone         Phase = "done"          // the client is answered from the final state
)
