package store_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
)

// TestTenantAuditorLearnsNoTenantsCountFromThePlanner (issue 23, item 13)
// pins what docs/auditing.md says a tenant's auditor can infer beyond its
// rows. The planner's row estimate for another tenant's rows is the same
// as for a tenant that does not exist (no statistics are kept on
// tenant_id), where on main it was that tenant's count. What is left and
// documented: the size of each table over every tenant (pg_class, readable
// by any role) — pinned here so that the doc changes with it.
func TestTenantAuditorLearnsNoTenantsCountFromThePlanner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	open := func(tenant string, n int) {
		for i := range n {
			if _, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: fmt.Sprintf("%s-%d", tenant, i), TenantID: tenant,
				Limit: 100, MinReservation: 1, Tasks: []budget.TaskBudget{{TaskID: "t", Limit: 100}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	open("globex", 300)
	open("acme", 3)
	if _, err := b.pool.Exec(b.ctx, "ANALYZE fanout.account"); err != nil {
		t.Fatal(err)
	}
	role := testRole(t, b, "acme_aud")
	if _, err := store.NewAudit(b.pool).Grant(b.ctx, "acme", role); err != nil {
		t.Fatal(err)
	}
	estimate := func(tenant string) (rows float64) {
		t.Helper()
		err := asRole(t, b, role, func(tx pgx.Tx) error {
			var plan []map[string]map[string]any
			if err := tx.QueryRow(b.ctx, "EXPLAIN (FORMAT JSON) SELECT tenant_id FROM fanout.account WHERE tenant_id = $1", tenant).Scan(&plan); err != nil {
				return err
			}
			rows, _ = plan[0]["Plan"]["Plan Rows"].(float64)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	globex, nobody := estimate("globex"), estimate("nobody")
	t.Logf("acme's auditor: the planner expects %v rows of globex's accounts, %v of a tenant that does not exist", globex, nobody)
	if globex != nobody {
		t.Errorf("the planner tells acme's auditor %v rows for globex against %v for no tenant: globex's count leaks", globex, nobody)
	}
	var total float64
	if err := asRole(t, b, role, func(tx pgx.Tx) error {
		return tx.QueryRow(b.ctx, "SELECT reltuples FROM pg_class WHERE oid = 'fanout.account'::regclass").Scan(&total)
	}); err != nil {
		t.Fatal(err)
	}
	if total < 600 {
		t.Errorf("pg_class.reltuples of account as acme's auditor = %v; docs/auditing.md says every role reads each table's size over all tenants (606 rows here): update the doc if this changed", total)
	}
}
