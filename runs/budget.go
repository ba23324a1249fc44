package runs

import (
	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Snapshot is the API's view of a run's ledger account: what RunStarted,
// every BudgetUpdate and GetRun report. The store writes it into the
// events it owns (a new run's RunStarted, a closed run's last
// BudgetUpdate) and the orchestrator into the ones it sends while a run
// goes on, so both say it the same way.
func Snapshot(a budget.Account) *fanoutv1.BudgetSnapshot {
	return &fanoutv1.BudgetSnapshot{
		LimitTokens:     a.Limit,
		AvailableTokens: a.Available(),
		ReservedTokens:  a.Reserved,
		SpentTokens:     a.Spent,
		Exhausted:       a.State == budget.StateExhausted,
		HeldTokens:      a.Held,
	}
}
