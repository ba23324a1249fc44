package tenant_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoDatabaseDriverBehindTheAPI (issue 24): the packages that hold the
// engine, the workers, the budget, tenants and authentication depend on
// interfaces, never on a database driver: pgx (and anything under
// github.com/jackc) is store's alone. depguard sees direct imports only;
// this walks every dependency, as `go list -deps` does.
func TestNoDatabaseDriverBehindTheAPI(t *testing.T) {
	t.Parallel()
	for _, pkg := range []string{"orchestrator", "subagent", "budget", "tenant", "auth", "admin", "runs"} {
		out, err := exec.Command("go", "list", "-deps", "github.com/fanout/fanout/"+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v (the go command must be on PATH)", pkg, err)
		}
		for dep := range strings.FieldsSeq(string(out)) {
			if strings.HasPrefix(dep, "github.com/jackc/") || dep == "github.com/fanout/fanout/store" {
				t.Errorf("%s depends on %s: only store (and what wires it: node, cmd) may reach the database driver", pkg, dep)
			}
		}
	}
}
