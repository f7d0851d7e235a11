//go:build race

package race

// Enabled: the tests run under the race detector, which makes every step several times
// slower. The longest tests keep a smaller fixed set there, or leave sizes (not
// concurrency) to make test's pass without it.
const Enabled = true
