package fleet

import (
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestEventKindAndNumber: an event's kind is its oneof field's name, and
// its number the first integer field whose name holds the word asked for,
// however deep: a bench reads a kind its Go code has no field for.
func TestEventKindAndNumber(t *testing.T) {
	started := &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskStarted{TaskStarted: &fanoutv1.TaskStarted{TaskId: "t1", ForecastTokens: 900}}}
	if got := EventKind(started); got != "task_started" {
		t.Errorf("kind %q, want task_started", got)
	}
	if n, ok := EventNumber(started, "forecast"); !ok || n != 900 {
		t.Errorf("forecast %d, %v; want 900", n, ok)
	}
	update := &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_BudgetUpdate{BudgetUpdate: &fanoutv1.BudgetUpdate{
		Budget: &fanoutv1.BudgetSnapshot{LimitTokens: 100, AvailableTokens: 60, SpentTokens: 40}}}}
	if n, ok := EventNumber(update, "spent"); !ok || n != 40 {
		t.Errorf("spent %d, %v; want 40 (nested in the snapshot)", n, ok)
	}
	if n, ok := EventNumber(update, "available_tokens"); !ok || n != 60 {
		t.Errorf("available_tokens %d, %v; want 60", n, ok)
	}
	if n, ok := EventNumber(update, "tokens"); !ok || n != 100 {
		t.Errorf("tokens %d, %v; want 100 (the first field whose name holds it)", n, ok)
	}
	if _, ok := EventNumber(update, "concurrency"); ok {
		t.Error("a budget update has a concurrency")
	}
	if got := EventKind(&fanoutv1.RunEvent{}); got != "" {
		t.Errorf("an empty event's kind is %q", got)
	}
}

func TestQuantile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.95, 95 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := Quantile(ds, c.q); got != c.want {
			t.Errorf("q%v = %v, want %v", c.q, got, c.want)
		}
	}
	if ds[0] != 100*time.Millisecond {
		t.Error("Quantile sorted its argument")
	}
	if Quantile(nil, 0.5) != 0 {
		t.Error("the quantile of none is not 0")
	}
}
