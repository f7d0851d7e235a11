//go:build !race

package integration

// raceBuild: see race_on_test.go.
const raceBuild = false
