// Package wait is how a test waits for an event instead of sleeping a fixed time.
package wait

import (
	"testing"
	"time"
)

// For polls cond until it holds; after 20 s the test fails naming what it waited for.
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
