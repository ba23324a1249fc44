package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestPriorsStartTheFirstWaveTogether: docs/budget.md#priors. The demo's
// spec at 24,000 tokens: its tasks' token_budgets (9,000) are a generous
// cap, so on a fresh database two start (two caps fit in what the tasks
// may claim) and the others wait for one to answer. Its whole tasks are then kept as tenant t1's prior for the
// run's model, and t1's next run forecasts its first tasks from them: its
// first wave (4, its concurrency) starts together. Tenant t2's first run
// on the same database has no prior of its own and starts two: a prior is
// never another tenant's.
func TestPriorsStartTheFirstWaveTogether(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workers := b.demoWorkers(t)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, workers...)
	run := func(tenant, key string) (started int, basis string) {
		t.Helper()
		s := demoSpec(t, key, 24_000, fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST)
		evs := runStreamAs(t, tenantCtx(t, tenant), n.client, s)
		checkEvents(t, evs)
		started, _ = startedBeforeFirstFinish(evs)
		for _, ev := range evs {
			if st := ev.GetTaskStarted(); st != nil && st.GetForecastTokens() < 9_000 && basis == "" {
				basis = fmt.Sprint(st.GetForecastTokens())
			}
		}
		return started, basis
	}
	if got, _ := run("t1", "prior-1"); got != 2 {
		t.Fatalf("t1's first run started %d tasks before the first ended; want 2: no prior, a 9,000 cap", got)
	}
	if got, forecast := run("t1", "prior-2"); got != 4 || forecast == "" {
		t.Fatalf("t1's second run started %d tasks before the first ended (a first forecast below the cap: %q); "+
			"want its first wave of 4, forecast from t1's first run", got, forecast)
	}
	if got, _ := run("t2", "prior-3"); got != 2 {
		t.Fatalf("t2's first run started %d tasks before the first ended; want 2: t1's prior is not t2's", got)
	}
}

// runStreamAs is runStream with the caller's context (its tenant).
func runStreamAs(t *testing.T, ctx context.Context, c fanoutv1.OrchestratorServiceClient, s *fanoutv1.RunSpec) []*fanoutv1.RunEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	stream, err := c.Run(ctx, &fanoutv1.RunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	var evs []*fanoutv1.RunEvent
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return evs
		}
		if err != nil {
			t.Fatalf("Run: %v (after %d events)", err, len(evs))
		}
		evs = append(evs, msg.GetEvent())
	}
}
