package orchestrator

import (
	"strings"
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

func forecasterOf(limit, held, minRes int64, caps ...int64) *forecaster {
	s := &fanoutv1.RunSpec{}
	for _, c := range caps {
		s.Tasks = append(s.Tasks, &fanoutv1.TaskSpec{TokenBudget: c})
	}
	return newForecaster(&plan{spec: s, minReservation: minRes}, limit, held)
}

// TestForecastRestsOnPeaksThenCaps: before any task answered, a task's
// forecast is its token_budget (never more than the tasks may claim: the
// run's limit less what it holds and its min_reservation), or an even
// share without one; after, the average peak of those that answered,
// capped at its token_budget. A task that did not answer does not count.
func TestForecastRestsOnPeaksThenCaps(t *testing.T) {
	f := forecasterOf(12_000, 3_000, 500, 9_000, 0, 2_000, 0)
	for i, want := range []int64{8_500, 2_125, 2_000, 2_125} {
		if got, _ := f.forecast(i); got != want {
			t.Errorf("task %d: forecast %d before any answered, want %d", i, got, want)
		}
	}
	f.ended(0, 1_000, 0, false) // cut off: says nothing of what a task needs
	f.ended(1, 1_900, 2_900, true)
	f.ended(3, 2_000, 3_100, true)
	for i, want := range []int64{3_000, 3_000, 2_000} {
		if got, _ := f.forecast(i); got != want {
			t.Errorf("task %d: forecast %d after two answered with peaks 2,900 and 3,100, want %d", i, got, want)
		}
	}
}

// TestAdmissionByForecast: a task starts when what is left, less what the
// tasks in flight are forecast to still need, covers its forecast; it
// waits while a task is in flight; with none in flight it is refused, and
// its reason gives the figures.
func TestAdmissionByForecast(t *testing.T) {
	f := forecasterOf(10_000, 1_000, 500, 3_000, 3_000, 3_000, 3_000) // 8,500 to claim
	for i := range 2 {
		if v, n, _ := f.admit(i); v != admit || n != 3_000 {
			t.Fatalf("task %d: %v, forecast %d; want admitted at 3,000", i, v, n)
		}
	}
	if v, _, _ := f.admit(2); v != hold { // 8,500 - 6,000 committed < 3,000
		t.Fatalf("task 2: %v with two in flight; want it held", v)
	}
	f.progress(0, 1_000, 1_200) // task 0 spent 1,000 of its 3,000: 2,000 still committed
	if v, _, _ := f.admit(2); v != hold {
		t.Fatalf("task 2: %v; want it held (7,500 left, 5,000 committed)", v)
	}
	f.ended(0, 2_500, 3_000, true)
	f.ended(1, 2_500, 3_000, true)
	// 8,500 - 5,000 spent = 3,500 left: task 2 fits, task 3 does not.
	if v, _, _ := f.admit(2); v != admit {
		t.Fatalf("task 2: %v with 3,500 left and none in flight; want admitted", v)
	}
	if v, n, _ := f.admit(3); v != hold || n != 3_000 {
		t.Fatalf("task 3: %v, forecast %d; want held behind task 2", v, n)
	}
	f.ended(2, 2_800, 3_000, true)
	v, n, why := f.admit(3)
	if v != refuse || n != 3_000 || !strings.Contains(why, "forecast to cost 3000 tokens") ||
		!strings.Contains(why, "had 700 left") || !strings.Contains(why, "1000 more are held") {
		t.Fatalf("task 3: %v, forecast %d, %q; want refused, naming its forecast, what was left and what is held", v, n, why)
	}
}

// TestWindDownWhenWhatIsLeftPaysOnlyForFinalAnswers: the run winds down
// once what is left no longer pays for what the tasks in flight still
// need: each its next call (its last grant plus that grant's growth) and
// the rest of its forecast (before any task answered, one more call).
// Once wound down, no task starts.
func TestWindDownWhenWhatIsLeftPaysOnlyForFinalAnswers(t *testing.T) {
	f := forecasterOf(10_500, 0, 500, 5_000, 5_000, 5_000) // 10,000 to claim
	f.admit(0)
	f.admit(1)
	// Each spent 1,000 under a grant of 1,500: 8,000 left; each still
	// needs 2 x (1,500 + 1,500) = 6,000 before any answered.
	if f.progress(0, 1_000, 1_500) {
		t.Fatal("wound down with 9,000 left for 6,000 + 3,000 needed")
	}
	if !f.progress(1, 1_000, 1_500) {
		t.Fatal("not wound down with 8,000 left for 12,000 needed")
	}
	if f.progress(0, 2_000, 1_500) {
		t.Fatal("wound down twice")
	}
	if v, _, _ := f.admit(2); v != hold {
		t.Fatalf("task 2 after the wind-down, two in flight: %v; want held", v)
	}
	f.ended(0, 2_500, 3_000, true)
	f.ended(1, 2_500, 3_000, true)
	if v, _, why := f.admit(2); v != refuse || !strings.Contains(why, "wound down") || !strings.Contains(why, "with 5000 left") {
		t.Fatalf("task 2 after the wind-down: %v (%q); want refused, saying the run wound down", v, why)
	}
}
