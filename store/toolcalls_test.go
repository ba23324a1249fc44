package store_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// nodeToolCalls returns the tool call log as a node uses it: on a pool of
// the node role.
func nodeToolCalls(t *testing.T, b *testBundle) *store.ToolCalls {
	t.Helper()
	pool, err := store.OpenPool(b.ctx, storetest.NodeURL(t, b.url), store.PoolConfig{MaxConns: 2})
	if err != nil {
		t.Fatalf("open a node's pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return store.NewToolCalls(pool, store.ToolCallsConfig{Logger: slog.New(slog.DiscardHandler)})
}

func digest(args string) string {
	sum := sha256.Sum256([]byte(args))
	return hex.EncodeToString(sum[:])
}

// write is a write of task "t1" of run "r1" of tenant "acme".
func write(key string, attempt int64, iteration, index int, args string) runs.Write {
	return runs.Write{Key: key, TenantID: "acme", RunID: "r1", TaskID: "t1", Attempt: attempt,
		Iteration: iteration, Index: index, Server: "crm", Tool: "crm__create_ticket", ArgsDigest: digest(args)}
}

// tasks are the ledger accounts of the tests' tasks by "tenant/run/task":
// run r1 of tenant acme (tasks t1, t2) and run g1 of tenant globex (task
// t1), each at attempt 1, as the orchestrator opens them before it
// dispatches. A write is issued only by its account's current attempt.
type tasks map[string]budget.AccountID

func openTasks(t *testing.T, b *testBundle) tasks {
	t.Helper()
	ts := tasks{}
	for _, r := range []struct {
		tenant, run string
		tasks       []string
	}{
		{"acme", "r1", []string{"t1", "t2"}}, {"globex", "g1", []string{"t1"}},
	} {
		p := budget.OpenRunParams{RunID: r.run, TenantID: r.tenant, Limit: 1000, MinReservation: 1}
		for _, id := range r.tasks {
			p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: id, Limit: 100})
		}
		ra, err := b.ledger.OpenRun(b.ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		for id, acct := range ra.Tasks {
			ts[r.tenant+"/"+r.run+"/"+id] = acct
			ts.begin(t, b, r.tenant+"/"+r.run+"/"+id)
		}
	}
	return ts
}

// begin begins the next attempt of task key.
func (ts tasks) begin(t *testing.T, b *testBundle, key string) {
	t.Helper()
	parts := strings.SplitN(key, "/", 3)
	if _, err := b.ledger.BeginAttempt(b.ctx, ts[key], parts[1], parts[0]); err != nil {
		t.Fatalf("begin an attempt of %s: %v", key, err)
	}
}

// at is w on its task's account (none, for a task the ledger lacks).
func (ts tasks) at(w runs.Write) runs.Write {
	w.Account = int64(ts[w.TenantID+"/"+w.RunID+"/"+w.TaskID])
	return w
}

func mustIssue(t *testing.T, tc *store.ToolCalls, ts tasks, w runs.Write) {
	t.Helper()
	if _, err := tc.IssueWrite(t.Context(), ts.at(w), ""); err != nil {
		t.Fatalf("issue %s: %v", w.Key, err)
	}
}

func mustResolve(t *testing.T, tc *store.ToolCalls, key string, state runs.WriteState, result, errText string) {
	t.Helper()
	if err := tc.ResolveWrite(t.Context(), key, "", state, result, errText); err != nil {
		t.Fatalf("resolve %s as %s: %v", key, state, err)
	}
}

// TestToolCallsIssueResolveReplay: a write is issued once per key (a
// retried issue is a no-op, another call under the key a conflict, a
// resolved one is never issued again), resolved once (the same state again
// is a no-op, another ErrWriteResolved), and a task's writes of every
// attempt come back oldest first, with the database's times.
func TestToolCallsIssueResolveReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tc := nodeToolCalls(t, b)
	ts := openTasks(t, b)
	w1 := write("r1/t1/a1/i0/c0", 1, 0, 0, `{"title":"a"}`)
	mustIssue(t, tc, ts, w1)
	mustIssue(t, tc, ts, w1) // a retry after a lost reply
	for _, c := range []struct {
		what string
		w    runs.Write
	}{
		{"other arguments", write(w1.Key, 1, 0, 0, `{"title":"b"}`)},
		{"another attempt", write(w1.Key, 2, 0, 0, `{"title":"a"}`)},
		{"another place", write(w1.Key, 1, 1, 0, `{"title":"a"}`)},
		{"another tool", func() runs.Write { w := w1; w.Tool = "crm__delete_ticket"; return w }()},
		{"another task", func() runs.Write { w := w1; w.TaskID = "t2"; return w }()},
		{"another tenant", func() runs.Write { w := w1; w.TenantID = "globex"; return w }()},
	} {
		_, err := tc.IssueWrite(b.ctx, ts.at(c.w), "")
		if c.what == "another attempt" && errors.Is(err, runs.ErrAttemptSuperseded) {
			continue // attempt 2 has not begun: refused by the fence, before the key is looked at
		}
		if !errors.Is(err, store.ErrWriteConflict) {
			t.Errorf("issue key %s again with %s: %v, want ErrWriteConflict", w1.Key, c.what, err)
		}
	}

	before := time.Now()
	mustResolve(t, tc, w1.Key, runs.WriteDone, "ticket 7 created", "")
	mustResolve(t, tc, w1.Key, runs.WriteDone, "ticket 7 created", "") // a retry
	if err := tc.ResolveWrite(b.ctx, w1.Key, "", runs.WriteFailed, "", "boom"); !errors.Is(err, store.ErrWriteResolved) {
		t.Errorf("resolve a done write as failed: %v, want ErrWriteResolved", err)
	}
	if err := tc.ResolveWrite(b.ctx, w1.Key, "", runs.WriteUnknown, "", "cut off"); !errors.Is(err, store.ErrWriteResolved) {
		t.Errorf("resolve a done write as unknown: %v, want ErrWriteResolved", err)
	}
	if _, err := tc.IssueWrite(b.ctx, ts.at(w1), ""); !errors.Is(err, store.ErrWriteResolved) {
		t.Errorf("issue a resolved write again: %v, want ErrWriteResolved (it must not be sent again)", err)
	}
	if err := tc.ResolveWrite(b.ctx, "never-issued", "", runs.WriteDone, "", ""); !errors.Is(err, store.ErrWriteNotFound) {
		t.Errorf("resolve a key never issued: %v, want ErrWriteNotFound", err)
	}

	w2 := write("r1/t1/a1/i1/c0", 1, 1, 0, `{"title":"c"}`)
	mustIssue(t, tc, ts, w2)
	mustResolve(t, tc, w2.Key, runs.WriteUnknown, "", "connection lost after the call was sent")
	ts.begin(t, b, "acme/r1/t1")
	w3 := write("r1/t1/a2/i0/c0", 2, 0, 0, `{"title":"d"}`)
	mustIssue(t, tc, ts, w3)
	// Attempt 1 was superseded: a write it would make now is refused, not recorded.
	if _, err := tc.IssueWrite(b.ctx, ts.at(write("r1/t1/a1/i2/c0", 1, 2, 0, `{"title":"late"}`)), ""); !errors.Is(err, runs.ErrAttemptSuperseded) {
		t.Errorf("issue a write of the superseded attempt 1: %v, want ErrAttemptSuperseded", err)
	}
	mustIssue(t, tc, ts, func() runs.Write { w := write("r1/t2/a1/i0/c0", 1, 0, 0, `{}`); w.TaskID = "t2"; return w }())
	mustIssue(t, tc, ts, func() runs.Write {
		w := write("globex/g1/t1", 1, 0, 0, `{}`)
		w.TenantID, w.RunID = "globex", "g1"
		return w
	}())

	got, err := tc.Writes(b.ctx, "acme", "r1", "t1", "")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, w := range got {
		keys = append(keys, fmt.Sprintf("%s %s", w.Key, w.State))
	}
	want := []string{"r1/t1/a1/i0/c0 done", "r1/t1/a1/i1/c0 unknown", "r1/t1/a2/i0/c0 issued"}
	if strings.Join(keys, "; ") != strings.Join(want, "; ") {
		t.Fatalf("writes of acme/r1/t1:\n  %v\nwant\n  %v", keys, want)
	}
	done := got[0]
	if done.Result != "ticket 7 created" || done.Error != "" || done.ArgsDigest != w1.ArgsDigest || done.Server != "crm" ||
		done.Tool != "crm__create_ticket" || done.Attempt != 1 || done.Iteration != 0 || done.Index != 0 {
		t.Errorf("done write read back as %+v", done)
	}
	if done.CreatedAt.IsZero() || done.ResolvedAt.Before(done.CreatedAt) || done.ResolvedAt.Before(before.Add(-time.Minute)) {
		t.Errorf("done write: created %s, resolved %s; want both set, resolved after created", done.CreatedAt, done.ResolvedAt)
	}
	if got[1].Error != "connection lost after the call was sent" {
		t.Errorf("unknown write's error %q", got[1].Error)
	}
	if issued := got[2]; !issued.ResolvedAt.IsZero() || issued.State != runs.WriteIssued {
		t.Errorf("issued write: %+v, want no resolved time", issued)
	}
	if other, err := tc.Writes(b.ctx, "globex", "r1", "t2", ""); err != nil || len(other) != 0 {
		t.Errorf("writes of another tenant's task: %v, %v; want none", other, err)
	}
}

// TestToolCallsStoreAnyText: a result or error that is not valid UTF-8,
// holds NUL bytes or is over MaxWriteTextBytes is stored (marked and cut),
// not refused.
func TestToolCallsStoreAnyText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tc := nodeToolCalls(t, b)
	ts := openTasks(t, b)
	w := write("text", 1, 0, 0, `{}`)
	mustIssue(t, tc, ts, w)
	long := strings.Repeat("é", store.MaxWriteTextBytes) // 2 bytes each
	mustResolve(t, tc, w.Key, runs.WriteFailed, long, "bad \xff byte and a \x00 NUL")
	got, err := tc.Writes(b.ctx, "acme", "r1", "t1", "")
	if err != nil || len(got) != 1 {
		t.Fatalf("writes: %v, %v", got, err)
	}
	if r := got[0].Result; len(r) > store.MaxWriteTextBytes || !utf8.ValidString(r) || !strings.HasSuffix(r, "[truncated]") {
		t.Errorf("long result stored as %d bytes (valid UTF-8 %v, ends %q); want at most %d, marked",
			len(r), utf8.ValidString(r), r[max(0, len(r)-20):], store.MaxWriteTextBytes)
	}
	if e := got[0].Error; e != "bad \uFFFD byte and a \uFFFD NUL" {
		t.Errorf("error stored as %q", e)
	}
}

// TestToolCallsBadInput: a malformed write is refused naming the field and
// the bound.
func TestToolCallsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tc := nodeToolCalls(t, b)
	ts := openTasks(t, b)
	ok := write("k", 1, 0, 0, `{}`)
	with := func(f func(*runs.Write)) runs.Write { w := ok; f(&w); return w }
	for _, c := range []struct {
		w   runs.Write
		msg string
	}{
		{with(func(w *runs.Write) { w.Key = "" }), "Key is empty"},
		{with(func(w *runs.Write) { w.Key = strings.Repeat("k", 257) }), "Key is 257 bytes, more than 256"},
		{with(func(w *runs.Write) { w.TenantID = "" }), "TenantID is empty"},
		{with(func(w *runs.Write) { w.RunID = "" }), "RunID is empty"},
		{with(func(w *runs.Write) { w.TaskID = "" }), "TaskID is empty"},
		{with(func(w *runs.Write) { w.Tool = "" }), "Tool is empty"},
		{with(func(w *runs.Write) { w.Attempt = 0 }), "Attempt is 0: must be at least 1"},
		{with(func(w *runs.Write) { w.Iteration = -1 }), "Iteration is -1"},
		{with(func(w *runs.Write) { w.Index = -1 }), "Index is -1"},
		{with(func(w *runs.Write) { w.ArgsDigest = "ABC" }), `ArgsDigest "ABC" is not a hex SHA-256`},
	} {
		if _, err := tc.IssueWrite(b.ctx, ts.at(c.w), ""); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("IssueWrite: %v; want an error saying %q", err, c.msg)
		}
	}
	if err := tc.ResolveWrite(b.ctx, "k", "", runs.WriteIssued, "", ""); err == nil || !strings.Contains(err.Error(), `state "issued": must be done, failed, unknown or not_sent`) {
		t.Errorf("resolve as issued: %v", err)
	}
	if _, err := tc.Writes(b.ctx, "", "r1", "t1", ""); err == nil || !strings.Contains(err.Error(), "tenant id is empty") {
		t.Errorf("Writes without a tenant: %v", err)
	}
}

// TestToolCallHistoryIsImmutable: the database itself keeps a write to one
// resolution. As the node role, a second resolution, any change of the
// call's identity, an insert that sets a state, and deletes are refused;
// as the owner, the trigger alone refuses the same rewrites.
func TestToolCallHistoryIsImmutable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tc := nodeToolCalls(t, b)
	ts := openTasks(t, b)
	mustIssue(t, tc, ts, write("resolved", 1, 0, 0, `{}`))
	mustResolve(t, tc, "resolved", runs.WriteDone, "ok", "")
	mustIssue(t, tc, ts, write("issued", 1, 0, 1, `{}`))
	node := nodeConn(t, b)
	for _, c := range []struct {
		stmt, code string
	}{
		// The privileges: a node resolves a call through tool_call_resolve
		// only (migration 0024), and sets nothing else.
		{"UPDATE tool_call SET state = 'failed', error = 'rewritten' WHERE key = 'resolved'", "42501"},
		{"UPDATE tool_call SET result = 'early' WHERE key = 'issued'", "42501"},
		{"UPDATE tool_call SET args_digest = repeat('0', 64) WHERE key = 'issued'", "42501"},
		{"UPDATE tool_call SET tool = 'other', state = 'done' WHERE key = 'issued'", "42501"},
		{"UPDATE tool_call SET resolved_at = now() - interval '1 day'", "42501"},
		{"INSERT INTO tool_call (key, tenant_id, run_id, task_id, attempt, iteration, call_index, tool, args_digest, state) " +
			"VALUES ('forged', 'acme', 'r1', 't1', 1, 0, 0, 'x', repeat('0', 64), 'done')", "42501"},
		{"DELETE FROM tool_call WHERE key = 'resolved'", "42501"},
		{"TRUNCATE tool_call", "42501"},
	} {
		if _, err := node.Exec(b.ctx, c.stmt); sqlState(err) != c.code {
			t.Errorf("node role: %s: %v (SQLSTATE %q), want %s", c.stmt, err, sqlState(err), c.code)
		}
	}
	// The owner has every privilege; the trigger still holds: one resolution.
	for _, stmt := range []string{
		"UPDATE tool_call SET state = 'failed' WHERE key = 'resolved'",
		"UPDATE tool_call SET state = 'failed', error = 'rewritten' WHERE key = 'resolved'",
		"UPDATE tool_call SET state = 'unknown' WHERE key = 'resolved'",
		"UPDATE tool_call SET result = 'rewritten' WHERE key = 'resolved'",
		"UPDATE tool_call SET result = 'early' WHERE key = 'issued'",
		"UPDATE tool_call SET tool = 'other', state = 'done' WHERE key = 'issued'",
		"UPDATE tool_call SET created_at = now() - interval '1 day', state = 'done' WHERE key = 'issued'",
	} {
		if _, err := b.pool.Exec(b.ctx, stmt); sqlState(err) != "23000" {
			t.Errorf("owner: %s: %v (SQLSTATE %q), want integrity_constraint_violation from the trigger", stmt, err, sqlState(err))
		}
	}
	got, err := tc.Writes(b.ctx, "acme", "r1", "t1", "")
	if err != nil || len(got) != 2 || got[0].State != runs.WriteDone || got[0].Result != "ok" || got[1].State != runs.WriteIssued {
		t.Errorf("writes after the attempts to rewrite them: %+v, %v; want resolved done \"ok\", then issued", got, err)
	}
	// The one resolution the node may make, by hand: resolved_at is the database's.
	if _, err := node.Exec(b.ctx, "SELECT tool_call_resolve('issued', 'failed', '', 'no')"); err != nil {
		t.Errorf("node role resolving an issued write: %v", err)
	}
	var stamped bool
	if err := b.pool.QueryRow(b.ctx, "SELECT resolved_at IS NOT NULL FROM tool_call WHERE key = 'issued'").Scan(&stamped); err != nil || !stamped {
		t.Errorf("resolved_at stamped: %v, %v", stamped, err)
	}
}

// TestToolCallsView: the auditor reads every write through tool_calls
// (never the table, nor any result text), and the query of
// docs/auditing.md for writes that may have happened lists exactly the
// tenant's unknown writes.
func TestToolCallsView(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tc := nodeToolCalls(t, b)
	ts := openTasks(t, b)
	mustIssue(t, tc, ts, write("done", 1, 0, 0, `{"a":1}`))
	mustResolve(t, tc, "done", runs.WriteDone, "secret customer record", "")
	mustIssue(t, tc, ts, write("cut", 1, 1, 0, `{"a":2}`))
	mustResolve(t, tc, "cut", runs.WriteUnknown, "", "timed out after the call was sent")
	ts.begin(t, b, "acme/r1/t1")
	mustIssue(t, tc, ts, write("open", 2, 0, 0, `{"a":3}`))
	other := write("globex-cut", 1, 0, 0, `{}`)
	other.TenantID, other.RunID = "globex", "g1"
	mustIssue(t, tc, ts, other)
	mustResolve(t, tc, other.Key, runs.WriteUnknown, "", "lost")

	asAuditor := func(sql string) ([]map[string]any, error) {
		var out []map[string]any
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, "SET LOCAL ROLE fanout_auditor"); err != nil {
				return err
			}
			rows, err := tx.Query(b.ctx, sql)
			if err != nil {
				return err
			}
			out, err = pgx.CollectRows(rows, pgx.RowToMap)
			return err
		})
		return out, err
	}
	all, err := asAuditor(`SELECT * FROM tool_calls WHERE tenant_id = 'acme' ORDER BY created_at, key`)
	if err != nil {
		t.Fatalf("as fanout_auditor: %v", err)
	}
	if len(all) != 3 {
		t.Fatalf("tool_calls lists %d writes of acme, want 3: %v", len(all), all)
	}
	for _, r := range all {
		for col, v := range r {
			if s, ok := v.(string); ok && strings.Contains(s, "secret") {
				t.Errorf("tool_calls shows result text in %s: %q", col, s)
			}
		}
		if r["key"] == "done" && (r["state"] != "done" || r["result_bytes"] != int32(len("secret customer record")) || r["error"] != nil) {
			t.Errorf("done write as the auditor sees it: %v", r)
		}
	}
	if _, err := asAuditor(`SELECT result FROM tool_call`); sqlState(err) != "42501" {
		t.Errorf("auditor reading the table: %v, want insufficient_privilege", err)
	}

	query := auditingQuery(t, "Tool writes that may have happened")
	rows, err := asAuditor(query)
	if err != nil {
		t.Fatalf("docs/auditing.md's query as fanout_auditor: %v", err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, fmt.Sprintf("%v %v", r["key"], r["error"]))
	}
	if want := "cut timed out after the call was sent"; strings.Join(got, "; ") != want {
		t.Errorf("docs/auditing.md's unknown-writes query lists %v, want [%s]", got, want)
	}

	// Its second query: writes still issued after their task ended.
	rs := store.NewRuns(b.pool)
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r1", "acme", "k1", "t1"), "n"); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.StartTask(b.ctx, "r1", "n", &fanoutv1.TaskStarted{TaskId: "t1", Worker: "w"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.FinishTask(b.ctx, "r1", "n", &fanoutv1.TaskOutcome{TaskId: "t1", Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED}); err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(auditingSection(t, "Tool writes that may have happened"), "```")
	_, second, _ := strings.Cut(section, "```sql\n")
	second, _, _ = strings.Cut(second, "```")
	rows, err = asAuditor(second)
	if err != nil {
		t.Fatalf("docs/auditing.md's second query as fanout_auditor: %v\n%s", err, second)
	}
	if len(rows) != 1 || rows[0]["key"] != "open" {
		t.Errorf("docs/auditing.md's issued-after-the-task-ended query lists %v, want the write \"open\"", rows)
	}
}

// auditingSection returns the text of section heading of docs/auditing.md.
func auditingSection(t *testing.T, heading string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/auditing.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("docs/auditing.md has no section %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return section
}
