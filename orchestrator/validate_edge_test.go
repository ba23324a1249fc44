package orchestrator_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fanout/fanout/orchestrator"
)

// TestValidateAcceptsEveryLimitExactly is the lower side of the request
// limits README "The spec" states (TestValidateBadRequests is the upper
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
	if err := (orchestrator.Config{}).Validate(s); err != nil {
		t.Fatalf("a spec at every limit was refused: %v", err)
	}
}
