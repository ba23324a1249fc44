package orchestrator

// Followers reports how many streams on e follow runID.
func (e *Engine) Followers(runID string) int {
	e.followers.mu.Lock()
	defer e.followers.mu.Unlock()
	if r := e.followers.runs[runID]; r != nil {
		return r.streams
	}
	return 0
}
