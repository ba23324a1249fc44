package store

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// createRole finds the roles a versioned migration creates.
var createRoleStmt = regexp.MustCompile(`(?i)\bCREATE\s+ROLE\s+([a-z_][a-z0-9_]*)`)

// checkOwner refuses, before anything is written, to migrate as a role
// that lacks a privilege this migrate needs (docs/operations.md "Database
// roles"), naming each one missing and the statement that grants it:
//
//   - CREATEROLE while a versioned migration that creates fanout's groups
//     is to be applied (a new database): PostgreSQL refuses CREATE ROLE
//     without it even when the role already exists;
//   - CREATE on the database while schema fanout does not exist;
//   - CREATE on schema public while the bookkeeping table
//     public.schema_migration does not exist.
//
// The database's owner has the last two, so an owner needs one grant:
// CREATEROLE. A database below Baseline is left to appliedVersions, which
// refuses it.
func checkOwner(ctx context.Context, conn *pgx.Conn, all []Migration) error {
	var role, database string
	var createRole, createInDatabase, createInPublic, schema, bookkeeping bool
	if err := conn.QueryRow(ctx, `SELECT current_user, current_database(), r.rolcreaterole OR r.rolsuper,
			has_database_privilege(current_database(), 'CREATE'),
			CASE WHEN to_regnamespace('public') IS NULL THEN false ELSE has_schema_privilege('public', 'CREATE') END,
			to_regnamespace('fanout') IS NOT NULL, to_regclass('public.schema_migration') IS NOT NULL
		FROM pg_roles r WHERE r.rolname = current_user`).
		Scan(&role, &database, &createRole, &createInDatabase, &createInPublic, &schema, &bookkeeping); err != nil {
		return fmt.Errorf("migrate: read the role's privileges: %w", err)
	}
	applied := map[int]bool{}
	if bookkeeping {
		rows, err := conn.Query(ctx, "SELECT version FROM public.schema_migration")
		if err != nil {
			return fmt.Errorf("migrate: read applied versions: %w", err)
		}
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return fmt.Errorf("migrate: read applied versions: %w", err)
		}
		if len(versions) > 0 && slices.Max(versions) < Baseline {
			return nil
		}
		for _, v := range versions {
			applied[v] = true
		}
	}

	who := ident(role)
	var missing []string
	if !createRole {
		var groups, files []string
		for _, m := range all {
			if applied[m.Version] {
				continue
			}
			if found := createRoleNames(m.SQL); len(found) > 0 {
				groups = append(groups, found...)
				files = append(files, fmt.Sprintf("versioned/%04d_%s.sql", m.Version, m.Name))
			}
		}
		if len(groups) > 0 {
			missing = append(missing, fmt.Sprintf("CREATEROLE, to create the groups %s (%s; PostgreSQL refuses CREATE ROLE "+
				"without it even when the role exists): as a superuser, ALTER ROLE %s CREATEROLE",
				strings.Join(groups, ", "), strings.Join(files, ", "), who))
		}
	}
	if !schema && !createInDatabase {
		missing = append(missing, fmt.Sprintf("CREATE on database %s, to create schema fanout: GRANT CREATE ON DATABASE %[1]s TO %s, "+
			"or make %[2]s the database's owner", ident(database), who))
	}
	if !bookkeeping && !createInPublic {
		missing = append(missing, fmt.Sprintf("CREATE on schema public, to create public.schema_migration: "+
			"GRANT CREATE ON SCHEMA public TO %s, or make %[1]s the database's owner", who))
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("migrate: role %s lacks what migrating this database needs (docs/operations.md \"Database roles\"): %s",
		who, strings.Join(missing, "; "))
}

// createRoleNames are the roles sql creates, in order.
func createRoleNames(sql string) []string {
	var names []string
	for _, m := range createRoleStmt.FindAllStringSubmatch(sql, -1) {
		names = append(names, m[1])
	}
	return names
}

// plainIdent is an identifier SQL reads unquoted, as written.
var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// ident is name as SQL reads it: bare when it can be, quoted otherwise.
func ident(name string) string {
	if plainIdent.MatchString(name) {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}
