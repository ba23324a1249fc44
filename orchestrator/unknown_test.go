package orchestrator_test

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// TestIdempotentRetryWithUnknownFields: a caller built against a newer
// fanout.proto sends RunSpec fields this server does not know (at the top
// and inside a task), then retries StartRun with the same key and the same
// bytes after losing the reply. The retry joins the run: the spec the server
// keeps (protojson, with no place for unknown fields) is the one it compares.
// (Found in review of issue 11: the jsonb spec made the retry
// FAILED_PRECONDITION "idempotency key already used with a different spec".)
func TestIdempotentRetryWithUnknownFields(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w1", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	s := spec("newer-client", 2, 100_000)
	var unk []byte
	unk = protowire.AppendTag(unk, 999, protowire.BytesType)
	unk = protowire.AppendString(unk, "a field from a newer proto")
	s.ProtoReflect().SetUnknown(unk)
	s.Tasks[1].ProtoReflect().SetUnknown(unk)
	r1, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatalf("retry of the same StartRun: %v", err)
	}
	if r1.GetRunId() != r2.GetRunId() {
		t.Errorf("the retry started run %s, want the first one, %s", r2.GetRunId(), r1.GetRunId())
	}
	if fin := checkEvents(t, watchAll(t, n.client, r1.GetRunId())); fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
}
