package orchestrator

// StopHeartbeat stops e's heartbeat loop, and nothing else: to the rest of
// the fleet e looks dead (its leases lapse, it adopts nothing), while its
// runs go on locally, as on a replica paused or cut off from its peers.
func (e *Engine) StopHeartbeat() { e.stopHeartbeat() }
