package store_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
)

// auditingQuery returns the first SQL block under heading in docs/auditing.md.
func auditingQuery(t *testing.T, heading string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/auditing.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("docs/auditing.md has no section %q", heading)
	}
	_, block, ok := strings.Cut(section, "```sql\n")
	if !ok {
		t.Fatalf("section %q of docs/auditing.md has no SQL", heading)
	}
	query, _, _ := strings.Cut(block, "```")
	return query
}

// TestTaskOutcomeView: the auditor reads how each task ended through
// task_outcome (status, error, tokens, worker, times), and the query of
// docs/auditing.md for "which tasks failed last week, why, and what they
// cost" lists exactly the tenant's tasks that failed in the last 7 days:
// not those that succeeded, are still running, ended earlier, or belong to
// another tenant.
func TestTaskOutcomeView(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := store.NewRuns(b.pool)
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r1", "acme", "k1", "ok", "boom", "slow", "old", "running"), "n"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r2", "globex", "k2", "boom"), "n"); err != nil {
		t.Fatal(err)
	}
	finish := func(run, task string, st fanoutv1.TaskStatus, tokens int64, errText string) {
		t.Helper()
		if _, err := rs.StartTask(b.ctx, run, "n", &fanoutv1.TaskStarted{TaskId: task, Worker: "worker-" + task}); err != nil {
			t.Fatal(err)
		}
		if _, err := rs.FinishTask(b.ctx, run, "n", &fanoutv1.TaskOutcome{TaskId: task, Status: st, TokensSpent: tokens, Worker: "worker-" + task,
			Summary: &fanoutv1.FactSummary{Status: st, Error: errText}}); err != nil {
			t.Fatal(err)
		}
	}
	finish("r1", "ok", fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, 10, "")
	finish("r1", "boom", fanoutv1.TaskStatus_TASK_STATUS_FAILED, 70, "the tool said no")
	finish("r1", "slow", fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT, 30, "deadline exceeded")
	finish("r1", "old", fanoutv1.TaskStatus_TASK_STATUS_FAILED, 99, "long ago")
	finish("r2", "boom", fanoutv1.TaskStatus_TASK_STATUS_FAILED, 50, "other tenant")
	if _, err := rs.StartTask(b.ctx, "r1", "n", &fanoutv1.TaskStarted{TaskId: "running", Worker: "worker-running"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE task SET started_at = started_at - interval '8 days',
		finished_at = finished_at - interval '8 days' WHERE task_id = 'old'`); err != nil {
		t.Fatal(err)
	}

	type row struct {
		RunID       string     `db:"run_id"`
		TaskID      string     `db:"task_id"`
		Status      string     `db:"status"`
		Error       *string    `db:"error"`
		Worker      *string    `db:"worker"`
		TokensSpent int64      `db:"tokens_spent"`
		StartedAt   *time.Time `db:"started_at"`
		FinishedAt  *time.Time `db:"finished_at"`
	}
	asAuditor := func(sql string) []row {
		t.Helper()
		var out []row
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, "SET LOCAL ROLE fanout_auditor"); err != nil {
				return err
			}
			rows, err := tx.Query(b.ctx, sql)
			if err != nil {
				return err
			}
			out, err = pgx.CollectRows(rows, pgx.RowToStructByName[row])
			return err
		})
		if err != nil {
			t.Fatalf("as fanout_auditor: %s: %v", sql, err)
		}
		return out
	}

	all := asAuditor(`SELECT run_id, task_id, status, error, worker, tokens_spent, started_at, finished_at
		FROM task_outcome WHERE tenant_id = 'acme' ORDER BY dispatch_index`)
	if len(all) != 5 {
		t.Fatalf("task_outcome lists %d tasks of acme, want 5: %+v", len(all), all)
	}
	boom := all[1]
	if boom.TaskID != "boom" || boom.Status != "FAILED" || boom.Error == nil || *boom.Error != "the tool said no" ||
		boom.TokensSpent != 70 || boom.Worker == nil || *boom.Worker != "worker-boom" ||
		boom.StartedAt == nil || boom.FinishedAt == nil || boom.FinishedAt.Before(*boom.StartedAt) {
		t.Errorf("failed task: %+v", boom)
	}
	if ok := all[0]; ok.Status != "SUCCEEDED" || ok.Error != nil || ok.TokensSpent != 10 {
		t.Errorf("succeeded task: %+v, want no error", ok)
	}
	if running := all[4]; running.Status != "RUNNING" || running.FinishedAt != nil || running.StartedAt == nil {
		t.Errorf("running task: %+v", running)
	}

	query := auditingQuery(t, "Which tasks failed last week, why, and what they cost")
	failed := asAuditor(query)
	var got []string
	for _, r := range failed {
		got = append(got, r.RunID+"/"+r.TaskID+" "+r.Status+" "+*r.Error)
	}
	want := []string{"r1/boom FAILED the tool said no", "r1/slow TIMED_OUT deadline exceeded"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("docs/auditing.md's failed-tasks query lists\n  %v\nwant\n  %v", got, want)
	}
}
