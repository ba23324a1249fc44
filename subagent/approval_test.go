package subagent_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// approvalSetup is a task whose run's recorded policy says writes of
// "charge" wait for approval (for timeout), with a counting charge tool,
// its write log and a channel that hears each approval request.
type approvalSetup struct {
	b     *bundle
	log   *store.ToolCalls
	loop  *subagent.Loop
	task  subagent.Task
	asked chan runs.Write
	mu    sync.Mutex
	sent  []string // the idempotency keys the tool got
	model *scripted
}

func newApprovalSetup(t *testing.T, timeout time.Duration, calls ...llm.ToolCall) *approvalSetup {
	t.Helper()
	s := &approvalSetup{b: setup(t, 100_000, 50, map[string]int64{"a": 50_000}), asked: make(chan runs.Write, 16),
		model: &scripted{calls: calls}}
	if _, err := s.b.pool.Exec(t.Context(), `INSERT INTO run_tool_policy (tenant_id, run_id, tool, approval, approval_timeout_ms)
		VALUES ('t1', $1, 'charge', true, $2)`, s.b.runID, timeout.Milliseconds()); err != nil {
		t.Fatal(err)
	}
	charge := subagent.Tool{Name: "charge", Effect: subagent.EffectWrite,
		Func: func(_ context.Context, c subagent.ToolCall) (subagent.ToolResult, error) {
			s.mu.Lock()
			s.sent = append(s.sent, c.IdempotencyKey)
			s.mu.Unlock()
			return subagent.ToolResult{Text: "charged"}, nil
		}}
	s.loop, s.task = toolLoop(t, s.b, s.model, charge)
	s.log = store.NewToolCalls(s.b.pool, store.ToolCallsConfig{})
	s.loop.Writes = s.log
	s.loop.ApprovalPoll = 10 * time.Millisecond
	s.loop.ToolSlots = make(chan struct{}, 1)
	s.loop.OnApproval = func(w runs.Write) { s.asked <- w }
	s.task.Attempt = 1
	return s
}

func chargeCall(id, args string) llm.ToolCall {
	return llm.ToolCall{ID: id, Name: "charge", Args: json.RawMessage(args)}
}

// decide records a person's decision, as the API does.
func (s *approvalSetup) decide(t *testing.T, w runs.Write, approve bool, reason string) {
	t.Helper()
	if _, err := s.log.Decide(t.Context(), "t1", w.CallID, approve, "key:fk_00000000000000aa", reason); err != nil {
		t.Fatalf("decide %s: %v", w.CallID, err)
	}
}

func (s *approvalSetup) keysSent() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.sent...)
}

// TestParallelWritesAreApprovedOneByOne (issue 28; langgraph#6626): three
// writes of one reply each wait under their own call id and preview; while
// one waits the task holds no model reservation and no tool slot; each is
// sent once, when approved, under its own key.
func TestParallelWritesAreApprovedOneByOne(t *testing.T) {
	t.Parallel()
	s := newApprovalSetup(t, time.Hour, chargeCall("c0", `{"amount":1,"api_key":"sk-live-123"}`),
		chargeCall("c1", `{"amount":2}`), chargeCall("c2", `{"amount":3}`))
	wait := goRun(t, t.Context(), s.loop, s.task)
	ids := map[string]bool{}
	for i := range 3 {
		w := await(t, s.asked, "an approval request")
		if ids[w.CallID] || w.CallID == "" || w.ApprovalDeadline.IsZero() {
			t.Fatalf("request %d: call id %q (seen: %v), deadline %v; want a new id and a deadline", i, w.CallID, ids, w.ApprovalDeadline)
		}
		ids[w.CallID] = true
		if strings.Contains(w.Preview, "sk-live-123") || (i == 0 && !strings.Contains(w.Preview, `"api_key":"[redacted]"`)) {
			t.Errorf("preview %q shows a secret, or does not say it was redacted", w.Preview)
		}
		if n := len(s.keysSent()); n != i {
			t.Fatalf("before approval %d the tool ran %d times", i, n)
		}
		var held int
		if err := s.b.pool.QueryRow(t.Context(), `SELECT count(*) FROM open_reservations WHERE run_id = $1`, s.b.runID).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held != 0 || len(s.loop.ToolSlots) != 0 {
			t.Errorf("while a write waits: %d open reservations, %d tool slots held; want none", held, len(s.loop.ToolSlots))
		}
		s.decide(t, w, true, "ok")
	}
	sum := wait("the task")
	if sum.Status != subagent.StatusSucceeded {
		t.Fatalf("status %s, err %v", sum.Status, sum.Err)
	}
	keys := s.keysSent()
	if len(keys) != 3 || keys[0] == keys[1] || keys[1] == keys[2] {
		t.Errorf("the tool got keys %q; want three distinct", keys)
	}
	for _, r := range s.model.results(t) {
		if r.IsError || r.Content != "charged" {
			t.Errorf("the model was shown %+v; want charged", r)
		}
	}
}

// TestADenialIsTheCallsFailure: a denied write is never sent; the model is
// told who denied it and why, as that call's error; the reply's later
// writes are not run; asking again is answered from the denial, not asked
// again.
func TestADenialIsTheCallsFailure(t *testing.T) {
	t.Parallel()
	s := newApprovalSetup(t, time.Hour, chargeCall("c0", `{"amount":1}`), chargeCall("c1", `{"amount":2}`))
	wait := goRun(t, t.Context(), s.loop, s.task)
	s.decide(t, await(t, s.asked, "the first request"), false, "over the limit")
	sum := wait("the task")
	if sum.Status != subagent.StatusSucceeded || len(s.keysSent()) != 0 {
		t.Fatalf("status %s, sent %q; want succeeded, nothing sent", sum.Status, s.keysSent())
	}
	rs := s.model.results(t)
	if len(rs) != 2 || !rs[0].IsError || !strings.Contains(rs[0].Content, "denied by key:fk_00000000000000aa: over the limit") ||
		!rs[1].IsError || !strings.Contains(rs[1].Content, "an earlier write in this reply failed") {
		t.Errorf("the model was shown %+v; want the denial with its reason, then the second write not run", rs)
	}
	select {
	case w := <-s.asked:
		t.Errorf("a second approval was asked for (%s) after the first write was denied", w.CallID)
	default:
	}
}

// TestAWriteWhoseRecordIsGoneIsNotSent: a write waiting for approval
// whose row the database no longer has (a failover to a standby that never
// received it: docs/operations.md#what-a-lost-grant-does-asynchronous-replication)
// is never sent, and the wait ends at once with the call's failure instead
// of polling for a decision that can never come.
func TestAWriteWhoseRecordIsGoneIsNotSent(t *testing.T) {
	t.Parallel()
	s := newApprovalSetup(t, time.Hour, chargeCall("c0", `{"amount":1}`))
	wait := goRun(t, t.Context(), s.loop, s.task)
	w := await(t, s.asked, "the approval request")
	if _, err := s.b.pool.Exec(t.Context(), `DELETE FROM tool_call WHERE key = $1`, w.Key); err != nil {
		t.Fatal(err)
	}
	sum := wait("the task")
	if sum.Status != subagent.StatusSucceeded || len(s.keysSent()) != 0 {
		t.Fatalf("status %s, sent %q; want succeeded, nothing sent", sum.Status, s.keysSent())
	}
	if rs := s.model.results(t); len(rs) != 1 || !rs[0].IsError || !strings.Contains(rs[0].Content, "no longer has its record") {
		t.Errorf("the model was shown %+v; want the write's record gone, not sent", rs)
	}
}

// TestAnApprovalNobodyGivesExpires: past its timeout a write is denied as
// expired, by the database's clock, and the model is told.
func TestAnApprovalNobodyGivesExpires(t *testing.T) {
	t.Parallel()
	s := newApprovalSetup(t, 300*time.Millisecond, chargeCall("c0", `{"amount":1}`))
	sum := s.loop.Run(within(t), s.task)
	if sum.Status != subagent.StatusSucceeded || len(s.keysSent()) != 0 {
		t.Fatalf("status %s, sent %q; want succeeded, nothing sent", sum.Status, s.keysSent())
	}
	if rs := s.model.results(t); len(rs) != 1 || !rs[0].IsError || !strings.Contains(rs[0].Content, runs.DeniedExpired) {
		t.Errorf("the model was shown %+v; want %q", rs, runs.DeniedExpired)
	}
}

// TestTheTasksEndEndsTheWait: a task cancelled while its write waits stops
// waiting at once; the write is not sent, and the call still waits in the
// database (a re-dispatched attempt takes it up; the run's end denies it).
func TestTheTasksEndEndsTheWait(t *testing.T) {
	t.Parallel()
	s := newApprovalSetup(t, time.Hour, chargeCall("c0", `{"amount":1}`))
	ctx, cancel := context.WithCancel(t.Context())
	wait := goRun(t, ctx, s.loop, s.task)
	w := await(t, s.asked, "the request")
	cancel()
	sum := wait("the cancelled task")
	if sum.Status == subagent.StatusSucceeded || len(s.keysSent()) != 0 {
		t.Errorf("status %s, sent %q; want stopped, nothing sent", sum.Status, s.keysSent())
	}
	st, err := s.log.WriteStatus(t.Context(), w.Key, "")
	if err != nil || st.State != runs.WriteAwaitingApproval {
		t.Errorf("the call after the task ended: %+v, %v; want still awaiting_approval", st, err)
	}
}

// TestTheNextAttemptTakesUpThePendingCall: an approval given while the task
// was away is honoured by its next attempt, which never asks again: it
// waits on the same call id, and sends it once under the key it was asked
// with.
func TestTheNextAttemptTakesUpThePendingCall(t *testing.T) {
	t.Parallel()
	s := newApprovalSetup(t, time.Hour, chargeCall("c0", `{"amount":1}`))
	ctx, cancel := context.WithCancel(t.Context())
	wait := goRun(t, ctx, s.loop, s.task)
	first := await(t, s.asked, "the first attempt's request")
	cancel()
	wait("the first attempt")
	s.decide(t, first, true, "while it was away")
	a, err := s.b.ledger.BeginAttempt(t.Context(), s.task.Account, s.b.runID, "t1")
	if err != nil {
		t.Fatal(err)
	}
	s.task.Attempt, s.task.AttemptSecret = int(a.N), a.Secret
	s.model.reqs = nil
	sum := s.loop.Run(t.Context(), s.task)
	if sum.Status != subagent.StatusSucceeded {
		t.Fatalf("status %s, err %v", sum.Status, sum.Err)
	}
	if again := await(t, s.asked, "the second attempt taking up the call"); again.CallID != first.CallID {
		t.Errorf("the second attempt waited on %s; want the first's call %s", again.CallID, first.CallID)
	}
	if keys := s.keysSent(); len(keys) != 1 || keys[0] != first.Key {
		t.Errorf("the tool got %q; want once, under %s", keys, first.Key)
	}
}

// TestTheWorkerRefusesAToolOfAnotherTenant (issue 28): a tool the
// operator's policy keeps from the task's tenant is neither offered to the
// model nor run, whatever the dispatch's allowed tools say.
func TestTheWorkerRefusesAToolOfAnotherTenant(t *testing.T) {
	t.Parallel()
	// (A second's approval timeout: were the tool run, its call would
	// expire at once instead of holding the test.)
	s := newApprovalSetup(t, time.Second, chargeCall("c0", `{"amount":1}`))
	s.loop.ToolAllowed = func(tool, tenant string) bool { return tool != "charge" || tenant == "someone-else" }
	sum := s.loop.Run(within(t), s.task)
	if sum.Status != subagent.StatusSucceeded || len(s.keysSent()) != 0 {
		t.Fatalf("status %s, sent %q; want succeeded, nothing sent", sum.Status, s.keysSent())
	}
	if tools := s.model.reqs[0].Tools; len(tools) != 0 {
		t.Errorf("the model was offered %v; want no tool", tools)
	}
	if rs := s.model.results(t); len(rs) != 1 || !strings.Contains(rs[0].Content, `tool "charge" is not allowed`) {
		t.Errorf("the model was shown %+v; want the call refused", rs)
	}
}
