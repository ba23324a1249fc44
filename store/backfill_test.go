package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// oldRows is what a database of migration 5 held: runs, tasks and events as
// proto bytes. Enough rows that each table takes several backfill batches
// (500 rows), with keys that span runs.
type oldRows struct {
	specs    map[string]*fanoutv1.RunSpec      // run -> spec
	results  map[string]*fanoutv1.JoinedResult // run -> result (ended runs only)
	outcomes map[[2]string]*fanoutv1.TaskOutcome
	events   map[string][]*fanoutv1.RunEvent // run -> events, sequence i+1
}

const (
	oldRunCount   = 510 // > one batch
	oldTasksOfRun = 520 // of run old-0000, > one batch
)

func oldRunID(i int) string { return fmt.Sprintf("old-%04d", i) }

// writeOldRows writes oldRows with SQL, as a binary of migration 5 did.
func writeOldRows(t *testing.T, ctx context.Context, pool *pgxpool.Pool) oldRows {
	t.Helper()
	o := oldRows{specs: map[string]*fanoutv1.RunSpec{}, results: map[string]*fanoutv1.JoinedResult{},
		outcomes: map[[2]string]*fanoutv1.TaskOutcome{}, events: map[string][]*fanoutv1.RunEvent{}}
	enc := func(m proto.Message) []byte {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if b == nil {
			b = []byte{}
		}
		return b
	}
	var ids, states []string
	var specs, results [][]byte
	for i := range oldRunCount {
		id := oldRunID(i)
		spec := &fanoutv1.RunSpec{IdempotencyKey: "k" + id, TenantId: "acme", Goal: "goal of " + id,
			Tasks: []*fanoutv1.TaskSpec{{Id: "a", Instruction: "look it up", TokenBudget: 1000,
				Timeout: durationpb.New(90e9), DependsOn: []string{"b"}}},
			Model:  &fanoutv1.ModelSettings{Provider: "sim", Temperature: 0.25, Seed: 1 << 40},
			Labels: map[string]string{"team": "search"}}
		if i == 2 {
			spec = &fanoutv1.RunSpec{} // encodes as empty bytes, which are not NULL
		}
		o.specs[id] = spec
		state := "RUNNING"
		var result []byte
		if i%2 == 1 {
			state = "SUCCEEDED"
			o.results[id] = &fanoutv1.JoinedResult{TotalTokens: int64(i), Synthesis: "joined",
				Facts: []*fanoutv1.Fact{{Text: "fact of " + id, Sources: []string{"a"}}}}
			result = enc(o.results[id])
		}
		ids, states, specs, results = append(ids, id), append(states, state), append(specs, enc(spec)), append(results, result)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO run (run_id, tenant_id, idempotency_key, spec, state, result, finished_at)
		SELECT id, 'acme', 'k' || id, spec, state, result, CASE WHEN state = 'RUNNING' THEN NULL ELSE now() END
		  FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[]) AS t(id, state, spec, result)`,
		ids, states, specs, results); err != nil {
		t.Fatalf("write old runs: %v", err)
	}

	var runIDs, taskIDs, statuses []string
	var outcomes [][]byte
	for i := range oldTasksOfRun {
		run, task := oldRunID(0), fmt.Sprintf("t%04d", i)
		status, out := "PENDING", []byte(nil)
		if i%3 != 0 {
			status = "FAILED"
			oc := &fanoutv1.TaskOutcome{TaskId: task, DispatchIndex: int32(i), Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED,
				TokensSpent: int64(i), Worker: "w1",
				Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED, Error: "error of " + task, Tried: []string{"x"}}}
			o.outcomes[[2]string{run, task}] = oc
			out = enc(oc)
		}
		runIDs, taskIDs, statuses, outcomes = append(runIDs, run), append(taskIDs, task), append(statuses, status), append(outcomes, out)
	}
	// A task of another run, so that task keys span runs.
	o.outcomes[[2]string{oldRunID(1), "a"}] = &fanoutv1.TaskOutcome{TaskId: "a", Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, TokensSpent: 3}
	runIDs, taskIDs, statuses = append(runIDs, oldRunID(1)), append(taskIDs, "a"), append(statuses, "SUCCEEDED")
	outcomes = append(outcomes, enc(o.outcomes[[2]string{oldRunID(1), "a"}]))
	if _, err := pool.Exec(ctx, `INSERT INTO task (run_id, task_id, tenant_id, dispatch_index, status, outcome, tokens_spent)
		SELECT run, task, 'acme', n - 1, status, outcome, 0
		  FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[]) WITH ORDINALITY AS t(run, task, status, outcome, n)`,
		runIDs, taskIDs, statuses, outcomes); err != nil {
		t.Fatalf("write old tasks: %v", err)
	}

	for run, n := range map[string]int{oldRunID(0): 700, oldRunID(1): 600} {
		var bodies [][]byte
		for i := range n {
			ev := &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{
				TaskId: fmt.Sprintf("t%04d", i), DispatchIndex: int32(i)}}}
			if i == n-1 {
				ev = &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunFinished{RunFinished: &fanoutv1.RunFinished{
					State: fanoutv1.RunState_RUN_STATE_SUCCEEDED, CancelCause: "done"}}}
			}
			o.events[run] = append(o.events[run], ev)
			bodies = append(bodies, enc(ev))
		}
		if _, err := pool.Exec(ctx, `WITH seq AS (UPDATE run SET last_sequence = cardinality($2::bytea[]) WHERE run_id = $1)
			INSERT INTO run_event (run_id, sequence, tenant_id, event)
			SELECT $1, n, 'acme', body FROM unnest($2::bytea[]) WITH ORDINALITY AS t(body, n)`, run, bodies); err != nil {
			t.Fatalf("write old events: %v", err)
		}
	}
	return o
}

// migrateAndOpen migrates the database to version and opens a new pool
// (pgx caches statements, which a changed schema invalidates).
func migrateAndOpen(t *testing.T, ctx context.Context, url string, version int) *pgxpool.Pool {
	t.Helper()
	if _, err := store.MigrateTo(ctx, url, version); err != nil {
		t.Fatalf("migrate to %d: %v", version, err)
	}
	pool, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// checkJSONB asserts that every jsonb column holds exactly the proto o had.
func (o oldRows) checkJSONB(t *testing.T, ctx context.Context, pool *pgxpool.Pool, specCol, resultCol, outcomeCol, eventCol string) {
	t.Helper()
	read := func(text *string, m proto.Message, what string) {
		t.Helper()
		if text == nil {
			t.Errorf("%s: NULL, want %v", what, m)
			return
		}
		got := m.ProtoReflect().New().Interface()
		if err := (protojson.UnmarshalOptions{}).Unmarshal([]byte(*text), got); err != nil {
			t.Errorf("%s: %s is not protojson of %T: %v", what, *text, m, err)
		} else if !proto.Equal(got, m) {
			t.Errorf("%s: jsonb %s, want %v", what, *text, m)
		}
	}
	n := 0
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT run_id, %s::text, %s::text FROM run`, specCol, resultCol))
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var spec, result *string
	if _, err := pgx.ForEachRow(rows, []any{&id, &spec, &result}, func() error {
		n++
		read(spec, o.specs[id], "spec of "+id)
		if want, ok := o.results[id]; ok {
			read(result, want, "result of "+id)
		} else if result != nil {
			t.Errorf("result of running run %s: %s, want NULL", id, *result)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != len(o.specs) {
		t.Errorf("%d runs, want %d", n, len(o.specs))
	}

	n = 0
	rows, err = pool.Query(ctx, fmt.Sprintf(`SELECT run_id, task_id, %s::text FROM task`, outcomeCol))
	if err != nil {
		t.Fatal(err)
	}
	var task string
	var outcome *string
	if _, err := pgx.ForEachRow(rows, []any{&id, &task, &outcome}, func() error {
		if want, ok := o.outcomes[[2]string{id, task}]; ok {
			n++
			read(outcome, want, "outcome of "+id+"/"+task)
		} else if outcome != nil {
			t.Errorf("outcome of pending task %s/%s: %s, want NULL", id, task, *outcome)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != len(o.outcomes) {
		t.Errorf("%d outcomes, want %d", n, len(o.outcomes))
	}

	n = 0
	rows, err = pool.Query(ctx, fmt.Sprintf(`SELECT run_id, sequence, %s::text FROM run_event`, eventCol))
	if err != nil {
		t.Fatal(err)
	}
	var seq int64
	var event *string
	if _, err := pgx.ForEachRow(rows, []any{&id, &seq, &event}, func() error {
		n++
		read(event, o.events[id][seq-1], fmt.Sprintf("event %d of %s", seq, id))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, evs := range o.events {
		want += len(evs)
	}
	if n != want {
		t.Errorf("%d events, want %d", n, want)
	}
}

// checkProto asserts that every bytea column holds exactly the proto o had.
func (o oldRows) checkProto(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	read := func(b []byte, m proto.Message, what string) {
		t.Helper()
		got := m.ProtoReflect().New().Interface()
		if b == nil {
			t.Errorf("%s: NULL, want %v", what, m)
		} else if err := proto.Unmarshal(b, got); err != nil || !proto.Equal(got, m) {
			t.Errorf("%s: decodes to %v (%v), want %v", what, got, err, m)
		}
	}
	var id, task string
	var seq int64
	var spec, result, outcome, event []byte
	rows, err := pool.Query(ctx, `SELECT run_id, spec, result FROM run`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&id, &spec, &result}, func() error {
		read(spec, o.specs[id], "spec of "+id)
		if want, ok := o.results[id]; ok {
			read(result, want, "result of "+id)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT run_id, task_id, outcome FROM task WHERE outcome IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	n, err := pgx.ForEachRow(rows, []any{&id, &task, &outcome}, func() error {
		read(outcome, o.outcomes[[2]string{id, task}], "outcome of "+id+"/"+task)
		return nil
	})
	if err != nil || int(n.RowsAffected()) != len(o.outcomes) {
		t.Errorf("%d outcomes (%v), want %d", n.RowsAffected(), err, len(o.outcomes))
	}
	rows, err = pool.Query(ctx, `SELECT run_id, sequence, event FROM run_event`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&id, &seq, &event}, func() error {
		read(event, o.events[id][seq-1], fmt.Sprintf("event %d of %s", seq, id))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// columnTypes returns "table.column type" for the stored messages' columns.
func columnTypes(t *testing.T, ctx context.Context, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(ctx, `SELECT string_agg(table_name || '.' || column_name || ' ' || data_type, ', '
			ORDER BY table_name, column_name)
		  FROM information_schema.columns
		 WHERE table_schema = 'fanout' AND (table_name, column_name) IN
		       (('run', 'spec'), ('run', 'result'), ('task', 'outcome'), ('run_event', 'event'))`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBackfillConvertsOldRows: rows written as proto bytes at version 5 are
// converted by `fanout migrate` (the Go backfill after 0006, in batches) to
// protojson that equals the proto, readable with ->> in SQL and through
// store.Runs; migrating down to 5 turns them, and rows written at the new
// version, back into the same proto bytes; and up again.
func TestBackfillConvertsOldRows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := storetest.NewDB(t)
	old := writeOldRows(t, ctx, migrateAndOpen(t, ctx, url, 5))

	pool := migrateAndOpen(t, ctx, url, -1)
	if got, want := columnTypes(t, ctx, pool), "run.result jsonb, run.spec jsonb, run_event.event jsonb, task.outcome jsonb"; got != want {
		t.Fatalf("columns: %s, want %s", got, want)
	}
	old.checkJSONB(t, ctx, pool, "spec", "result", "outcome", "event")

	// SQL reads them.
	var goal, model, taskErr, queued, state string
	var failed int
	if err := pool.QueryRow(ctx, `SELECT spec->>'goal', spec->'model'->>'provider' FROM run WHERE run_id = $1`, oldRunID(7)).
		Scan(&goal, &model); err != nil || goal != "goal of "+oldRunID(7) || model != "sim" {
		t.Errorf("spec->>'goal' = %q, spec->'model'->>'provider' = %q, %v", goal, model, err)
	}
	if err := pool.QueryRow(ctx, `SELECT outcome->'summary'->>'error' FROM task WHERE run_id = $1 AND task_id = 't0001'`, oldRunID(0)).
		Scan(&taskErr); err != nil || taskErr != "error of t0001" {
		t.Errorf("outcome->'summary'->>'error' = %q, %v", taskErr, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM task WHERE outcome->>'status' = 'TASK_STATUS_FAILED'`).
		Scan(&failed); err != nil || failed != oldTasksOfRun-(oldTasksOfRun+2)/3 {
		t.Errorf("%d failed outcomes, %v; want %d", failed, err, oldTasksOfRun-(oldTasksOfRun+2)/3)
	}
	if err := pool.QueryRow(ctx, `SELECT event->'task_queued'->>'task_id' FROM run_event WHERE run_id = $1 AND sequence = 601`, oldRunID(0)).
		Scan(&queued); err != nil || queued != "t0600" {
		t.Errorf("event->'task_queued'->>'task_id' = %q, %v", queued, err)
	}
	if err := pool.QueryRow(ctx, `SELECT event->'run_finished'->>'state' FROM run_event WHERE run_id = $1 AND sequence = 600`, oldRunID(1)).
		Scan(&state); err != nil || state != "RUN_STATE_SUCCEEDED" {
		t.Errorf("event->'run_finished'->>'state' = %q, %v", state, err)
	}

	// store.Runs reads them, and writes new rows beside them.
	rs := store.NewRuns(pool)
	r, err := rs.GetRun(ctx, "acme", oldRunID(1))
	if err != nil || !proto.Equal(r.GetSpec(), old.specs[oldRunID(1)]) || !proto.Equal(r.GetResult(), old.results[oldRunID(1)]) ||
		r.GetTasks()[0].GetTokensSpent() != 0 {
		t.Errorf("GetRun of a converted run: %v, %v", r, err)
	}
	evs, err := rs.Events(ctx, "acme", oldRunID(1), 598, 10)
	if err != nil || len(evs) != 2 || !proto.Equal(evs[1].GetRunFinished(), old.events[oldRunID(1)][599].GetRunFinished()) {
		t.Errorf("Events of a converted run: %v, %v", evs, err)
	}
	newRun := draftRun("new", "acme", "k-new", "a")
	if _, _, err := rs.CreateRun(ctx, newRun, "n"); err != nil {
		t.Fatal(err)
	}
	newOutcome := &fanoutv1.TaskOutcome{TaskId: "a", Status: fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT, TokensSpent: 5, Worker: "w9",
		Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT, Error: "deadline"}}
	newEvent := &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskStarted{TaskStarted: &fanoutv1.TaskStarted{TaskId: "a", Worker: "w9"}}}
	if _, err := rs.AppendEvent(ctx, "new", newEvent); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.FinishTask(ctx, "new", "n", newOutcome); err != nil { // and its TaskFinished
		t.Fatal(err)
	}
	newEvents, err := rs.Events(ctx, "acme", "new", 0, 10)
	if err != nil || len(newEvents) != 2 || newEvents[1].GetTaskFinished() == nil {
		t.Fatalf("events of the new run: %v, %v; want TaskStarted, TaskFinished", newEvents, err)
	}
	for _, ev := range newEvents {
		ev.RunId, ev.Sequence, ev.Time = "", 0, nil // as stored: the columns hold them
	}
	old.specs["new"] = newRun.GetSpec()
	old.outcomes[[2]string{"new", "a"}] = newOutcome
	old.events["new"] = newEvents
	pool.Close()

	// Down to 5: proto bytes again, for the old rows and the new ones.
	pool = migrateAndOpen(t, ctx, url, 5)
	if got, want := columnTypes(t, ctx, pool), "run.result bytea, run.spec bytea, run_event.event bytea, task.outcome bytea"; got != want {
		t.Fatalf("columns at 5: %s, want %s", got, want)
	}
	old.checkProto(t, ctx, pool)
	pool.Close()

	// And up again.
	pool = migrateAndOpen(t, ctx, url, -1)
	old.checkJSONB(t, ctx, pool, "spec", "result", "outcome", "event")
}

// TestBackfillResumes: the backfill is idempotent and resumable: a migrate
// cut off after 0006 (rows left unconverted, here by hand) converts them on
// the next run before 0007, which refuses to drop anything unconverted; a
// row that cannot be decoded stops the migration at 6 with its key named,
// and once fixed the next migrate finishes.
func TestBackfillResumes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := storetest.NewDB(t)
	old := writeOldRows(t, ctx, migrateAndOpen(t, ctx, url, 5))

	pool := migrateAndOpen(t, ctx, url, 6)
	old.checkJSONB(t, ctx, pool, "spec_json", "result_json", "outcome_json", "event_json")
	// As if the conversion had been cut off: some rows of every table left.
	if _, err := pool.Exec(ctx, `UPDATE run SET spec_json = NULL, result_json = NULL WHERE run_id > 'old-0400';
		UPDATE task SET outcome_json = NULL WHERE task_id > 't0300';
		UPDATE run_event SET event_json = NULL WHERE sequence % 3 = 0`); err != nil {
		t.Fatal(err)
	}

	// 0007 on its own refuses: it would drop data.
	all, err := store.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var contract store.Migration
	for _, m := range all {
		if m.Version == 7 {
			contract = m
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, contract.Up)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "not converted to jsonb") {
		t.Fatalf("0007 over unconverted rows: %v, want refused", err)
	}

	// A row that does not decode stops the migration at 6, named.
	if _, err := pool.Exec(ctx, `UPDATE run_event SET event = '\xff' WHERE run_id = $1 AND sequence = 3`, oldRunID(1)); err != nil {
		t.Fatal(err)
	}
	_, err = store.MigrateTo(ctx, url, -1)
	if err == nil || !strings.Contains(err.Error(), "0006_runs_jsonb") || !strings.Contains(err.Error(), "run_event ["+oldRunID(1)+" 3]") {
		t.Fatalf("migrate over an undecodable event: %v, want the row named", err)
	}
	var version int
	if err := pool.QueryRow(ctx, `SELECT max(version) FROM public.schema_migration`).Scan(&version); err != nil || version != 6 {
		t.Fatalf("after the failed conversion the schema is at %d (%v), want 6", version, err)
	}
	fixed, err := proto.Marshal(old.events[oldRunID(1)][2])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE run_event SET event = $2 WHERE run_id = $1 AND sequence = 3`, oldRunID(1), fixed); err != nil {
		t.Fatal(err)
	}
	pool.Close()

	pool = migrateAndOpen(t, ctx, url, -1)
	old.checkJSONB(t, ctx, pool, "spec", "result", "outcome", "event")
}
