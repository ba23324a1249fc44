package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/store/storetest"
)

// TestRunsNamingReadsTheIndexOfItsModel: the count of the runs sharing a
// limit, which each orchestrator makes every interval, can read the
// partial index run_running_model (migration 0036) rather than every
// running run's spec: its expressions are the index's
// (docs/operations.md#concurrency-from-the-rate-limits).
func TestRunsNamingReadsTheIndexOfItsModel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, storetest.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // a test's connection
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	// An empty table is read whole whatever its indexes: the planner must
	// show that it can use the index, not that it prefers it on no rows.
	if _, err := tx.Exec(ctx, `SET LOCAL search_path = fanout; SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+runsNamingSQL, "openai", "gpt-a")
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Both the provider and the model are the index's conditions: no row
	// of another model is read and filtered out.
	if p := strings.Join(plan, "\n"); !strings.Contains(p, "run_running_model") ||
		strings.Count(p, "COALESCE") != 2 || strings.Contains(p, "Filter:") {
		t.Errorf("the count of the runs naming a model does not find them by run_running_model alone:\n%s", p)
	}
}
