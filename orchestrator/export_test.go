package orchestrator

import "time"

// StopHeartbeat stops e's heartbeat loop, and nothing else: to the rest of
// the fleet e looks dead (its leases lapse, it adopts nothing), while its
// runs go on locally, as on a replica paused or cut off from its peers.
func (e *Engine) StopHeartbeat() { e.stopHeartbeat() }

// SetStartTimeout sets how long a task's StartTask may take, until the
// test ends.
func SetStartTimeout(t interface{ Cleanup(func()) }, d time.Duration) {
	old := startTimeout
	startTimeout = d
	t.Cleanup(func() { startTimeout = old })
}

// SetHedgeOpened sets the hook called once a hedge's account is open,
// before the hedge is dispatched (firstEnded: whether the first attempt
// has ended), until the test ends. The hook is the package's: a test that
// sets it must not run in parallel with others that hedge.
func SetHedgeOpened(t interface{ Cleanup(func()) }, f func(firstEnded func() bool)) {
	old := hedgeOpened
	hedgeOpened = f
	t.Cleanup(func() { hedgeOpened = old })
}
