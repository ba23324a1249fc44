package main

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestTenantBudgetEndsEveryRunOfTheTenant: tenant acme has 30,000 tokens in
// all; three of its runs (each with a budget far above that) start at once
// on two orchestrator replicas over three worker processes, next to a run
// of tenant globex. The tenant's budget runs out: every acme run ends
// BUDGET_EXHAUSTED with the tenant's cause, seen from both replicas; no
// call is paid by a grant after a run's exhausting commit and every worker
// stops its calls; the tenant spent at most its limit; every account, the
// tenant's included, is conserved; and globex's run is unaffected.
func TestTenantBudgetEndsEveryRunOfTheTenant(t *testing.T) {
	t.Parallel()
	sim := []string{"--sim-latency", "600ms", "--sim-tool-calls", "1", "--sim-finish-after", "3",
		"--sim-output-tokens", "150"}
	c := startWorkers(t, [][]string{sim, sim, sim})
	orch := []*orchestratorProc{
		startOrchestratorMain(t, c.url, c.workers, "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep, "--name", "o1"),
		startOrchestratorMain(t, c.url, c.workers, "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep, "--name", "o2"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const tenantLimit = 30_000
	ta, err := store.NewLedger(c.pool).SetTenantBudget(ctx, budget.TenantBudget{TenantID: "acme", Limit: tenantLimit,
		Period: budget.Period{Kind: budget.PeriodNone}, Actor: storetest.Actor(t, c.pool), MinReservation: 2_000})
	if err != nil {
		t.Fatal(err)
	}

	specs := make([]*fanoutv1.RunSpec, 3)
	for i := range specs {
		specs[i] = e2eSpec("acme-"+string(rune('a'+i)), 24, 1_000_000)
		specs[i].TenantId = "acme"
	}
	other := e2eSpec("globex-run", 3, 1_000_000)
	other.TenantId = "globex"
	ids := make([]string, len(specs)+1)
	var wg sync.WaitGroup
	for i, s := range append(specs, other) {
		wg.Go(func() {
			resp, err := tenantClient(t, orch[i%2].addr, s.GetTenantId()).StartRun(ctx, &fanoutv1.StartRunRequest{Spec: s})
			if err != nil {
				t.Errorf("start %s: %v", s.GetIdempotencyKey(), err)
				return
			}
			ids[i] = resp.GetRunId()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	for i, runID := range ids {
		// Each run is watched on the replica that does not drive it.
		evs := watchAll(t, tenantClient(t, orch[(i+1)%2].addr, map[bool]string{true: "globex", false: "acme"}[i == 3]), runID, nil)
		fin := evs[len(evs)-1].GetRunFinished()
		if i == 3 {
			if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
				t.Errorf("globex's run ended %s (%q): another tenant's budget must not touch it", fin.GetState(), fin.GetCancelCause())
			}
			continue
		}
		if fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED || fin.GetCancelCause() != "tenant budget exhausted" {
			t.Errorf("acme run %d ended %s (%q), want BUDGET_EXHAUSTED (\"tenant budget exhausted\")", i, fin.GetState(), fin.GetCancelCause())
		}
	}
	for _, runID := range ids[:3] {
		calls := c.calls(t, runID)
		ex := c.exhaustion(t, runID)
		checkPaidBeforeExhaustion(t, ex, calls)
		for _, cl := range calls {
			if cl.End.After(ex.heard.Add(exhaustionMargin)) {
				t.Errorf("run %s: call %s/%d on %s ran until %v after its exhaustion notice", runID, cl.TaskID,
					cl.Iteration, cl.worker, cl.End.Sub(ex.heard).Round(time.Millisecond))
			}
		}
		checkConserved(t, c.pool, runID)
	}
	checkConserved(t, c.pool, ids[3])

	// The tenant account: within its limit, nothing held, conserved.
	var spent, reserved, limit int64
	var conserved bool
	if err := c.pool.QueryRow(ctx, `SELECT a.spent, a.reserved, a.limit_tokens, cc.conserved
		FROM account a JOIN conservation_check cc USING (account_id) WHERE a.account_id = $1`, int64(ta.ID)).
		Scan(&spent, &reserved, &limit, &conserved); err != nil {
		t.Fatalf("the tenant account in conservation_check: %v", err)
	}
	if spent > tenantLimit || limit != tenantLimit {
		t.Errorf("tenant acme spent %d of a %d limit (want limit %d)", spent, limit, tenantLimit)
	}
	if !conserved {
		t.Error("tenant acme's account is not conserved")
	}
	waitFor(t, 20*time.Second, "acme holds no reservation", func() (bool, string) {
		if err := c.pool.QueryRow(ctx, `SELECT reserved FROM account WHERE account_id = $1`, int64(ta.ID)).Scan(&reserved); err != nil {
			t.Fatal(err)
		}
		return reserved == 0, "reserved " + strconv.FormatInt(reserved, 10)
	})
	// No grant under the tenant after the first commit that exhausted it.
	var late int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entry
		WHERE kind = 'reserve' AND $1 = ANY (chain)
		  AND entry_id > (SELECT min(entry_id) FROM ledger_entry WHERE kind = 'exhaust' AND tenant_id = 'acme')`,
		int64(ta.ID)).Scan(&late); err != nil {
		t.Fatal(err)
	}
	if late != 0 {
		t.Errorf("%d reservations granted under tenant acme after the commit that exhausted it", late)
	}
	t.Logf("tenant acme spent %d of %d", spent, tenantLimit)
}
