package orchestrator

import "github.com/fanout/fanout/runs"

// Followers reports how many streams on e follow runID.
func (e *Engine) Followers(runID string) int {
	e.followers.mu.Lock()
	defer e.followers.mu.Unlock()
	if r := e.followers.runs[runID]; r != nil {
		return r.streams
	}
	return 0
}

// FollowedHead is runID's head as e's followers last read it (the zero
// Head before their first poll, or when nothing here follows the run).
func (e *Engine) FollowedHead(runID string) runs.Head {
	h, _ := e.followers.state(runID)
	return h
}
