package orchestrator

import (
	"context"
	"errors"
	"fmt"
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

// TestJoinAllows (docs/budget.md#continue): a continuation is refused
// when the run's join policy would stop the reopened run at once.
func TestJoinAllows(t *testing.T) {
	const (
		ok   = fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED
		cut  = fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED
		none = fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED
	)
	tasks := func(s ...fanoutv1.TaskStatus) []*fanoutv1.TaskOutcome {
		var out []*fanoutv1.TaskOutcome
		for i, st := range s {
			out = append(out, &fanoutv1.TaskOutcome{TaskId: fmt.Sprintf("t%d", i), Status: st})
		}
		return out
	}
	for _, c := range []struct {
		policy  fanoutv1.JoinPolicy
		tasks   []*fanoutv1.TaskOutcome
		refused bool
	}{
		{fanoutv1.JoinPolicy_JOIN_POLICY_ALL_SETTLED, tasks(ok, cut, none), false},
		{fanoutv1.JoinPolicy_JOIN_POLICY_FAIL_FAST, tasks(ok, ok, none), false},
		{fanoutv1.JoinPolicy_JOIN_POLICY_FAIL_FAST, tasks(ok, cut, none), true},
		{fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS, tasks(cut, none), false},
		{fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS, tasks(ok, none), true},
	} {
		p := &plan{spec: &fanoutv1.RunSpec{JoinPolicy: c.policy}}
		err := joinAllows(p, c.tasks, []int{len(c.tasks) - 1})
		if (err != nil) != c.refused {
			t.Errorf("%s over %v: %v, refused want %v", c.policy, c.tasks, err, c.refused)
		}
	}
}

// TestForecastCountsSpendBesideTheTasks (docs/budget.md#continue): a
// reopened run's forecast admits against what its earlier syntheses left
// of the limit, not against the limit less its tasks' spend alone.
func TestForecastCountsSpendBesideTheTasks(t *testing.T) {
	p := &plan{spec: &fanoutv1.RunSpec{Tasks: []*fanoutv1.TaskSpec{{Id: "a", TokenBudget: 9_000}}}, minReservation: 1}
	before := newForecaster(p, 10_000, 0).left()
	p.spentBeside = 700
	if got := newForecaster(p, 10_000, 0).left(); got != before-700 {
		t.Errorf("left %d after 700 spent beside the tasks, want %d", got, before-700)
	}
}
