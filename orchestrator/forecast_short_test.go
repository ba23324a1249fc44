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
	f.progress(0, 600, 1_400)
	f.progress(0, 1_300, 1_500) // 600 + 1,500: less than the floor
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
