package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestQuoteThenRunTheDemo: docs/budget.md#quotes, through the CLI against
// worker processes with the demo's sim settings. The demo's spec
// (examples/research.json, its limit raised so that every task runs) is
// quoted (`fanout run --quote`: a table, no run), then run with
// --reserve-quote, twice: the first quote rests on the tasks'
// token_budgets, the second on the prior the first run left. Each quote's
// forecast against what its run then spent is logged: the relative error
// the issue asks for (a forecast, not a bound).
func TestQuoteThenRunTheDemo(t *testing.T) {
	t.Parallel()
	sim := []string{"--sim-latency", "150ms"} // the demo's sim otherwise (fanout worker's defaults)
	c := newCluster(t, [][]string{sim, sim, sim})
	raw, err := os.ReadFile("../../examples/research.json")
	if err != nil {
		t.Fatal(err)
	}
	var req fanoutv1.RunRequest
	if err := protojson.Unmarshal(raw, &req); err != nil {
		t.Fatal(err)
	}
	req.Spec.TenantId = "demo"
	req.Spec.Budget.LimitTokens = 80_000
	cli := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		if code := Main(ctx, append(args, "--addr", c.orch.addr), &out, &errOut, func(string) string { return "" }); code != 0 {
			t.Fatalf("fanout %v exited %d: %s", args, code, errOut.String())
		}
		return out.String()
	}
	for i, basis := range []string{"token_budget", "prior"} {
		req.Spec.IdempotencyKey = "demo-quoted-" + basis
		b, err := protojson.Marshal(&req)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "spec.json")
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		table := cli("run", "-f", file, "--quote")
		if !strings.Contains(table, "quote (forecast from "+basis+")") || !strings.Contains(table, "decision-notes") ||
			!strings.Contains(table, "tenant budget: none") {
			t.Errorf("run %d: `fanout run --quote` printed\n%s\nwant a %s quote with a line per task", i, table, basis)
		}
		t.Logf("fanout run --quote:\n%s", table)
		var q fanoutv1.Quote
		if err := protojson.Unmarshal([]byte(cli("run", "-f", file, "--quote", "--json")), &q); err != nil {
			t.Fatalf("`fanout run --quote --json`: %v", err)
		}
		var runs int
		if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM run WHERE idempotency_key = $1`,
			req.Spec.IdempotencyKey).Scan(&runs); err != nil {
			t.Fatal(err)
		}
		if runs != 0 {
			t.Fatalf("run %d: %d runs after two quotes; want none", i, runs)
		}
		lines := strings.Split(strings.TrimSpace(cli("run", "-f", file, "--reserve-quote", "--json")), "\n")
		var last fanoutv1.RunEvent
		if err := protojson.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
			t.Fatalf("last line of `fanout run --reserve-quote --json`: %v", err)
		}
		fin := last.GetRunFinished()
		if fin == nil || fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
			t.Fatalf("run %d ended with %v; want RunFinished SUCCEEDED", i, &last)
		}
		waitClosed(t, c.pool, last.GetRunId())
		spent, _ := checkConserved(t, c.pool, last.GetRunId())
		t.Logf("demo run %d (basis %s): quoted %d tokens (tasks %d, synthesis %d), spent %d: "+
			"relative error |forecast-spent|/spent = %.1f%%", i, q.GetBasis(), q.GetForecastTokens(), q.GetTasksTokens(),
			q.GetSynthesisTokens(), spent, 100*math.Abs(float64(q.GetForecastTokens()-spent))/float64(spent))
	}
}
