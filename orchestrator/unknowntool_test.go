package orchestrator_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestUnknownToolNamesOnlyTheTenantsTools (issue 40): a spec naming a tool
// nobody configured is INVALID_ARGUMENT listing the tools the caller's
// tenant may use (the built-in ones, a tool every tenant shares, its own),
// never a tool the operator's policy keeps for another tenant: not in the
// message, not in the BadRequest details.
func TestUnknownToolNamesOnlyTheTenantsTools(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "unknown-tool", orchestrator.Config{MaxRunTokens: 1e9,
		KnownTools: []string{"fetch", "note", "search", "shared__lookup", "acme__crm_export", "globex__billing_charge"},
		ToolRules: map[string]orchestrator.ToolRule{
			"acme__crm_export":       {Tenants: []string{"acme"}},
			"globex__billing_charge": {Tenants: []string{"globex"}},
		}})
	for _, c := range []struct{ tenant, own, others string }{
		{"acme", "acme__crm_export", "globex__billing_charge"},
		{"globex", "globex__billing_charge", "acme__crm_export"},
	} {
		s := validSpec()
		s.TenantId = c.tenant
		s.Tasks[4].AllowedTools = []string{"search", "nobody__configured_this"}
		_, err := n.client.StartRun(tenantCtx(t, c.tenant), &fanoutv1.StartRunRequest{Spec: s})
		st := status.Convert(err)
		const field = "spec.tasks[4].allowed_tools[1]"
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), field) ||
			!strings.Contains(st.Message(), `unknown tool "nobody__configured_this"`) {
			t.Fatalf("%s names an unknown tool: %s %q; want INVALID_ARGUMENT naming %s and the tool", c.tenant, st.Code(), st.Message(), field)
		}
		if len(st.Details()) == 0 {
			t.Errorf("%s: no BadRequest details in %v", c.tenant, st.Proto())
		}
		everything := st.Message() + "\n" + fmt.Sprint(st.Details())
		for _, tool := range []string{"fetch", "note", "search", "shared__lookup", c.own} {
			if !strings.Contains(st.Message(), tool) {
				t.Errorf("%s: %q does not list its tool %s", c.tenant, st.Message(), tool)
			}
		}
		if strings.Contains(everything, c.others) {
			t.Errorf("%s is told %s, a tool the operator keeps for another tenant: %s", c.tenant, c.others, fmt.Sprint(everything))
		}
	}
	b.checkNothingWritten(t, n)
}
