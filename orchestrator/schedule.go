package orchestrator

import "slices"

// scheduler is a run's dependency graph as the drive loop sees it: which
// tasks may start, in dispatch order, and which can no longer start because
// something they wait on did not succeed. It does no I/O and knows nothing
// of workers, the ledger or time; the driver tells it what ended and acts
// on what it returns. Not safe for concurrent use (the drive loop owns it).
type scheduler struct {
	dependents [][]int // dependents[i]: tasks that wait on task i
	waiting    []int   // waiting[i]: dependencies of i not yet succeeded
	ended      []bool  // ended[i]: task i has an outcome (or will never run)
	ready      []int   // may start now, in dispatch order (ascending)
	left       int     // tasks not yet ended
}

// newScheduler returns the scheduler of a run whose task i depends on the
// tasks deps[i] (dispatch indexes, acyclic: plan checked). The tasks that
// depend on nothing are ready.
func newScheduler(deps [][]int) *scheduler {
	n := len(deps)
	s := &scheduler{
		dependents: make([][]int, n),
		waiting:    make([]int, n),
		ended:      make([]bool, n),
		left:       n,
	}
	for i, ds := range deps {
		s.waiting[i] = len(ds)
		for _, dep := range ds {
			s.dependents[dep] = append(s.dependents[dep], i)
		}
		if len(ds) == 0 {
			s.ready = append(s.ready, i) // i ascends: ready stays sorted
		}
	}
	return s
}

// Ready returns the tasks that may start now, lowest dispatch index first.
// The slice is the scheduler's: read it before the next call.
func (s *scheduler) Ready() []int { return s.ready }

// Peek returns the ready task with the lowest dispatch index, leaving it
// ready.
func (s *scheduler) Peek() (i int, ok bool) {
	if len(s.ready) == 0 {
		return 0, false
	}
	return s.ready[0], true
}

// Next takes the ready task with the lowest dispatch index.
func (s *scheduler) Next() (i int, ok bool) {
	if len(s.ready) == 0 {
		return 0, false
	}
	i, s.ready = s.ready[0], s.ready[1:]
	return i, true
}

// take takes ready task i out of the ready set (a resumed run's task that
// had ended already).
func (s *scheduler) take(i int) {
	if k := slices.Index(s.ready, i); k >= 0 {
		s.ready = slices.Delete(s.ready, k, k+1)
	}
}

// Done reports whether every task has ended.
func (s *scheduler) Done() bool { return s.left == 0 }

// Succeeded records that task i ended SUCCEEDED and returns the tasks that
// became ready by it, in dispatch order.
func (s *scheduler) Succeeded(i int) (ready []int) {
	s.end(i)
	for _, j := range s.dependents[i] {
		if s.waiting[j]--; s.waiting[j] == 0 && !s.ended[j] {
			s.ready = insertSorted(s.ready, j)
			ready = append(ready, j)
		}
	}
	return ready
}

// Failed records that task i ended without succeeding (or will never be
// dispatched) and returns every task that waits on it, transitively, and
// had not ended: they can never run, and are ended SKIPPED here.
func (s *scheduler) Failed(i int) (skipped []int) {
	s.end(i)
	return s.skip(i, nil)
}

func (s *scheduler) skip(i int, skipped []int) []int {
	for _, j := range s.dependents[i] {
		if s.ended[j] {
			continue
		}
		s.end(j)
		skipped = s.skip(j, append(skipped, j))
	}
	return skipped
}

func (s *scheduler) end(i int) {
	if !s.ended[i] {
		s.ended[i] = true
		s.left--
	}
}

func insertSorted(s []int, v int) []int {
	i := 0
	for i < len(s) && s[i] < v {
		i++
	}
	s = append(s, 0)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}
