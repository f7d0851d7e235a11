package proxy

import (
	"fmt"
	"time"
)

// The fallback's flags (contract §8.5, --fallback backfill): what it does is
// internal/syncmachine's (the rounds, the second step) and rewrite's (the plan).

// FallbackAnswer is --fallback-answer: what the client is told when items were held back.
type FallbackAnswer string

const (
	// AnswerRejection: APISIX's own rejection of a held item (400), while the rest of
	// the sync is applied, so that a controller reports exactly the held items.
	AnswerRejection FallbackAnswer = "rejection"
	// AnswerAccepted: APISIX's answer to the corrected PUT.
	AnswerAccepted FallbackAnswer = "accepted"
)

// ParseFallbackAnswer reads --fallback-answer.
func ParseFallbackAnswer(s string) (FallbackAnswer, error) {
	switch a := FallbackAnswer(s); a {
	case AnswerRejection, AnswerAccepted:
		return a, nil
	}
	return "", fmt.Errorf("want rejection or accepted, got %q", s)
}

// fallbackBudget is how long a sync with fallback work may take before its client is
// answered with what is known (§8.5): the controller gives ADC 15 s per sync.
const fallbackBudget = 10 * time.Second
