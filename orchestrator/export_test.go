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
