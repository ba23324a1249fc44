package orchestrator_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestAnotherTenantCannotNameTheTool (issue 28): a tool the operator's
// policy keeps to some tenants is INVALID_ARGUMENT in another tenant's
// allowed_tools, naming the field, the task and the tool, and nothing is
// written; the tenant it is for starts its run, and the run records the
// tool's approval rule.
func TestAnotherTenantCannotNameTheTool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "policy", orchestrator.Config{MaxRunTokens: 1e9, ToolRules: map[string]orchestrator.ToolRule{
		"note": {Tenants: []string{"acme"}, Approval: true, ApprovalTimeout: time.Minute}}})
	s := validSpec()
	s.TenantId = "globex"
	s.Tasks[4].AllowedTools = []string{"search", "note"}
	_, err := n.client.StartRun(tenantCtx(t, "globex"), &fanoutv1.StartRunRequest{Spec: s})
	st := status.Convert(err)
	const field = "spec.tasks[4].allowed_tools[1]"
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), field) ||
		!strings.Contains(st.Message(), `task "t04" may not use tool "note"`) || !strings.Contains(st.Message(), `"globex"`) {
		t.Fatalf("globex names acme's tool: %s %q; want INVALID_ARGUMENT naming %s, the task and the tool", st.Code(), st.Message(), field)
	}
	if v := fieldViolations(st); len(v) != 1 || v[0].GetField() != field {
		t.Errorf("field violations %v; want exactly %s", v, field)
	}
	b.checkNothingWritten(t, n)

	s.TenantId = "acme"
	started, err := n.client.StartRun(tenantCtx(t, "acme"), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatalf("acme names its own tool: %v", err)
	}
	var approval bool
	var timeout int64
	if err := b.pool.QueryRow(t.Context(), `SELECT approval, approval_timeout_ms FROM run_tool_policy
		WHERE run_id = $1 AND tool = 'note'`, started.GetRunId()).Scan(&approval, &timeout); err != nil || !approval || timeout != 60_000 {
		t.Errorf("the run's recorded policy of note: approval %v, timeout %d ms, %v; want true, 60000", approval, timeout, err)
	}
	// Its note calls wait for an approval nobody gives: end it.
	if _, err := n.client.CancelRun(tenantCtx(t, "acme"), &fanoutv1.CancelRunRequest{RunId: started.GetRunId()}); err != nil {
		t.Fatal(err)
	}
}
