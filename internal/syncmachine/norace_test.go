//go:build !race

package syncmachine_test

const raceBuild = false
