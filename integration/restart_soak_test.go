//go:build soak

package integration

// With the soak's build tag the restart tests run at the size: 20,000 routes.
func init() { stateOnlyRestartRoutes = func() int { return 20000 } }
