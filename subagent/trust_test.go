package subagent_test

import (
	"crypto/ed25519"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/peer"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// TestServerRefusesUnsignedDispatches: a missing, forged, mismatched or
// foreign-key envelope is refused before anything is reserved or called.
func TestServerRefusesUnsignedDispatches(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{FinishAfter: 1, InputTokens: 100, OutputTokens: 50})
	client := serve(t, newServer(t, b, sim, nil))

	good := signed(request(b, "a"))
	other := request(b, "a")
	other.Model.MaxOutputTokens = 1 << 15
	otherBytes, err := proto.Marshal(other)
	if err != nil {
		t.Fatal(err)
	}
	flipped := proto.CloneOf(good)
	flipped.Signature[3] ^= 1
	_, stranger, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	strangerSigner := peer.NewSigner(stranger)
	for _, tc := range []struct {
		name string
		env  *fanoutv1.ExecuteRequest
		code codes.Code
	}{
		{"no envelope", &fanoutv1.ExecuteRequest{}, codes.Unauthenticated},
		{"no signature", &fanoutv1.ExecuteRequest{Dispatch: good.GetDispatch(), KeyId: good.GetKeyId()}, codes.Unauthenticated},
		{"an unknown key", &fanoutv1.ExecuteRequest{Dispatch: good.GetDispatch(),
			Signature: strangerSigner.SignDispatch(good.GetDispatch()), KeyId: strangerSigner.KeyID()}, codes.Unauthenticated},
		{"a forged signature", flipped, codes.PermissionDenied},
		{"another dispatch's signature", &fanoutv1.ExecuteRequest{Dispatch: otherBytes, Signature: good.GetSignature(),
			KeyId: good.GetKeyId()}, codes.PermissionDenied},
		{"a stranger's signature under our key id", &fanoutv1.ExecuteRequest{Dispatch: good.GetDispatch(),
			Signature: strangerSigner.SignDispatch(good.GetDispatch()), KeyId: good.GetKeyId()}, codes.PermissionDenied},
		{"a plain signature, not a dispatch's", &fanoutv1.ExecuteRequest{Dispatch: good.GetDispatch(),
			Signature: testSigner.Sign(good.GetDispatch()), KeyId: good.GetKeyId()}, codes.PermissionDenied},
	} {
		stream, err := client.Execute(within(t), tc.env)
		if err == nil {
			_, err = collect(t, stream)
		}
		if status.Code(err) != tc.code {
			t.Errorf("%s: err = %v, want %s", tc.name, err, tc.code)
		}
	}
	if rs := b.reservations(t); len(rs) != 0 {
		t.Errorf("refused envelopes reserved %d times", len(rs))
	}
	if n := len(sim.Calls()); n != 0 {
		t.Errorf("refused envelopes made %d model calls", n)
	}
	// The same dispatch, signed, runs.
	stream, err := client.Execute(within(t), good)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := collect(t, stream)
	if err != nil || msgs[len(msgs)-1].GetSummary().GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
		t.Fatalf("signed dispatch: %v, %v", msgs, err)
	}
}

// TestServerSpendsOnlyFromTheDispatchedAccount reproduces issue 9's first two
// defects through a worker: a dispatch that names another tenant's run
// account (even signed, as a compromised orchestrator or a bug would send
// it) or replays a closed run's task is refused by the ledger, and no model
// call is made.
func TestServerSpendsOnlyFromTheDispatchedAccount(t *testing.T) {
	t.Parallel()
	b := setup(t, 60_000, 50, map[string]int64{"a": 50_000, "b": 50_000})
	sim := newSim(t, llm.SimConfig{FinishAfter: 1, InputTokens: 100, OutputTokens: 50})
	client := serve(t, newServer(t, b, sim, nil))
	run := func(d *fanoutv1.Dispatch) *fanoutv1.FactSummary {
		t.Helper()
		stream, err := client.Execute(within(t), signed(d))
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := collect(t, stream)
		if err != nil {
			t.Fatal(err)
		}
		return msgs[len(msgs)-1].GetSummary()
	}

	// Another tenant names our run's account with a huge output cap.
	intruder := request(b, "a")
	intruder.TenantId, intruder.RunId = "globex", "globex-run"
	intruder.TaskAccountId = int64(b.accts.Run.ID)
	if sum := run(intruder); sum.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED ||
		!strings.Contains(sum.GetError(), budget.ErrDenied.Error()) {
		t.Errorf("intruder's dispatch = %s %q, want refused by the ledger (%v)", sum.GetStatus(), sum.GetError(), budget.ErrDenied)
	}
	// A stale attempt: the task was dispatched again since.
	if _, err := b.ledger.BeginAttempt(t.Context(), b.accts.Tasks["b"], b.runID, "t1"); err != nil {
		t.Fatal(err)
	}
	if sum := run(request(b, "b")); !strings.Contains(sum.GetError(), budget.ErrDenied.Error()) {
		t.Errorf("superseded attempt = %s %q, want refused by the ledger", sum.GetStatus(), sum.GetError())
	}
	if n := len(sim.Calls()); n != 0 {
		t.Fatalf("refused dispatches made %d model calls", n)
	}

	// A task that ran, then its run closed; the same dispatch again.
	if sum := run(request(b, "a")); sum.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
		t.Fatalf("first run of a: %s %s", sum.GetStatus(), sum.GetError())
	}
	calls := len(sim.Calls())
	if _, err := b.ledger.CloseRun(t.Context(), b.runID); err != nil {
		t.Fatal(err)
	}
	if sum := run(request(b, "a")); sum.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
		t.Errorf("replay after the run closed = %s, want refused", sum.GetStatus())
	}
	if n := len(sim.Calls()); n != calls {
		t.Errorf("the replay after the run closed made %d model calls", n-calls)
	}
	a, err := b.ledger.Account(t.Context(), b.accts.Run.ID)
	if err != nil || a.Spent != 150 {
		t.Errorf("run account = %+v, %v; want only a's one call (150 tokens) spent", a, err)
	}
	b.checkLedger(t)
}

// TestServerRefusesADuplicateDispatch: the same attempt of a task, sent
// twice (a replayed envelope), runs once.
func TestServerRefusesADuplicateDispatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{FinishAfter: 1, InputTokens: 100, OutputTokens: 50, Latency: 2 * time.Second})
	client := serve(t, newServer(t, b, sim, nil))
	env := signed(request(b, "a"))
	first, err := client.Execute(within(t), env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err != nil { // started: it holds its slot now
		t.Fatalf("the first dispatch's Started message: %v", err)
	}
	second, err := client.Execute(within(t), env)
	if err == nil {
		_, err = collect(t, second)
	}
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("duplicate dispatch: err = %v, want AlreadyExists", err)
	}
	if _, err := collect(t, first); err != nil {
		t.Fatal(err)
	}
}
