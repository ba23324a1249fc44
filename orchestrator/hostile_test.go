package orchestrator_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/tenant"
)

// TestCancelOnlyKeyReadsNoRun (issue 23, item 9): CancelRun answered to a
// key with the cancel scope but not read gives the run's id, state and
// cause — not its spec, joined result or task summaries, which only a read
// key may see (GetRun). A key with read gets the run whole.
func TestCancelOnlyKeyReadsNoRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	s := spec("cancel-only", 2, 200_000)
	s.Goal = "a secret goal"
	started, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	watchAll(t, n.client, started.GetRunId()) // ended: CancelRun returns it as it is
	srv := orchestrator.NewServer(n.engine)
	req := &fanoutv1.CancelRunRequest{RunId: started.GetRunId()}
	canceller := tenant.NewContext(t.Context(), tenant.Principal{Tenant: "t1", KeyID: "fk_00000000000000c1", Scopes: []tenant.Scope{tenant.ScopeCancel}})
	got, err := srv.CancelRun(canceller, req)
	if err != nil {
		t.Fatal(err)
	}
	r := got.GetRun()
	if r.GetRunId() != started.GetRunId() || r.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("CancelRun for a cancel-only key: run %s %s; want its id and state", r.GetRunId(), r.GetState())
	}
	if r.GetSpec() != nil || r.GetResult() != nil {
		t.Errorf("CancelRun for a cancel-only key returned the spec (%v) or the joined result (%v)", r.GetSpec() != nil, r.GetResult() != nil)
	}
	for _, o := range r.GetTasks() {
		if o.GetSummary() != nil {
			t.Errorf("CancelRun for a cancel-only key returned task %s's summary", o.GetTaskId())
		}
	}
	reader := tenant.NewContext(t.Context(), tenant.Principal{Tenant: "t1", KeyID: "fk_00000000000000c2", Scopes: []tenant.Scope{tenant.ScopeCancel, tenant.ScopeRead}})
	if got, err := srv.CancelRun(reader, req); err != nil || got.GetRun().GetSpec().GetGoal() != s.GetGoal() || got.GetRun().GetResult() == nil {
		t.Errorf("CancelRun for a key that may read: %v, %v; want the run whole", got.GetRun().GetSpec(), err)
	}
}

// TestIdempotentRetryOfAnExhaustedTenant (issue 23, item 10): once the
// tenant is below its minimum a new run is refused, but StartRun with an
// existing run's idempotency key and spec is a retry of the call that
// created it: it returns that run, as it does for any tenant.
func TestIdempotentRetryOfAnExhaustedTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	if _, err := b.ledger.SetTenantBudget(t.Context(), budget.TenantBudget{TenantID: "t1", Limit: 1_000_000,
		Period: budget.Period{Kind: budget.PeriodDay}, Actor: storetest.Actor(t, b.pool)}); err != nil {
		t.Fatal(err)
	}
	s := spec("retry-me", 1, 1000)
	first, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	watchAll(t, n.client, first.GetRunId())
	// The tenant's budget is lowered under what it spent: exhausted.
	if _, err := b.ledger.SetTenantBudget(t.Context(), budget.TenantBudget{TenantID: "t1", Limit: 1,
		Period: budget.Period{Kind: budget.PeriodDay}, Actor: storetest.Actor(t, b.pool)}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec("new-run", 1, 1000)}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a new run of the exhausted tenant: %v; want RESOURCE_EXHAUSTED", err)
	}
	again, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil || again.GetRunId() != first.GetRunId() {
		t.Errorf("the retry of the first StartRun: %v, %v; want run %s", again.GetRunId(), err, first.GetRunId())
	}
	other := spec("retry-me", 2, 1000) // the key with another spec
	if _, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: other}); status.Code(err) != codes.AlreadyExists && status.Code(err) != codes.FailedPrecondition && status.Code(err) != codes.InvalidArgument {
		t.Errorf("the key with another spec: %v; want it refused as a mismatch, not a budget refusal", err)
	}
}

// TestModelNameOverTheLedgersLimit (issue 23, item 11): a model name
// longer than the ledger takes (256 bytes) is refused by validation, naming
// spec.model.model and the limit, with nothing written — not accepted and
// then failed task by task at the first reserve. 256 bytes are accepted.
func TestModelNameOverTheLedgersLimit(t *testing.T) {
	t.Parallel()
	s := spec("long-model", 1, 1000)
	s.Model.Model = strings.Repeat("m", budget.MaxModelLen+1)
	err := (orchestrator.Config{}).Validate(s)
	var ve budget.ValidationErrors
	if !errors.As(err, &ve) || len(ve) != 1 || ve[0].Field != "spec.model.model" ||
		!strings.Contains(ve[0].Reason, "256") {
		t.Errorf("a model name of %d bytes: %v; want one violation of spec.model.model naming the limit 256", len(s.Model.Model), err)
	}
	s.Model.Model = strings.Repeat("m", budget.MaxModelLen)
	if err := (orchestrator.Config{}).Validate(s); err != nil {
		t.Errorf("a model name of exactly %d bytes: %v", budget.MaxModelLen, err)
	}
}
