package orchestrator

import "testing"

// TestAShortStartIsWoundDownFromTheStart: docs/budget.md, "Starting a task
// with less than its forecast". Once no task is in flight, a task whose
// forecast what is left cannot pay for, but that pays for a useful
// iteration and a final answer (usefulOf: usefulCost's floor, or a first
// iteration's spend plus a second grant once more), starts short instead
// of NOT_STARTED: forecast at that, and wound down from the start (the
// driver sends Dispatch.wind_down_after = 1); its answer does not count in
// the average the next forecasts rest on. Less than that left and it is
// refused.
func TestAShortStartIsWoundDownFromTheStart(t *testing.T) {
	f := forecasterOf(10_000, 0, 500, 4_000, 4_000, 4_000, 4_000, 4_000) // 9,500 to claim; usefulCost 2,560
	for i := range 2 {
		if v, _, _ := f.admit(i); v != admit {
			t.Fatalf("task %d: %s; want admitted at its 4,000 cap", i, verdictName[v])
		}
	}
	if v, _, _ := f.admit(2); v != hold { // 9,500 - 8,000 committed: held, not started short
		t.Fatalf("task 2: %s with 1,500 left to commit and tasks in flight; want held", verdictName[v])
	}
	f.progress(0, 600, 1_400, false)
	f.progress(0, 1_300, 1_500, false) // 600 + 1,500: less than the floor
	f.ended(0, 2_000, 3_500, true)
	if v, n, _ := f.admit(2); v != admit || n != 3_500 { // 7,500 left, 3,500 committed
		t.Fatalf("task 2: %s at %d; want admitted at the 3,500 average peak", verdictName[v], n)
	}
	f.ended(1, 1_000, 3_500, true)
	f.ended(2, 3_200, 3_500, true)
	// 9,500 - 6,200 spent = 3,300: not the 3,500 forecast, but more than
	// the 2,560 a useful iteration and an answer cost.
	if v, n, _ := f.admit(3); v != short || n != 2_560 {
		t.Fatalf("task 3: %s at %d with 3,300 left; want started short at 2,560", verdictName[v], n)
	}
	if tf := f.flight[3]; tf == nil || !tf.short {
		t.Fatal("task 3 is not in flight as started short")
	}
	f.ended(3, 1_200, 2_000, true)
	// Its answer after one iteration is not a whole task's need.
	if n, _ := f.forecast(4); n != 3_500 {
		t.Errorf("task 4 forecast at %d after the short task answered; want 3,500, the average of the whole tasks", n)
	}
	// 2,100 left: less than a useful iteration; none in flight.
	if v, _, _ := f.admit(4); v != refuse {
		t.Fatalf("task 4 with 2,100 left for a 2,560 useful iteration: %s; want refused", verdictName[v])
	}
}

// TestATaskThatAnsweredNeedsNoNextCall: docs/budget.md#wind-down-instead-of-cut-off.
// A task whose last iteration was its answer (SubagentIteration.last)
// still counts as in flight until its outcome is in, but it needs no next
// call: the tasks in flight are not wound down for a call it will never
// make, and it commits nothing more against the next task's admission.
func TestATaskThatAnsweredNeedsNoNextCall(t *testing.T) {
	f := forecasterOf(10_000, 0, 500, 3_000, 3_000, 3_000, 3_000) // 9,500 to claim
	for i := range 2 {
		if v, _, _ := f.admit(i); v != admit {
			t.Fatalf("task %d: %s; want admitted at its 3,000 cap", i, verdictName[v])
		}
	}
	f.progress(1, 600, 1_500, false)
	f.progress(0, 600, 1_500, false)
	f.progress(0, 1_300, 1_700, false)
	// Task 0 answers at 3,800 spent: 5,100 left. Had it a next call
	// (2,100 and its growth, and one after: 5,000), with task 1's 3,000
	// the run could not pay for it; it has none.
	if got := f.progress(0, 3_800, 2_100, true); got != nil {
		t.Fatalf("wound down %v when task 0 had answered: it needs no next call", got)
	}
	// 5,100 left less the 2,400 task 1 still needs: not task 2's 3,000.
	if v, _, _ := f.admit(2); v != hold {
		t.Fatalf("task 2: %s; want held", verdictName[v])
	}
	f.progress(1, 1_000, 1_500, false)
	f.ended(1, 1_000, 2_500, false)
	// Task 0, answered, commits nothing: 9,500 - 4,800 = 4,700 for task 2.
	if v, _, _ := f.admit(2); v != admit {
		t.Fatalf("task 2: %s with task 0 answered and 4,700 left; want admitted", verdictName[v])
	}
}
