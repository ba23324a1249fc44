package orchestrator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// The mark's bookkeeping at the edges the end-to-end tests cannot time
// (docs/budget.md, "When the budget ran out"): the ledger's word that the
// budget ran out reaches the driver (markExhausted sets exhausted, then
// reads the account) while a cancel or a timeout decides another end; an
// append of the mark fails. The log and the account are stand-ins: what is
// under test is the driver's rule, not what the store does with an event.

// markLog is a run's event log that counts BudgetExhausted and can fail
// the next appends.
type markLog struct {
	RunStore
	mu    sync.Mutex
	marks int
	fail  int
}

func (l *markLog) AppendEvent(_ context.Context, _ string, ev *fanoutv1.RunEvent) (*fanoutv1.RunEvent, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail > 0 {
		l.fail--
		return nil, errors.New("connection reset")
	}
	if ev.GetBudgetExhausted() != nil {
		l.marks++
	}
	return ev, nil
}

func (l *markLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.marks
}

// exhaustedAccount is a ledger whose run account has run out.
type exhaustedAccount struct{ budget.Ledger }

func (exhaustedAccount) RunAccount(context.Context, string) (budget.Account, error) {
	return budget.Account{Limit: 1000, Spent: 990, State: budget.StateExhausted}, nil
}

func markDriver(log *markLog) *driver {
	e := &Engine{store: log, ledger: exhaustedAccount{},
		cfg:       Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		followers: newFollowers(log, time.Hour, func(error) {})}
	return &driver{e: e, ar: newActiveRun(func(error) {}), runID: "r"}
}

// TestAnEndThatOvertakesTheLedgersWordStillMarksIt: the ledger said the
// budget ran out (exhausted is set) but its mark is not appended yet when
// a cancel decides the run's end: the end appends the mark, once, and the
// late announcement adds none. A run the ledger never exhausted that ends
// CANCELLED has no mark.
func TestAnEndThatOvertakesTheLedgersWordStillMarksIt(t *testing.T) {
	log := &markLog{}
	d := markDriver(log)
	d.exhausted = true // markExhausted's first step; its announcement comes after the end
	d.settleExhaustion(t.Context(), fanoutv1.RunState_RUN_STATE_CANCELLED)
	d.announceExhaustion(t.Context(), nil)
	if got := log.count(); got != 1 {
		t.Errorf("a run the ledger exhausted, ended CANCELLED first: %d BudgetExhausted, want 1", got)
	}

	quiet := &markLog{}
	markDriver(quiet).settleExhaustion(t.Context(), fanoutv1.RunState_RUN_STATE_CANCELLED)
	if got := quiet.count(); got != 0 {
		t.Errorf("a cancelled run whose budget never ran out: %d BudgetExhausted, want 0", got)
	}
}

// TestAFailedMarkIsAppendedAtTheEnd: the mark's append fails; the run's
// end appends it, once.
func TestAFailedMarkIsAppendedAtTheEnd(t *testing.T) {
	log := &markLog{fail: 1}
	d := markDriver(log)
	d.announceExhaustion(t.Context(), nil)
	if got := log.count(); got != 0 {
		t.Fatalf("after a failed append: %d BudgetExhausted, want 0", got)
	}
	d.settleExhaustion(t.Context(), fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED)
	d.announceExhaustion(t.Context(), nil)
	if got := log.count(); got != 1 {
		t.Errorf("the end after a failed mark: %d BudgetExhausted, want 1", got)
	}
}
