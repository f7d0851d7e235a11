//go:build race

package integration

// raceBuild: the suite runs under the race detector, which makes every step several
// times slower; the longest tests keep their fixed CI set small there.
const raceBuild = true
