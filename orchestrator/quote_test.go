package orchestrator_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/llm"
)

// ledgerRows counts the rows a run writes: runs, ledger accounts and
// journal entries.
func (b *testBundle) ledgerRows(t *testing.T) [3]int {
	t.Helper()
	var n [3]int
	if err := b.pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM run), (SELECT count(*) FROM account),
		(SELECT count(*) FROM ledger_entry)`).Scan(&n[0], &n[1], &n[2]); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDryRunWritesNothing: docs/budget.md#quotes. A dry run answers a
// quote (each task's forecast, the synthesis allowance, the admitted tasks,
// the money at the model's price, the tenant's coverage) and writes no run,
// no account, no journal entry, and leaves its idempotency key unused: a
// run started after it with that key and another spec is created, not
// refused as a mismatch.
func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	if _, err := b.ledger.SetTenantBudget(t.Context(), budget.TenantBudget{TenantID: "t1", Limit: 1_000_000,
		MinReservation: 100, Actor: storetest.Actor(t, b.pool)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(t.Context(), `SELECT price_set('role:' || current_user, 'm1', now() - interval '1 day', 3, 15, 'USD', 'test price')`); err != nil {
		t.Fatal(err)
	}
	before := b.ledgerRows(t)
	s := spec("dry-1", 5, 20_000)
	s.Model.Model = "m1"
	s.Synthesize = true
	for _, task := range s.GetTasks() {
		task.TokenBudget = 5_000
	}
	resp, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if after := b.ledgerRows(t); after != before {
		t.Fatalf("rows (runs, accounts, entries) %v before a dry run, %v after: a dry run writes nothing", before, after)
	}
	q := resp.GetQuote()
	if resp.GetRunId() != "" || q == nil {
		t.Fatalf("dry run answered run %q, quote %v; want a quote and no run", resp.GetRunId(), q)
	}
	t.Logf("quote: %v", q)
	var sum int64
	for i, line := range q.GetTasks() {
		if line.GetTaskId() != s.GetTasks()[i].GetId() || !line.GetRuns() || line.GetForecastTokens() != 5_000 {
			t.Errorf("line %d: %v; want task %s, running, forecast at its 5,000 token_budget (no prior)", i, line, s.GetTasks()[i].GetId())
		}
		sum += line.GetForecastTokens()
	}
	if q.GetTasksTokens() != sum || q.GetSynthesisTokens() <= 0 || q.GetForecastTokens() != sum+q.GetSynthesisTokens() ||
		q.GetLimitTokens() != 20_000 || q.GetBasis() != "token_budget" {
		t.Errorf("totals: %v; want tasks %d, a synthesis allowance, their sum, the limit 20000, basis token_budget", q, sum)
	}
	// What the tasks may claim is 20,000 less the allowance: three 5,000
	// forecasts fit in dispatch order, a fourth does not.
	if want := int32(min(5, (20_000-q.GetSynthesisTokens())/5_000)); q.GetAdmittedTasks() != want {
		t.Errorf("admitted %d tasks; want %d", q.GetAdmittedTasks(), want)
	}
	if !q.GetTenantBudget() || q.GetTenantAvailableTokens() != 1_000_000 || !q.GetTenantCovers() {
		t.Errorf("tenant: budget %v, available %d, covers %v; want a budget of 1,000,000 that covers it",
			q.GetTenantBudget(), q.GetTenantAvailableTokens(), q.GetTenantCovers())
	}
	// Priced at the higher of the input and output prices (15 a million).
	if want := fmt.Sprintf("%.6f", float64(q.GetForecastTokens())*15/1e6); len(q.GetCost()) != 1 ||
		q.GetCost()[0].GetCurrency() != "USD" || !sameDecimal(q.GetCost()[0].GetCost(), want) {
		t.Errorf("cost: %v; want one USD line of %s", q.GetCost(), want)
	}
	// The key was not used: another spec under it starts a run.
	other := proto.CloneOf(s)
	other.Goal = "another goal"
	other.Budget.LimitTokens = 30_000
	started, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: other})
	if err != nil {
		t.Fatalf("a run with the dry run's key and another spec: %v; want it created", err)
	}
	watchAll(t, n.client, started.GetRunId())
}

// sameDecimal reports whether two decimal strings are the same number.
func sameDecimal(a, b string) bool {
	var x, y float64
	if _, err := fmt.Sscan(a, &x); err != nil {
		return false
	}
	if _, err := fmt.Sscan(b, &y); err != nil {
		return false
	}
	return math.Abs(x-y) < 1e-9
}

// TestDryRunValidatesAsStartRun: every bad spec TestValidateBadRequests
// sends is refused by a dry run with the same code and the same field
// violations, and none of them writes anything.
func TestDryRunValidatesAsStartRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "v1", orchestrator.Config{MaxRunTokens: 1e9})
	for _, tc := range badCases() {
		s := validSpec()
		tc.mutate(s)
		_, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: proto.CloneOf(s)})
		_, dry := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s, DryRun: true})
		st, dst := status.Convert(err), status.Convert(dry)
		if dst.Code() != st.Code() || dst.Code() == codes.OK {
			t.Errorf("%s: dry run %s (%q), StartRun %s (%q); want the same refusal", tc.name, dst.Code(), dst.Message(),
				st.Code(), st.Message())
			continue
		}
		var want, got []string
		for _, v := range fieldViolations(st) {
			want = append(want, v.GetField()+": "+v.GetDescription())
		}
		for _, v := range fieldViolations(dst) {
			got = append(got, v.GetField()+": "+v.GetDescription())
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: dry run's violations %q; StartRun's %q", tc.name, got, want)
		}
	}
	b.checkNothingWritten(t, n)
}

// TestDryRunOfAnExhaustedTenant: a tenant whose budget is spent (below its
// min_reservation: StartRun refuses its runs) is not a refusal of a dry
// run: the quote says it does not cover the run.
func TestDryRunOfAnExhaustedTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	if _, err := b.ledger.SetTenantBudget(t.Context(), budget.TenantBudget{TenantID: "t1", Limit: 1_000,
		MinReservation: 1_000, Actor: storetest.Actor(t, b.pool)}); err != nil {
		t.Fatal(err)
	}
	first, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec("dry-spend", 1, 1_000)})
	if err != nil {
		t.Fatal(err)
	}
	watchAll(t, n.client, first.GetRunId())
	available := b.tenantSettled(t, "t1")
	if available <= 0 || available >= 1_000 {
		t.Fatalf("the tenant has %d of 1,000 tokens available after a run; want some spent, some left", available)
	}
	if _, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec("dry-x", 3, 20_000)}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("StartRun for the exhausted tenant: %v; want RESOURCE_EXHAUSTED", err)
	}
	resp, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec("dry-x", 3, 20_000), DryRun: true})
	if err != nil {
		t.Fatalf("dry run for the exhausted tenant: %v; want a quote", err)
	}
	if q := resp.GetQuote(); !q.GetTenantBudget() || q.GetTenantCovers() || q.GetTenantAvailableTokens() != available {
		t.Errorf("quote %v; want a tenant budget of %d available that does not cover it", q, available)
	}
	// reserve_quote on a dry run quotes only (TestReserveQuoteAtTheEdges).
	resp, err = n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec("dry-x", 3, 20_000), DryRun: true,
		ReserveQuote: true})
	if err != nil || resp.GetQuote() == nil || resp.GetRunId() != "" {
		t.Errorf("dry run with reserve_quote: %v, %v; want a quote and no run", resp, err)
	}
}

// tenantSettled waits until nothing is reserved or held on tenant's account
// (its runs' accounts closed) and returns what it has available.
func (b *testBundle) tenantSettled(t *testing.T, tenant string) int64 {
	t.Helper()
	for deadline := time.Now().Add(patience); ; {
		var available, pending int64
		if err := b.pool.QueryRow(t.Context(), `SELECT limit_tokens - reserved - spent - held, reserved + held
			FROM account WHERE tenant_id = $1 AND kind = 'tenant'`, tenant).Scan(&available, &pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			return available
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenant %s still has %d tokens reserved or held after %v", tenant, pending, patience)
		}
		time.Sleep(20 * time.Millisecond) // polling the ledger
	}
}

// TestReserveQuoteAtTheEdges: docs/budget.md#quotes. With reserve_quote a
// run starts only if its tenant's available tokens cover min(forecast,
// limit): a budget of exactly that starts it, one token less refuses it
// (RESOURCE_EXHAUSTED naming the tenant's budget and the figures, the
// quote in the details) and writes nothing; a run whose limit is below its
// forecast needs only its limit. A retry of the call that started a run is
// answered with that run though the tenant no longer covers the quote.
func TestReserveQuoteAtTheEdges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	quoted := func(tenant, key string, limit int64) *fanoutv1.RunSpec {
		s := spec(key, 3, limit)
		s.TenantId = tenant
		for _, task := range s.GetTasks() {
			task.TokenBudget = 2_000
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		limit  int64
		short  int64 // how far the tenant's budget is below min(forecast, limit)
		starts bool
	}{
		{"exactly covered", 20_000, 0, true},
		{"one token short", 20_000, 1, false},
		{"limit below forecast, covered", 5_000, 0, true},
		{"limit below forecast, one short", 5_000, 1, false},
	} {
		tenant := fmt.Sprintf("rq-%d-%d", tc.limit, tc.short)
		ctx := tenantCtx(t, tenant)
		dry, err := n.client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: quoted(tenant, "probe", tc.limit), DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		// No prior, no synthesis: three tasks at their 2,000 token_budget.
		if f := dry.GetQuote().GetForecastTokens(); f != 6_000 {
			t.Fatalf("%s: forecast %d; want 6000", tc.name, f)
		}
		need := min(6_000, tc.limit)
		if _, err := b.ledger.SetTenantBudget(t.Context(), budget.TenantBudget{TenantID: tenant, Limit: need - tc.short,
			MinReservation: 100, Actor: storetest.Actor(t, b.pool)}); err != nil {
			t.Fatal(err)
		}
		s := quoted(tenant, "rq", tc.limit)
		resp, err := n.client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: s, ReserveQuote: true})
		if !tc.starts {
			st := status.Convert(err)
			var subject string
			var q *fanoutv1.Quote
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.QuotaFailure:
					subject = d.GetViolations()[0].GetSubject()
				case *fanoutv1.Quote:
					q = d
				}
			}
			want := fmt.Sprintf("%d tokens available do not cover the quote's %d", need-1, need)
			if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), want) ||
				subject != "tenant:"+tenant+"/budget" || q.GetTenantCovers() || q.GetTenantAvailableTokens() != need-1 {
				t.Errorf("%s: %s %q (quota subject %q, quote %v); want RESOURCE_EXHAUSTED with %q, the tenant's budget "+
					"and the quote", tc.name, st.Code(), st.Message(), subject, q, want)
			}
			var runs int
			if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM run WHERE tenant_id = $1`, tenant).Scan(&runs); err != nil {
				t.Fatal(err)
			}
			if runs != 0 {
				t.Errorf("%s: %d runs after the refusal; want none", tc.name, runs)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v; want the run started", tc.name, err)
		}
		if q := resp.GetQuote(); resp.GetRunId() == "" || !q.GetTenantCovers() || q.GetTenantAvailableTokens() != need || q.GetHeld() {
			t.Errorf("%s: run %q, quote %v; want a run and a quote covered by %d tokens, not held", tc.name,
				resp.GetRunId(), q, need)
		}
		watchAll(t, tenantClient{n.client, tenant}, resp.GetRunId())
		// The tenant has one token less than a quote now needs (the run
		// left a prior), above its min_reservation: admission would start
		// a new run, the quote refuse it, and the retry is answered with
		// the run.
		spent := need - b.tenantSettled(t, tenant)
		requote, err := n.client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: quoted(tenant, "probe", tc.limit), DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.ledger.SetTenantBudget(t.Context(), budget.TenantBudget{TenantID: tenant,
			Limit: spent + min(requote.GetQuote().GetForecastTokens(), tc.limit) - 1, Actor: storetest.Actor(t, b.pool)}); err != nil {
			t.Fatal(err)
		}
		again, err := n.client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: s, ReserveQuote: true})
		if err != nil || again.GetRunId() != resp.GetRunId() {
			t.Errorf("%s: retry answered %v, %v; want run %s", tc.name, again, err, resp.GetRunId())
		}
	}
}

// TestQuoteAgainstSpend: docs/budget.md#quotes. The demo's spec, quoted and
// then run, twice for one tenant: the first quote rests on the tasks'
// token_budgets, the second on the prior the first run left. What the
// quote's forecast was against what the run spent is logged (a forecast,
// not a bound). By construction, the tasks of the second run's first wave
// are admitted at the forecasts the quote gave them: both come from the
// same prior before any task of the run has answered.
func TestQuoteAgainstSpend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workers := b.demoWorkers(t)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, workers...)
	for i, basis := range []string{"token_budget", "prior"} {
		s := demoSpec(t, fmt.Sprintf("quote-%d", i), 80_000, fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST)
		resp, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		q := resp.GetQuote()
		if q.GetBasis() != basis {
			t.Errorf("run %d: basis %q; want %q", i, q.GetBasis(), basis)
		}
		evs := runStream(t, n.client, s)
		fin := checkEvents(t, evs)
		var spent int64
		run, err := n.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: evs[0].GetRunId()})
		if err != nil {
			t.Fatal(err)
		}
		spent = run.GetRun().GetBudget().GetSpentTokens()
		succeeded := 0
		for _, o := range fin.GetResult().GetTasks() {
			if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
				succeeded++
			}
		}
		t.Logf("run %d (basis %s): quoted %d tokens (tasks %d, synthesis %d; %d of %d tasks admitted), spent %d: "+
			"error |forecast-spent|/spent = %.1f%%; %d tasks succeeded, %s",
			i, q.GetBasis(), q.GetForecastTokens(), q.GetTasksTokens(), q.GetSynthesisTokens(), q.GetAdmittedTasks(),
			len(q.GetTasks()), spent, 100*math.Abs(float64(q.GetForecastTokens()-spent))/float64(spent), succeeded, fin.GetState())
		if basis != "prior" {
			continue
		}
		// The first wave: the tasks started before any ended.
		lines := map[string]int64{}
		for _, l := range q.GetTasks() {
			lines[l.GetTaskId()] = l.GetForecastTokens()
		}
		first := 0
		for _, ev := range evs {
			if ev.GetTaskFinished() != nil {
				break
			}
			if st := ev.GetTaskStarted(); st != nil {
				first++
				if st.GetForecastTokens() != lines[st.GetTaskId()] {
					t.Errorf("task %s admitted at %d; the quote forecast %d from the same prior",
						st.GetTaskId(), st.GetForecastTokens(), lines[st.GetTaskId()])
				}
			}
		}
		if first == 0 {
			t.Error("no task started before the first ended")
		}
	}
}

// tenantClient calls as tenant.
type tenantClient struct {
	fanoutv1.OrchestratorServiceClient
	tenant string
}

func (c tenantClient) WatchRun(ctx context.Context, req *fanoutv1.WatchRunRequest,
	opts ...grpc.CallOption) (grpc.ServerStreamingClient[fanoutv1.WatchRunResponse], error) {
	return c.OrchestratorServiceClient.WatchRun(withTenant(ctx, c.tenant), req, opts...)
}

// TestQuoteAdmitsInDispatchOrder: docs/budget.md#quotes. The admitted tasks
// are those, in dispatch order, whose forecasts fit together in what the
// tasks may claim, up to the first that does not: a small task after it
// waits for it, as the driver's do, though it would fit alone.
func TestQuoteAdmitsInDispatchOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "o1", orchestrator.Config{})
	s := spec("order", 4, 12_000)
	for i, tb := range []int64{5_000, 5_000, 5_000, 1_000} {
		s.Tasks[i].TokenBudget = tb
	}
	resp, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if q := resp.GetQuote(); q.GetAdmittedTasks() != 2 || q.GetForecastTokens() != 16_000 {
		t.Errorf("quote %v; want 2 tasks admitted of a 16,000 forecast: the third does not fit and the fourth waits for it", q)
	}
}
