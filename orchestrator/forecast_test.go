package orchestrator

import (
	"slices"
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
	f.progress(0, 1_000, 1_200, false) // task 0 spent 1,000 of its 3,000: 2,000 still committed
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

// TestWindDownWhenWhatIsLeftPaysOnlyForFinalAnswers: the tasks in flight
// are wound down once what is left no longer pays for what they still
// need: each its next call (its last grant, plus that grant's growth over
// the one before) and the rest of its forecast (before any task answered,
// one more call). No task starts until they have ended; then tasks start
// as the forecast allows, and are not wound down.
func TestWindDownWhenWhatIsLeftPaysOnlyForFinalAnswers(t *testing.T) {
	f := forecasterOf(10_500, 0, 500, 5_000, 5_000, 2_000) // 10,000 to claim
	f.admit(0)
	f.admit(1)
	// Each spent 1,000 under a first grant of 1,500 and still needs
	// 2 x 1,500 before any answered: 6,000 of the 8,000 left.
	if got := f.progress(0, 1_000, 1_500, false); got != nil {
		t.Fatalf("wound down %v with 9,000 left for 3,000 + 3,000 needed", got)
	}
	if got := f.progress(1, 1_000, 1_500, false); got != nil {
		t.Fatalf("wound down %v with 8,000 left for 6,000 needed", got)
	}
	// Task 0's next grant grew to 2,500: it needs 2 x (2,500 + 1,000),
	// task 1 3,000: 10,000 of the 6,000 left.
	if got := f.progress(0, 3_000, 2_500, false); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("wound down %v with 6,000 left for 10,000 needed; want tasks 0 and 1", got)
	}
	if got := f.progress(1, 2_000, 1_500, false); got != nil {
		t.Fatalf("wound down %v again", got)
	}
	if v, _, _ := f.admit(2); v != hold {
		t.Fatalf("task 2 while the wound-down tasks run: %v; want held", v)
	}
	f.ended(0, 3_500, 5_500, true)
	f.ended(1, 2_500, 3_500, true)
	// 10,000 - 6,000 = 4,000 left; task 2's forecast is its 2,000 cap.
	if v, n, _ := f.admit(2); v != admit || n != 2_000 {
		t.Fatalf("task 2 once they ended: %v, forecast %d; want admitted at 2,000", v, n)
	}
}

// TestTasksClaimAllButTheHeldWhenTheirBudgetsFit: docs/budget.md, "what the
// tasks may claim". When every task has a token_budget and they add up to
// at most the run's limit less what it holds, the tasks may claim all of
// that, and every task starts at once on its token_budget; one token more
// (or a task without one) and they may claim that less the run's
// min_reservation, as before, so the last task waits.
func TestTasksClaimAllButTheHeldWhenTheirBudgetsFit(t *testing.T) {
	for _, c := range []struct {
		name             string
		limit, held, min int64
		caps             []int64
		claim            int64
		startedTogether  int
	}{
		{name: "the sum", limit: 50_000, min: 256, caps: tenOf(5_000), claim: 50_000, startedTogether: 10},
		{name: "more than the sum", limit: 60_000, min: 256, caps: tenOf(5_000), claim: 60_000, startedTogether: 10},
		{name: "the sum and the held", limit: 53_000, held: 3_000, min: 256, caps: tenOf(5_000), claim: 50_000, startedTogether: 10},
		{name: "one token short", limit: 49_999, min: 256, caps: tenOf(5_000), claim: 49_743, startedTogether: 9},
		{name: "one token short, with the held", limit: 52_999, held: 3_000, min: 256, caps: tenOf(5_000), claim: 49_743, startedTogether: 9},
		{name: "a task without a token_budget", limit: 1_000_000, min: 256, caps: []int64{5_000, 0}, claim: 999_744, startedTogether: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := forecasterOf(c.limit, c.held, c.min, c.caps...)
			if f.budget != c.claim {
				t.Errorf("the tasks may claim %d, want %d", f.budget, c.claim)
			}
			started := 0
			for i := range c.caps {
				if v, _, _ := f.admit(i); v == admit {
					started++
				}
			}
			if started != c.startedTogether {
				t.Errorf("%d of %d tasks started at once, want %d", started, len(c.caps), c.startedTogether)
			}
		})
	}
}

func tenOf(c int64) []int64 { return []int64{c, c, c, c, c, c, c, c, c, c} }
