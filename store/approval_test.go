package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// approvalFixture is run r1 of tenant acme whose recorded policy says
// writes of crm__create_ticket wait for approval (for the fixture's
// timeout) and crm__note's do not, with task t1 at attempt 2 (its secret
// known), the tool call log as a worker's login and an orchestrator's
// use it, and a live approve key of acme (its actor and secret).
type approvalFixture struct {
	b                        *testBundle
	ts                       tasks
	worker, orch             *store.ToolCalls
	secret                   string
	attempt                  int64
	approver, approverSecret string
}

func newApprovalFixture(t *testing.T, timeout time.Duration) *approvalFixture {
	t.Helper()
	b := setup(t)
	f := &approvalFixture{b: b, ts: openTasks(t, b), orch: nodeToolCalls(t, b)}
	pool, err := store.OpenPool(b.ctx, storetest.WorkerURL(t, b.url), store.PoolConfig{MaxConns: 2})
	if err != nil {
		t.Fatalf("open a worker's pool: %v", err)
	}
	t.Cleanup(pool.Close)
	f.worker = store.NewToolCalls(pool, store.ToolCallsConfig{Logger: slog.New(slog.DiscardHandler)})
	f.next(t)
	f.approver, f.approverSecret = liveKey(t, b, "acme", "approve")
	// What the orchestrator records in OpenRun's transaction.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO fanout.run_tool_policy (tenant_id, run_id, tool, approval, approval_timeout_ms)
		VALUES ('acme', 'r1', 'crm__create_ticket', true, $1), ('acme', 'r1', 'crm__note', false, 0)`, timeout.Milliseconds()); err != nil {
		t.Fatal(err)
	}
	return f
}

// next begins task t1's next attempt (a re-dispatch).
func (f *approvalFixture) next(t *testing.T) {
	t.Helper()
	a, err := f.b.ledger.BeginAttempt(f.b.ctx, f.ts["acme/r1/t1"], "r1", "acme")
	if err != nil {
		t.Fatal(err)
	}
	f.secret, f.attempt = a.Secret, a.N
}

// ask records call index of iteration 1 of crm__create_ticket by the
// current attempt, which must wait for approval.
func (f *approvalFixture) ask(t *testing.T, index int, args string) runs.Write {
	t.Helper()
	w := f.ts.at(write(fmt.Sprintf("r1/t1/a%d/i1/c%d", f.attempt, index), f.attempt, 1, index, args))
	w.Preview = args
	got, err := f.worker.IssueWrite(f.b.ctx, w, f.secret)
	if err != nil {
		t.Fatalf("issue a write that needs approval: %v", err)
	}
	if got.State != runs.WriteAwaitingApproval || !strings.HasPrefix(got.CallID, "tc_") || got.ApprovalDeadline.IsZero() {
		t.Fatalf("issued %+v; want awaiting_approval with a call id and a deadline", got)
	}
	var preview string
	if err := f.b.pool.QueryRow(f.b.ctx, `SELECT preview FROM fanout.tool_calls WHERE call_id = $1`, got.CallID).Scan(&preview); err != nil ||
		preview != args {
		t.Fatalf("the stored preview %q, %v; want %q", preview, err, args)
	}
	got.Account = w.Account
	return got
}

// send sends w as the current attempt would.
func (f *approvalFixture) send(w runs.Write) (bool, runs.WriteState, error) {
	w.Attempt = f.attempt
	return f.worker.SendWrite(f.b.ctx, w, f.secret)
}

// TestAnUnapprovedWriteIsNeverIssued (I18): a write whose run's policy
// requires approval is recorded awaiting_approval; it becomes issued only
// once an orchestrator's login has recorded an approval, whatever path
// tries: the worker's send, the worker's login deciding, writing the
// decision log, or even the owner writing the row (the trigger's gate).
func TestAnUnapprovedWriteIsNeverIssued(t *testing.T) {
	t.Parallel()
	f := newApprovalFixture(t, time.Hour)
	w := f.ask(t, 0, `{"title":"refund"}`)

	if sent, state, err := f.send(w); sent || state != runs.WriteAwaitingApproval || err != nil {
		t.Errorf("send before a decision = %v, %s, %v; want not sent, awaiting_approval", sent, state, err)
	}
	wconn := workerConn(t, f.b)
	for _, stmt := range []string{
		// "anonymous" passes the actor check: only the login is refused.
		fmt.Sprintf(`SELECT fanout.tool_call_decide('acme', '%s', 'approved', 'anonymous', '')`, w.CallID),
		fmt.Sprintf(`INSERT INTO fanout.tool_call_decision (call_id, tenant_id, run_id, decision, actor) VALUES ('%s', 'acme', 'r1', 'approved', 'me')`, w.CallID),
		fmt.Sprintf(`UPDATE fanout.tool_call SET state = 'approved' WHERE call_id = '%s'`, w.CallID),
	} {
		if _, err := wconn.Exec(f.b.ctx, stmt); sqlState(err) != "42501" {
			t.Errorf("worker's login: %s: %v (SQLSTATE %q); want insufficient_privilege", stmt, err, sqlState(err))
		}
	}
	// The owner bypasses every privilege; the trigger still refuses.
	for _, c := range []struct{ stmt, code string }{
		{"UPDATE fanout.tool_call SET state = 'approved' WHERE call_id = $1", "42501"},
		{"UPDATE fanout.tool_call SET state = 'issued' WHERE call_id = $1", "23000"},
		{"UPDATE fanout.tool_call SET state = 'done' WHERE call_id = $1", "23000"},
	} {
		if _, err := f.b.pool.Exec(f.b.ctx, c.stmt, w.CallID); sqlState(err) != c.code {
			t.Errorf("owner: %s: %v (SQLSTATE %q); want %s", c.stmt, err, sqlState(err), c.code)
		}
	}
	forged := f.ts.at(write(fmt.Sprintf("r1/t1/a%d/i1/c9", f.attempt), f.attempt, 1, 9, `{}`))
	if _, err := f.b.pool.Exec(f.b.ctx, `INSERT INTO fanout.tool_call (key, tenant_id, run_id, task_id, attempt, iteration,
		call_index, tool, args_digest) VALUES ($1, 'acme', 'r1', 't1', $2, 1, 9, 'crm__create_ticket', $3)`,
		forged.Key, f.attempt, forged.ArgsDigest); sqlState(err) != "42501" {
		t.Errorf("owner inserting the write as issued: %v (SQLSTATE %q); want insufficient_privilege from the gate", err, sqlState(err))
	}
	if st, err := f.worker.WriteStatus(f.b.ctx, w.Key, f.secret); err != nil || st.State != runs.WriteAwaitingApproval || st.Expired {
		t.Fatalf("after the refused attempts: %+v, %v; want awaiting_approval, not expired", st, err)
	}

	d, err := f.orch.DecideAs(f.b.ctx, "acme", w.CallID, true, f.approver, f.approverSecret, "looks right")
	if err != nil || !d.Approved || d.State != runs.WriteApproved || d.Actor != f.approver || d.TaskID != "t1" {
		t.Fatalf("approve = %+v, %v", d, err)
	}
	if again, err := f.orch.Decide(f.b.ctx, "acme", w.CallID, true, "anonymous", "again"); err != nil ||
		again.Actor != d.Actor || !again.DecidedAt.Equal(d.DecidedAt) {
		t.Errorf("approve again = %+v, %v; want the first decision", again, err)
	}
	if _, err := f.orch.Decide(f.b.ctx, "acme", w.CallID, false, "anonymous", "no"); !errors.Is(err, runs.ErrDecisionConflict) {
		t.Errorf("deny an approved call: %v; want ErrDecisionConflict", err)
	}
	if _, err := f.orch.Decide(f.b.ctx, "globex", w.CallID, true, "anonymous", ""); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("another tenant approves: %v; want ErrNotFound", err)
	}
	if sent, _, err := f.send(w); !sent || err != nil {
		t.Fatalf("send after the approval = %v, %v; want sent", sent, err)
	}
	if err := f.worker.ResolveWrite(f.b.ctx, w.Key, f.secret, runs.WriteDone, "ticket 9", ""); err != nil {
		t.Fatalf("resolve the sent write: %v", err)
	}
	var actor, decision string
	if err := f.b.pool.QueryRow(f.b.ctx, `SELECT actor, decision FROM fanout.tool_call_decisions WHERE call_id = $1`,
		w.CallID).Scan(&actor, &decision); err != nil || actor != d.Actor || decision != "approved" {
		t.Errorf("the auditor's view: %s %s, %v", actor, decision, err)
	}
	if _, err := f.b.pool.Exec(f.b.ctx, `UPDATE fanout.tool_call_decision SET actor = 'someone' WHERE call_id = $1`,
		w.CallID); sqlState(err) != "42501" {
		t.Errorf("owner rewriting a decision: %v; want refused (append-only)", err)
	}

	// A write the policy does not require approval for is issued at once;
	// a tool the run's policy does not name is refused.
	note := f.ts.at(write(fmt.Sprintf("r1/t1/a%d/i2/c0", f.attempt), f.attempt, 2, 0, `{}`))
	note.Tool = "crm__note"
	if got, err := f.worker.IssueWrite(f.b.ctx, note, f.secret); err != nil || got.State != runs.WriteIssued {
		t.Errorf("issue a write without approval: %+v, %v; want issued", got, err)
	}
	other := f.ts.at(write(fmt.Sprintf("r1/t1/a%d/i2/c1", f.attempt), f.attempt, 2, 1, `{}`))
	other.Tool = "crm__delete_everything"
	if _, err := f.worker.IssueWrite(f.b.ctx, other, f.secret); !errors.Is(err, store.ErrWriteConflict) {
		t.Errorf("issue a tool outside the run's policy: %v; want ErrWriteConflict", err)
	}
}

// TestDenialsExpiryAndTheRunsEnd: a denial is recorded with its reason and
// told as the call's error; a call past its deadline is denied as expired
// (by the worker, which only ever denies, or by the next decision); the
// run's end denies what still waits; each is in the decision log.
func TestDenialsExpiryAndTheRunsEnd(t *testing.T) {
	t.Parallel()
	f := newApprovalFixture(t, time.Hour)
	denied := f.ask(t, 0, `{"title":"a"}`)
	waiting := f.ask(t, 1, `{"title":"b"}`)
	approved := f.ask(t, 2, `{"title":"c"}`)
	if _, err := f.orch.DecideAs(f.b.ctx, "acme", denied.CallID, false, f.approver, f.approverSecret, "not today"); err != nil {
		t.Fatal(err)
	}
	st, err := f.worker.WriteStatus(f.b.ctx, denied.Key, f.secret)
	if err != nil || st.State != runs.WriteDenied || st.Error != "denied by "+f.approver+": not today" {
		t.Errorf("denied call: %+v, %v", st, err)
	}
	if sent, state, err := f.send(denied); sent || state != runs.WriteDenied || err != nil {
		t.Errorf("send a denied call = %v, %s, %v; want not sent, denied", sent, state, err)
	}
	if _, err := f.orch.DecideAs(f.b.ctx, "acme", approved.CallID, true, f.approver, f.approverSecret, ""); err != nil {
		t.Fatal(err)
	}
	if state, err := f.worker.ExpireWrite(f.b.ctx, waiting.Key, f.secret); err != nil || state != runs.WriteAwaitingApproval {
		t.Errorf("expire a call before its deadline = %s, %v; want it still awaiting_approval", state, err)
	}
	if _, err := f.worker.ExpireWrite(f.b.ctx, waiting.Key, "not the secret"); err == nil {
		t.Error("expire with another secret: no error")
	}
	// The run ends: what waits, or was approved and not sent, is denied.
	if _, err := f.b.pool.Exec(f.b.ctx, `SELECT fanout.tool_call_end_run('r1')`); err != nil {
		t.Fatal(err)
	}
	for _, w := range []runs.Write{waiting, approved} {
		if st, err := f.worker.WriteStatus(f.b.ctx, w.Key, f.secret); err != nil || st.State != runs.WriteDenied || st.Error != runs.DeniedRunEnded {
			t.Errorf("%s after the run's end: %+v, %v; want denied, %q", w.Key, st, err, runs.DeniedRunEnded)
		}
	}
	if sent, _, _ := f.send(approved); sent {
		t.Error("an approved call of an ended run was sent")
	}
	var n int
	if err := f.b.pool.QueryRow(f.b.ctx, `SELECT count(*) FROM fanout.tool_call_decisions
		WHERE run_id = 'r1' AND decision = 'denied' AND (reason, actor) IN (('not today', $1), ('run ended', 'fanout'))`, f.approver).Scan(&n); err != nil || n != 2 {
		t.Errorf("denials in the decision log: %d, %v; want 2 (a person's, the run's end)", n, err)
	}
}

// TestAnApprovalExpires: past its deadline (the database's clock) a call is
// denied as expired, by the waiting worker or by a late decision, and
// never sent.
func TestAnApprovalExpires(t *testing.T) {
	t.Parallel()
	f := newApprovalFixture(t, 50*time.Millisecond)
	byWorker := f.ask(t, 0, `{"title":"a"}`)
	byDecision := f.ask(t, 1, `{"title":"b"}`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := f.worker.WriteStatus(f.b.ctx, byDecision.Key, f.secret)
		if err != nil {
			t.Fatal(err)
		}
		if st.Expired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not expired 30 s after a 50 ms deadline: %+v", st)
		}
		time.Sleep(20 * time.Millisecond) // polling the database's clock, with a deadline
	}
	if state, err := f.worker.ExpireWrite(f.b.ctx, byWorker.Key, f.secret); err != nil || state != runs.WriteDenied {
		t.Errorf("expire past the deadline = %s, %v; want denied", state, err)
	}
	if st, _ := f.worker.WriteStatus(f.b.ctx, byWorker.Key, f.secret); st.Error != runs.DeniedExpired {
		t.Errorf("expired call's error %q; want %q", st.Error, runs.DeniedExpired)
	}
	if _, err := f.orch.DecideAs(f.b.ctx, "acme", byWorker.CallID, true, f.approver, f.approverSecret, ""); !errors.Is(err, runs.ErrDecisionConflict) {
		t.Errorf("approve a call the worker expired: %v; want ErrDecisionConflict", err)
	}
	if _, err := f.orch.DecideAs(f.b.ctx, "acme", byDecision.CallID, true, f.approver, f.approverSecret, ""); !errors.Is(err, runs.ErrApprovalExpired) {
		t.Errorf("approve past the deadline: %v; want ErrApprovalExpired", err)
	}
	if sent, state, _ := f.send(byDecision); sent || state != runs.WriteDenied {
		t.Errorf("send an expired call = %v, %s; want not sent, denied", sent, state)
	}
}

// TestARedispatchedAttemptSendsTheApprovedCall: approval given while the
// task was away is honoured by its next attempt, which sends the call under
// the key it was asked with (never asking again); the attempt it replaced
// cannot send it.
func TestARedispatchedAttemptSendsTheApprovedCall(t *testing.T) {
	t.Parallel()
	f := newApprovalFixture(t, time.Hour)
	w := f.ask(t, 0, `{"title":"a"}`)
	old := f.secret
	oldAttempt := f.attempt
	f.next(t)
	if _, err := f.orch.DecideAs(f.b.ctx, "acme", w.CallID, true, f.approver, f.approverSecret, ""); err != nil {
		t.Fatal(err)
	}
	stale := w
	stale.Attempt = oldAttempt
	if _, _, err := f.worker.SendWrite(f.b.ctx, stale, old); !errors.Is(err, runs.ErrAttemptSuperseded) {
		t.Errorf("the replaced attempt sends: %v; want ErrAttemptSuperseded", err)
	}
	ws, err := f.worker.Writes(f.b.ctx, "acme", "r1", "t1", f.secret)
	if err != nil || len(ws) != 1 || ws[0].CallID != w.CallID || ws[0].State != runs.WriteApproved {
		t.Fatalf("the new attempt reads %+v, %v; want the approved call", ws, err)
	}
	if sent, _, err := f.send(w); !sent || err != nil {
		t.Fatalf("the new attempt sends = %v, %v", sent, err)
	}
	if sent, _, err := f.send(w); !sent || err != nil {
		t.Errorf("a retried send = %v, %v; want sent (the same attempt)", sent, err)
	}
	if err := f.worker.ResolveWrite(f.b.ctx, w.Key, old, runs.WriteDone, "", ""); !errors.Is(err, store.ErrWriteConflict) {
		t.Errorf("the replaced attempt resolves it: %v; want ErrWriteConflict", err)
	}
	if err := f.worker.ResolveWrite(f.b.ctx, w.Key, f.secret, runs.WriteDone, "ok", ""); err != nil {
		t.Errorf("the sending attempt resolves it: %v", err)
	}
}

// workerConn connects to the test database as a worker's login (a member
// of fanout_worker only).
func workerConn(t *testing.T, b *testBundle) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(b.ctx, storetest.WorkerURL(t, b.url))
	if err != nil {
		t.Fatalf("connect as a worker: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestTheRunRecordsItsPolicyAndItsEndDeniesWhatWaits: Runs.OpenRun records
// the run's tool policy in the run's own transaction, so a write of a tool
// it says needs approval waits; Runs.CloseRun denies, in the close's
// transaction, what still waits ("run ended"), so no decision reaches a
// write of an ended run.
func TestTheRunRecordsItsPolicyAndItsEndDeniesWhatWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := store.NewRuns(b.pool)
	open := budget.OpenRunParams{RunID: "r1", TenantID: "ten", Limit: 1000, MinReservation: 10,
		Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 400}}}
	policy := []runs.ToolPolicy{{Tool: "charge", Approval: true, ApprovalTimeout: time.Hour}, {Tool: "note"}}
	_, accounts, _, err := rs.OpenRun(b.ctx, draftRun("r1", "ten", "k", "a"), "node1", open, policy, nil, []string{"a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tc := store.NewToolCalls(b.pool, store.ToolCallsConfig{})
	at := accounts.Attempts["a"]
	w := runs.Write{Key: "r1/a/a1/i1/c0", Account: int64(accounts.Tasks["a"]), TenantID: "ten", RunID: "r1", TaskID: "a",
		Attempt: at.N, Iteration: 1, Tool: "charge", ArgsDigest: digest(`{}`)}
	got, err := tc.IssueWrite(b.ctx, w, at.Secret)
	if err != nil || got.State != runs.WriteAwaitingApproval {
		t.Fatalf("issue under the recorded policy: %+v, %v; want awaiting_approval", got, err)
	}
	note := w
	note.Key, note.Tool, note.Index = "r1/a/a1/i1/c1", "note", 1
	if got, err := tc.IssueWrite(b.ctx, note, at.Secret); err != nil || got.State != runs.WriteIssued {
		t.Errorf("issue a tool without approval: %+v, %v; want issued", got, err)
	}
	if _, err := rs.CloseRun(b.ctx, "r1", "node1", 0, fanoutv1.RunState_RUN_STATE_CANCELLED, "cancelled", nil); err != nil {
		t.Fatal(err)
	}
	if st, err := tc.WriteStatus(b.ctx, w.Key, ""); err != nil || st.State != runs.WriteDenied || st.Error != runs.DeniedRunEnded {
		t.Errorf("the waiting write after the run closed: %+v, %v; want denied, %q", st, err, runs.DeniedRunEnded)
	}
	if _, err := tc.Decide(b.ctx, "ten", got.CallID, true, "anonymous", ""); !errors.Is(err, runs.ErrDecisionConflict) {
		t.Errorf("approve after the run ended: %v; want ErrDecisionConflict", err)
	}
}

// TestNoWriteIsSentOnceTheRunStopped (review of issue 28): between the
// ledger's cancel (or exhaustion) and the run's close, an approval given
// before or after the cancel sends nothing: the send and the decision
// both deny the call as "run ended".
func TestNoWriteIsSentOnceTheRunStopped(t *testing.T) {
	t.Parallel()
	f := newApprovalFixture(t, time.Hour)
	before := f.ask(t, 0, `{"title":"a"}`)
	after := f.ask(t, 1, `{"title":"b"}`)
	if _, err := f.orch.DecideAs(f.b.ctx, "acme", before.CallID, true, f.approver, f.approverSecret, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.ledger.CancelRun(f.b.ctx, "r1", "cancelled by caller"); err != nil {
		t.Fatal(err)
	}
	if sent, state, err := f.send(before); sent || state != runs.WriteDenied || err != nil {
		t.Errorf("send a call approved before the cancel = %v, %s, %v; want not sent, denied", sent, state, err)
	}
	if st, _ := f.worker.WriteStatus(f.b.ctx, before.Key, f.secret); st.Error != runs.DeniedRunEnded {
		t.Errorf("its error %q; want %q", st.Error, runs.DeniedRunEnded)
	}
	if _, err := f.orch.DecideAs(f.b.ctx, "acme", after.CallID, true, f.approver, f.approverSecret, ""); !errors.Is(err, runs.ErrDecisionConflict) {
		t.Errorf("approve after the cancel: %v; want ErrDecisionConflict (run ended)", err)
	}
	if sent, state, _ := f.send(after); sent || state != runs.WriteDenied {
		t.Errorf("send a call decided after the cancel = %v, %s; want not sent, denied", sent, state)
	}
}

// TestOrchestratorLoginCannotInventAnApprover (issue 40, item 6): an
// orchestrator's login records a decision only under an actor the
// database can trust — "anonymous", its own role, or a live approve key of
// the call's tenant whose secret the transaction presented. A made-up key,
// the approver's key without its secret or with another key's, a key of
// the tenant without approve, another tenant's approve key, a revoked
// approve key with its secret, "fanout" and another role are each refused
// (42501): the call still waits, no decision names anyone, nothing is
// sent, and no error names a secret. Then the approver with its secret is
// recorded, and tool_call_decisions names it.
func TestOrchestratorLoginCannotInventAnApprover(t *testing.T) {
	t.Parallel()
	f := newApprovalFixture(t, time.Hour)
	w := f.ask(t, 0, `{"title":"refund"}`)
	_, otherSecret := liveKey(t, f.b, "acme", "approve")
	reader, readerSecret := liveKey(t, f.b, "acme", "read")
	foreign, foreignSecret := liveKey(t, f.b, "globex", "approve")
	revoked, revokedSecret := liveKey(t, f.b, "acme", "approve")
	if _, err := store.NewKeys(f.b.pool, nil).RevokeKey(f.b.ctx, storetest.Actor(t, f.b.pool), strings.TrimPrefix(revoked, "key:")); err != nil {
		t.Fatal(err)
	}
	secrets := []string{f.approverSecret, otherSecret, readerSecret, foreignSecret, revokedSecret}
	for _, c := range []struct{ who, actor, secret string }{
		{"a made-up key", "key:fk_0000000000000000", ""},
		{"the approver without its secret", f.approver, ""},
		{"the approver with another key's secret", f.approver, otherSecret},
		{"a key of the tenant without approve, with its secret", reader, readerSecret},
		{"another tenant's approve key, with its secret", foreign, foreignSecret},
		{"a revoked approve key, with its secret", revoked, revokedSecret},
		{"fanout itself", "fanout", ""},
		{"another role", "role:postgres", ""},
	} {
		_, err := f.orch.DecideAs(f.b.ctx, "acme", w.CallID, true, c.actor, c.secret, "")
		if sqlState(err) != "42501" {
			t.Errorf("approve as %s: %v (SQLSTATE %q); want insufficient_privilege", c.who, err, sqlState(err))
		}
		for _, s := range secrets {
			if err != nil && strings.Contains(err.Error(), s) {
				t.Errorf("approve as %s: the error names a secret: %v", c.who, err)
			}
		}
	}
	var decisions int
	if err := f.b.pool.QueryRow(f.b.ctx, `SELECT count(*) FROM fanout.tool_call_decisions WHERE call_id = $1`, w.CallID).Scan(&decisions); err != nil ||
		decisions != 0 {
		t.Errorf("decisions after the refused approvals: %d, %v; want none", decisions, err)
	}
	if sent, state, err := f.send(w); sent || state != runs.WriteAwaitingApproval || err != nil {
		t.Errorf("send after the refused approvals = %v, %s, %v; want not sent, awaiting_approval", sent, state, err)
	}

	d, err := f.orch.DecideAs(f.b.ctx, "acme", w.CallID, true, f.approver, f.approverSecret, "checked")
	if err != nil || !d.Recorded || d.Actor != f.approver {
		t.Fatalf("approve as the approver with its secret = %+v, %v; want recorded under %s", d, err, f.approver)
	}
	var actor string
	if err := f.b.pool.QueryRow(f.b.ctx, `SELECT actor FROM fanout.tool_call_decisions WHERE call_id = $1`, w.CallID).Scan(&actor); err != nil ||
		actor != f.approver {
		t.Errorf("tool_call_decisions names %q, %v; want %s", actor, err, f.approver)
	}
	if sent, _, err := f.send(w); !sent || err != nil {
		t.Errorf("send after the approval = %v, %v; want sent", sent, err)
	}
}
