package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/fanout/fanout/store"
)

const auditUsage = `
Make a database role the auditor of one tenant: through every audit view (run_spend,
task_spend, tenant_spend_daily, ...) it reads that tenant's rows only (row-level security,
PostgreSQL 15 or later). fanout_auditor stays the global reader. Connect as the owner role
(the one that runs "fanout migrate"). The role is created NOLOGIN if missing: give it
LOGIN and a password, or grant it to a login role. The action is logged in admin_audit.

Usage:
  fanout audit grant  --tenant ID --role NAME [--database-url URL]
  fanout audit revoke --tenant ID --role NAME [--database-url URL]

Example:
  FANOUT_DATABASE_URL=postgres://owner@db:5432/fanout fanout audit grant --tenant acme --role acme_auditor
  psql -c "ALTER ROLE acme_auditor LOGIN PASSWORD '...'"      # as the owner, once
`

// cmdAudit grants or revokes a per-tenant auditor role.
func cmdAudit(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 || (args[0] != "grant" && args[0] != "revoke") {
		fmt.Fprint(env.Stderr, strings.TrimLeft(auditUsage, "\n"))
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return flag.ErrHelp
		}
		return errUsage
	}
	verb := args[0]
	f := newFlags("audit "+verb, auditUsage, env.Stderr)
	var url, tenant, role string
	f.secretVar(&url, "database-url", "PostgreSQL URL of the owner role")
	f.alsoEnv("database-url", "DATABASE_URL")
	f.StringVar(&tenant, "tenant", "", "the tenant whose rows the role reads")
	f.StringVar(&role, "role", "", "the database role (lowercase letters, digits, underscores; at most 63)")
	if err := parseFlags(f, args[1:], env); err != nil {
		return err
	}
	switch {
	case url == "":
		return fmt.Errorf("--database-url or --database-url-file (or FANOUT_DATABASE_URL, DATABASE_URL, FANOUT_DATABASE_URL_FILE) is required: the owner role's")
	case tenant == "":
		return fmt.Errorf("--tenant is required")
	case role == "":
		return fmt.Errorf("--role is required")
	}
	pool, err := store.Open(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	audit := store.NewAudit(pool)
	if verb == "revoke" {
		left, err := audit.Revoke(ctx, tenant, role)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "role %s no longer audits tenant %s (it audits %d other tenant(s); the role itself is kept)\n", role, tenant, left)
		return nil
	}
	res, err := audit.Grant(ctx, tenant, role)
	if err != nil {
		return err
	}
	switch {
	case res.AlreadyGranted:
		fmt.Fprintf(env.Stdout, "role %s already audits tenant %s\n", role, tenant)
	case res.RoleCreated:
		fmt.Fprintf(env.Stdout, "role %s created (NOLOGIN) and made the auditor of tenant %s\n"+
			"give it a login: ALTER ROLE %s LOGIN PASSWORD '...'; or GRANT %s TO a login role\n", role, tenant, role, role)
	default:
		fmt.Fprintf(env.Stdout, "role %s is now an auditor of tenant %s\n", role, tenant)
	}
	return nil
}
