package orchestrator

import (
	"slices"
	"testing"
)

// The scheduler is pure: these tests need no Postgres and no workers.

func TestSchedulerStartsRootsInDispatchOrder(t *testing.T) {
	// 0 and 2 are roots; 1 waits on 0; 3 waits on 1 and 2.
	s := newScheduler([][]int{nil, {0}, nil, {1, 2}})
	if got := s.Ready(); !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("ready at start = %v, want [0 2]", got)
	}
	var order []int
	for {
		i, ok := s.Next()
		if !ok {
			break
		}
		order = append(order, i)
	}
	if !slices.Equal(order, []int{0, 2}) {
		t.Fatalf("Next order = %v, want [0 2]", order)
	}
	if got := s.Succeeded(2); len(got) != 0 {
		t.Errorf("3 ready after only 2 succeeded: %v", got)
	}
	if got := s.Succeeded(0); !slices.Equal(got, []int{1}) {
		t.Errorf("after 0 succeeded, ready %v, want [1]", got)
	}
	if i, _ := s.Next(); i != 1 {
		t.Fatalf("Next = %d, want 1", i)
	}
	if got := s.Succeeded(1); !slices.Equal(got, []int{3}) {
		t.Errorf("after 1 succeeded, ready %v, want [3] (both its dependencies succeeded)", got)
	}
	if s.Done() {
		t.Fatal("done with task 3 still to run")
	}
	s.Next()
	s.Succeeded(3)
	if !s.Done() {
		t.Fatal("not done after every task succeeded")
	}
}

func TestSchedulerKeepsReadySorted(t *testing.T) {
	// 3 and 1 both wait on 0 and 2; they become ready in dispatch order
	// whatever order their dependencies end in.
	s := newScheduler([][]int{nil, {0}, nil, {2}, nil})
	for range 3 {
		s.Next()
	}
	s.Succeeded(2)
	s.Succeeded(0)
	if got := s.Ready(); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("ready = %v, want [1 3]", got)
	}
}

func TestSchedulerSkipsEverythingDownstreamOfAFailure(t *testing.T) {
	// 0 -> 1 -> 2, 0 -> 3; 4 waits on 3 and the independent 5.
	s := newScheduler([][]int{nil, {0}, {1}, {0}, {3, 5}, nil})
	s.Next()
	s.Next()
	got := s.Failed(0)
	slices.Sort(got)
	if want := []int{1, 2, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("skipped %v, want %v", got, want)
	}
	if s.Done() {
		t.Fatal("done with task 5 still running")
	}
	if got := s.Succeeded(5); len(got) != 0 {
		t.Errorf("a skipped task became ready: %v", got)
	}
	if !s.Done() {
		t.Fatal("not done: every task ended or was skipped")
	}
}

func TestSchedulerSkipsOnlyWhatHasNotEnded(t *testing.T) {
	// 2 waits on 0 and 1. 0 succeeds, 1 fails: 2 is skipped once and
	// counted once.
	s := newScheduler([][]int{nil, nil, {0, 1}})
	s.Next()
	s.Next()
	s.Succeeded(0)
	if got := s.Failed(1); !slices.Equal(got, []int{2}) {
		t.Fatalf("skipped %v, want [2]", got)
	}
	if !s.Done() {
		t.Fatal("not done")
	}
	// A task that ends undispatched (the run stopped) skips its dependents too.
	s = newScheduler([][]int{nil, {0}})
	i, _ := s.Next()
	if got := s.Failed(i); !slices.Equal(got, []int{1}) || !s.Done() {
		t.Fatalf("undispatched root: skipped %v, done %v", got, s.Done())
	}
}
