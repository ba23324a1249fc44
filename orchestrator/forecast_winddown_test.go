package orchestrator

import (
	"slices"
	"testing"
)

// TestWindDownAloneHoldsTheNextTask: docs/budget.md, "No task starts until
// the wound-down tasks have ended", where nothing else holds the next task.
// Two tasks are wound down; one ends (it answered: the forecast now rests
// on its peak) while the other is still in flight. The next task's
// forecast then fits what is left less what the task in flight still needs
// (the forecast rule alone would start it), but it waits, because a
// wound-down task has not ended. Once that one ends it starts.
// TestWindDownWhenWhatIsLeftPaysOnlyForFinalAnswers checks the hold only
// where the forecast holds the task too.
func TestWindDownAloneHoldsTheNextTask(t *testing.T) {
	f := forecasterOf(10_500, 0, 500, 5_000, 5_000, 1_000) // 10,000 to claim
	for i := range 2 {
		if v, _, _ := f.admit(i); v != admit {
			t.Fatalf("task %d: %s; want admitted at its 5,000 cap", i, verdictName[v])
		}
	}
	if v, _, _ := f.admit(2); v != hold { // 10,000 - 10,000 committed < 1,000
		t.Fatalf("task 2: %s with tasks 0 and 1 in flight; want it held by the forecast", verdictName[v])
	}
	if got := f.progress(0, 1_000, 1_500, false); got != nil {
		t.Fatalf("wound down %v with 9,000 left for 2 x 1,500 + 2 x 1,500", got)
	}
	if got := f.progress(1, 1_000, 1_500, false); got != nil {
		t.Fatalf("wound down %v with 8,000 left for 6,000 needed", got)
	}
	// Task 0's grant grew to 3,000: it needs 2 x (3,000 + 1,500), task 1
	// 2 x 1,500: 12,000 of the 6,500 left.
	if got := f.progress(0, 2_500, 3_000, false); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("wound down %v with 6,500 left for 12,000 needed; want tasks 0 and 1", got)
	}
	// Task 1 answers with what it has: a peak of 2,000.
	f.ended(1, 1_500, 2_000, true)

	// Task 2's forecast is 1,000 (its cap, below the 2,000 average); 6,000
	// is left (10,000 less 1,500 and 2,500) and task 0 still needs at most
	// 3,000 (its last grant): 3,000 to spare. Only the wind-down holds it.
	n, _ := f.forecast(2)
	left, committed := f.left(), f.committed()
	if n != 1_000 || left != 6_000 || committed != 3_000 {
		t.Fatalf("forecast %d, left %d, committed %d; want 1,000, 6,000 and 3,000", n, left, committed)
	}
	if left-committed < n {
		t.Fatalf("left %d - committed %d < forecast %d: the forecast holds task 2 too, the test shows nothing", left, committed, n)
	}
	if v, _, _ := f.admit(2); v != hold {
		t.Fatalf("task 2 while wound-down task 0 runs: %s; want held, though the forecast alone would start it", verdictName[v])
	}
	if got := f.forecastOf(2); got != 0 {
		t.Fatalf("task 2 counts as in flight (forecast %d) after it was held", got)
	}

	f.ended(0, 5_000, 5_500, true)
	// 10,000 - 6,500 = 3,500 left, nothing in flight: task 2 starts.
	if v, n, _ := f.admit(2); v != admit || n != 1_000 {
		t.Fatalf("task 2 once the wound-down tasks ended: %s, forecast %d; want admitted at 1,000", verdictName[v], n)
	}
}

var verdictName = map[admission]string{admit: "admitted", hold: "held", refuse: "refused", short: "started short"}
