package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
)

// TestAuditorsMayCallWhatTheirViewsCall (issue 23, item 8): a view runs its
// functions with the privileges of whoever reads it, so each function an
// audit view calls must be executable by both auditor groups — else a
// view reads fine until a row takes the branch that calls it. The catalog
// check covers every view; a tenant's auditor then reads tenant_budget
// while the tenant's period has ended (the branch that calls
// ledger_period_next_end), as it was refused on main.
func TestAuditorsMayCallWhatTheirViewsCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rows, err := b.pool.Query(b.ctx, `
		SELECT DISTINCT v.relname || ' calls ' || p.oid::regprocedure::text || ' which ' || r.rolname || ' may not execute'
		  FROM pg_class v
		  JOIN pg_rewrite rw ON rw.ev_class = v.oid
		  JOIN pg_depend d ON d.objid = rw.oid AND d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_proc'::regclass
		  JOIN pg_proc p ON p.oid = d.refobjid AND p.pronamespace = 'fanout'::regnamespace
		  CROSS JOIN (SELECT rolname FROM pg_roles WHERE rolname IN ('fanout_auditor', 'fanout_tenant_auditor')) r
		 WHERE v.relnamespace = 'fanout'::regnamespace AND v.relkind = 'v'
		   AND has_table_privilege(r.rolname, v.oid, 'SELECT')
		   AND NOT has_function_privilege(r.rolname, p.oid, 'EXECUTE')
		 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range missing {
		t.Error(m)
	}

	ten := b.setBudget(t, budget.TenantBudget{TenantID: "acme", Limit: 1000,
		Period: budget.Period{Kind: budget.PeriodEvery, Every: time.Second}})
	b.waitPeriodEnd(t, ten)
	role := testRole(t, b, "acme_aud")
	if _, err := store.NewAudit(b.pool).Grant(b.ctx, "acme", role); err != nil {
		t.Fatal(err)
	}
	var n int
	err = asRole(t, b, role, func(tx pgx.Tx) error {
		return tx.QueryRow(b.ctx, "SELECT count(*) FROM fanout.tenant_budget WHERE period_end > now()").Scan(&n)
	})
	if err != nil || n != 1 {
		t.Errorf("tenant_budget as acme's auditor after the period ended: %d rows, %v; want acme's, rolled over", n, err)
	}
}
