package orchestrator_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestValidateAcceptsEveryLimitExactly is the lower side of the request
// limits docs/runs.md "The spec" states (TestValidateBadRequests is the upper
// side, each one just above): with the orchestrator's default Config, a
// spec at every limit at once is accepted — 256 tasks, a 128-byte
// idempotency key and tenant id, 64-byte task ids, 64 labels with 63-byte
// keys and 255-byte values, 50 iterations a task.
func TestValidateAcceptsEveryLimitExactly(t *testing.T) {
	t.Parallel()
	s := spec(strings.Repeat("k", 128), 256, 1_000_000)
	s.TenantId = strings.Repeat("t", 128)
	for i, task := range s.GetTasks() {
		task.Id = fmt.Sprintf("%064d", i)
		task.TokenBudget = 1000
		task.MaxIterations = 50
	}
	s.Labels = map[string]string{}
	for i := range 64 {
		s.Labels[fmt.Sprintf("%063d", i)] = strings.Repeat("v", 255)
	}
	s.FanOut = &fanoutv1.FanOut{MaxDepth: 4, MaxChildTasks: 64, MaxTreeTasks: 4096}
	if err := (orchestrator.Config{}).Validate(s); err != nil {
		t.Fatalf("a spec at every limit was refused: %v", err)
	}
	s.FanOut.MaxTreeTasks = 256 // the root's own tasks
	if err := (orchestrator.Config{}).Validate(s); err != nil {
		t.Fatalf("a tree of just the root's tasks was refused: %v", err)
	}
}

// TestValidationErrorNamesAtMostMaxReported: one mistake copied over many
// tasks is answered with the first budget.MaxReported violations named (in
// the message and as field violations) and the rest counted, so a spec of
// thousands of bad tasks gets an answer of a few kilobytes (a 2,000-task
// spec's was 130 KB, one line per task, found by bench/scale). At exactly
// MaxReported nothing is counted; one more is.
func TestValidationErrorNamesAtMostMaxReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "v1", orchestrator.Config{MaxRunTokens: 1e9})
	for _, bad := range []int{budget.MaxReported, budget.MaxReported + 1, 256} {
		s := spec(fmt.Sprintf("k%d", bad), 256, 1_000_000)
		for i := range bad {
			s.Tasks[i].TokenBudget = -1
		}
		_, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument {
			t.Fatalf("%d bad tasks: %s %q, want InvalidArgument", bad, st.Code(), st.Message())
		}
		named := min(bad, budget.MaxReported)
		if got := len(fieldViolations(st)); got != named {
			t.Errorf("%d bad tasks: %d field violations, want %d", bad, got, named)
		}
		if got := strings.Count(st.Message(), "token_budget"); got != named {
			t.Errorf("%d bad tasks: the message names %d, want %d: %q", bad, got, named, st.Message())
		}
		more := fmt.Sprintf("and %d more", bad-named)
		if counted := strings.Contains(st.Message(), more); counted != (bad > named) {
			t.Errorf("%d bad tasks: message %q, want %q in it: %v", bad, st.Message(), more, bad > named)
		}
		if size := proto.Size(st.Proto()); size > 4<<10 {
			t.Errorf("%d bad tasks: the status is %d bytes, want at most 4 KiB", bad, size)
		}
	}
	b.checkNothingWritten(t, n)
}
