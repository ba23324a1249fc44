package budget

import "time"

// OpenChildRunParams opens a child run: a run whose budget is carved from
// one task of another run (docs/ledger.md#child-runs). The ledger grants
// the child up to Want of what the parent task has left, as it grants a
// call of the task's current attempt (at least Min, else nothing), and
// opens the child's account with exactly that grant as its limit, held on
// every account above the task by one funding reservation under a lease of
// TTL until the child closes.
type OpenChildRunParams struct {
	RunID      string    // the child run's id, new
	TenantID   string    // the parent's tenant
	ParentTask AccountID // the task account the child is carved from
	Attempt    int64     // the parent task's current attempt
	Want       int64     // the child's budget asked for, > 0
	// Min is the least grant worth a child run (>= 1, <= Want), and the
	// child's min_reservation.
	Min   int64
	TTL   time.Duration // the funding reservation's lease, renewed while the child runs
	Tasks []TaskBudget  // the child's tasks, as OpenRunParams.Tasks
}

// Validate checks p before anything is written.
func (p OpenChildRunParams) Validate() error {
	if p.ParentTask <= 0 {
		return invalid("parent_task", "must be a positive account id, got %d", p.ParentTask)
	}
	if err := (ReserveParams{Account: p.ParentTask, RunID: p.RunID, TenantID: p.TenantID, Attempt: p.Attempt,
		Want: p.Want, Min: p.Min, Holder: "child", TTL: p.TTL}).Validate(); err != nil {
		return err
	}
	return OpenRunParams{RunID: p.RunID, TenantID: p.TenantID, Limit: p.Want, MinReservation: p.Min, Tasks: p.Tasks}.Validate()
}
