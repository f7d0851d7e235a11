//go:build !race

// Package race tells tests whether they run under the race detector.
package race

// Enabled: see on.go.
const Enabled = false
