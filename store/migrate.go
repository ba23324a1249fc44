package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/migrations"
)

// The schema is migrated in two steps (docs/architecture.md, "The schema"):
//
//  1. Versioned migrations (migrations/versioned/NNNN_name.sql): tables,
//     columns, data and privileges, each applied once, in its own
//     transaction, forward only. A new database gets the baseline, which
//     stands for versions 1 to Baseline; a database an earlier release
//     migrated to Baseline or later goes on from where it is.
//  2. Definitions (migrations/functions/*.sql, then migrations/views/*.sql):
//     the one current text of every function, trigger and view, applied
//     as one set, in one transaction, whenever a file's checksum differs
//     from what the database recorded or a versioned migration was just
//     applied. Whatever no file defines any more is dropped.
//
// Both run on one connection holding a session advisory lock, so that
// nodes migrating at once apply each step once.

// migrateLockKey is the advisory lock every migrating node takes first.
const migrateLockKey = 0x66616e6f7574 // "fanout"

// Baseline is the version migrations/versioned/0021_baseline.sql stands
// for: it holds the tables of versions 1 to 21, whose own files were
// removed when the history was collapsed. A database at an older version
// must first be migrated to it by the last release that had them.
const Baseline = 21

// Migration is one versioned schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Definition is one file of the definitions step, named by its path under
// migrations/ (functions/ledger_reserve.sql).
type Definition struct {
	Path string
	SQL  string
}

func checksum(sql string) string {
	sum := sha256.Sum256([]byte(sql))
	return hex.EncodeToString(sum[:8])
}

// Migrations returns the versioned migrations in version order.
func Migrations() ([]Migration, error) { return versioned(migrations.FS) }

// Definitions returns the definition files in the order they are applied:
// functions/ then views/, each by file name. A view that reads another
// view must sort after it.
func Definitions() ([]Definition, error) { return definitions(migrations.FS) }

func versioned(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, "versioned")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 || !strings.HasSuffix(name, ".sql") || rest == "" {
			return nil, fmt.Errorf("migration versioned/%s: name must be NNNN_name.sql", name)
		}
		body, err := fs.ReadFile(fsys, path.Join("versioned", name))
		if err != nil {
			return nil, err
		}
		if len(out) > 0 && out[len(out)-1].Version == v {
			return nil, fmt.Errorf("migration versioned/%s: version %d is taken", name, v)
		}
		out = append(out, Migration{Version: v, Name: rest, SQL: string(body)})
	}
	if len(out) == 0 || out[0].Version != Baseline {
		return nil, fmt.Errorf("migrations: the first versioned migration must be the baseline, version %d", Baseline)
	}
	return out, nil // ReadDir sorts by name, and names start with the zero-padded version
}

func definitions(fsys fs.FS) ([]Definition, error) {
	var out []Definition
	for _, dir := range []string{"functions", "views"} {
		entries, err := fs.ReadDir(fsys, dir)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".sql") {
				continue
			}
			p := path.Join(dir, e.Name())
			body, err := fs.ReadFile(fsys, p)
			if err != nil {
				return nil, err
			}
			out = append(out, Definition{Path: p, SQL: string(body)})
		}
	}
	return out, nil
}

// Applied is what one migrate did.
type Applied struct {
	// Versions are the versioned migrations applied, in order.
	Versions []int
	// Changed are the definition files whose text the database had not
	// applied yet (new or edited); when there are any, or Versions is not
	// empty, every definition was applied again. Dropped names the
	// functions and triggers that no file defines any more.
	Changed, Dropped []string
	// Redefined reports whether the definitions step ran.
	Redefined bool
}

// Migrate brings the database at databaseURL to the current schema.
func Migrate(ctx context.Context, databaseURL string) error {
	_, err := Apply(ctx, databaseURL)
	return err
}

// Apply brings the database at databaseURL to the current schema and says
// what it did.
func Apply(ctx context.Context, databaseURL string) (Applied, error) {
	return apply(ctx, databaseURL, migrations.FS)
}

func apply(ctx context.Context, databaseURL string, fsys fs.FS) (Applied, error) {
	var done Applied
	all, err := versioned(fsys)
	if err != nil {
		return done, err
	}
	defs, err := definitions(fsys)
	if err != nil {
		return done, err
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return done, fmt.Errorf("migrate: %w", redactURLError(err))
	}
	setSearchPath(cfg, Schema+", public")
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return done, fmt.Errorf("migrate: connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()

	if err := checkServerVersion(ctx, conn); err != nil {
		return done, err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrateLockKey); err != nil {
		return done, fmt.Errorf("migrate: take lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrateLockKey) //nolint:errcheck // the session ends right after

	if err := checkOwner(ctx, conn, all); err != nil {
		return done, err
	}
	applied, err := appliedVersions(ctx, conn, all)
	if err != nil {
		return done, err
	}
	if done.Versions, err = migrateUp(ctx, conn, all, applied); err != nil {
		return done, err
	}
	err = redefine(ctx, conn, defs, len(done.Versions) > 0, &done)
	return done, err
}

// MinServerVersion is the oldest PostgreSQL fanout migrates, as
// server_version_num: 15, the first with security_invoker views, which the
// per-tenant audit stands on.
const MinServerVersion = 150000

// checkServerVersion refuses a server older than MinServerVersion, naming
// the version found.
func checkServerVersion(ctx context.Context, conn *pgx.Conn) error {
	var num int
	var version string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").
		Scan(&num, &version); err != nil {
		return fmt.Errorf("migrate: read server version: %w", err)
	}
	return serverVersionError(num, version)
}

// serverVersionError is checkServerVersion's verdict on server_version_num
// num (server_version text).
func serverVersionError(num int, version string) error {
	if num >= MinServerVersion {
		return nil
	}
	return fmt.Errorf("migrate: PostgreSQL %s found; fanout needs PostgreSQL %d or later "+
		"(its audit views are security_invoker, so that row-level security gives each tenant's auditor only that tenant's rows)",
		version, MinServerVersion/10000)
}

// appliedVersions reads which versions the database has, creating the
// bookkeeping table the first time. It refuses a database an earlier
// release left below the baseline, and one whose applied migration's text
// changed since (a versioned migration is compared when the database
// recorded it under the same name: the rows of versions 1 to 21 that
// earlier releases wrote name files that no longer exist).
func appliedVersions(ctx context.Context, conn *pgx.Conn, all []Migration) (map[int]bool, error) {
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.schema_migration (
		version    int PRIMARY KEY,
		name       text NOT NULL,
		checksum   text,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("migrate: create schema_migration: %w", err)
	}
	rows, err := conn.Query(ctx, "SELECT version, name, coalesce(checksum, '') FROM public.schema_migration")
	if err != nil {
		return nil, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	applied := map[int]bool{}
	names, sums := map[int]string{}, map[int]string{}
	newest := 0
	var v int
	var name, sum string
	if _, err := pgx.ForEachRow(rows, []any{&v, &name, &sum}, func() error {
		applied[v], names[v], sums[v] = true, name, sum
		newest = max(newest, v)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	if newest > 0 && newest < Baseline {
		return nil, fmt.Errorf("migrate: the database is at schema version %d; this release upgrades databases at version %d or later: "+
			"migrate it to %d with the last release that has the full history first (docs/operations.md, \"Upgrading\"), then run this one",
			newest, Baseline, Baseline)
	}
	for _, m := range all {
		if applied[m.Version] && names[m.Version] == m.Name && sums[m.Version] != "" && sums[m.Version] != checksum(m.SQL) {
			return nil, fmt.Errorf("migrate: versioned/%04d_%s.sql changed after it was applied to this database "+
				"(checksum %s, now %s): applied migrations are immutable; add a new one instead "+
				"(a dev database can simply be deleted)", m.Version, m.Name, sums[m.Version], checksum(m.SQL))
		}
	}
	return applied, nil
}

// migrateUp applies, in order and each in its own transaction, every
// versioned migration not applied yet. A database with no version at all
// gets the baseline; one that an earlier release migrated has Baseline
// applied (appliedVersions refused it otherwise), so its rows of versions 1
// to 21 stand for the baseline. It returns the versions applied.
func migrateUp(ctx context.Context, conn *pgx.Conn, all []Migration, applied map[int]bool) ([]int, error) {
	var done []int
	for _, m := range all {
		if applied[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO public.schema_migration (version, name, checksum) VALUES ($1, $2, $3)",
				m.Version, m.Name, checksum(m.SQL))
			return err
		})
		if err != nil {
			return done, fmt.Errorf("migrate versioned/%04d_%s.sql: %w", m.Version, m.Name, err)
		}
		done = append(done, m.Version)
	}
	return done, nil
}

// redefine is the definitions step. It compares each file's checksum with
// public.schema_repeatable and, if any differs (or force), in one
// transaction: drops every view of the schema, takes every grant on its
// functions away from PUBLIC and fanout's roles, applies the function
// files (CREATE OR REPLACE: a function keeps its oid, so a node calling it
// meanwhile is not broken), drops the triggers and functions that no file
// (re)defined, applies the view files, and runs audit_refresh(), which
// makes the views security_invoker and puts back the auditors' column
// grants and the row-level security policies.
//
// One transaction makes the step all or nothing: other sessions see the
// old definitions until it commits and the new ones after, never a schema
// with a view or grant missing. It is safe beside running nodes because
// PostgreSQL's DDL is transactional and CREATE OR REPLACE keeps each
// function's identity; what a running node may notice is a wait: the
// dropped views are locked until the commit (auditors' reads wait), and a
// trigger's table is briefly locked against writes. lock_timeout bounds
// that wait instead of queueing behind a long transaction forever.
//
// What "no file defined it" means: every row the step writes at the top
// level carries this transaction's xid as its xmin, and the grants are
// taken away inside a savepoint, whose writes carry the subtransaction's
// xid instead. So after the function files, a function or trigger whose
// catalog row's xmin is not this transaction's was not created or
// replaced by any file: it is dropped (RESTRICT: if a table still used
// it, the migrate fails and says so).
func redefine(ctx context.Context, conn *pgx.Conn, defs []Definition, force bool, done *Applied) error {
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.schema_repeatable (
		path       text PRIMARY KEY,
		checksum   text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("migrate: create schema_repeatable: %w", err)
	}
	rows, err := conn.Query(ctx, "SELECT path, checksum FROM public.schema_repeatable")
	if err != nil {
		return fmt.Errorf("migrate: read schema_repeatable: %w", err)
	}
	recorded := map[string]string{}
	var p, sum string
	if _, err := pgx.ForEachRow(rows, []any{&p, &sum}, func() error { recorded[p] = sum; return nil }); err != nil {
		return fmt.Errorf("migrate: read schema_repeatable: %w", err)
	}
	for _, d := range defs {
		if recorded[d.Path] != checksum(d.SQL) {
			done.Changed = append(done.Changed, d.Path)
		}
		delete(recorded, d.Path)
	}
	if !force && len(done.Changed) == 0 && len(recorded) == 0 {
		return nil
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL search_path = fanout, pg_catalog;
			SET LOCAL lock_timeout = '1min';
			SELECT pg_current_xact_id()`); err != nil {
			return err
		}
		if err := execEach(ctx, tx, `SELECT format('DROP VIEW IF EXISTS %s CASCADE', c.oid::regclass)
			  FROM pg_class c WHERE c.relnamespace = 'fanout'::regnamespace AND c.relkind = 'v' ORDER BY c.relname`); err != nil {
			return fmt.Errorf("drop views: %w", err)
		}
		if _, err := tx.Exec(ctx, "SAVEPOINT grants"); err != nil {
			return err
		}
		// Every grant of every routine, to whichever role holds it: the
		// files then say again who may execute what, and nothing else may.
		if err := execEach(ctx, tx, `SELECT format('REVOKE ALL ON ROUTINE %s FROM %s', p.oid::regprocedure,
			       string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END, ', '))
			  FROM pg_proc p
			  CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
			  LEFT JOIN pg_roles r ON r.oid = a.grantee
			 WHERE p.pronamespace = 'fanout'::regnamespace AND a.grantee <> p.proowner
			 GROUP BY p.oid ORDER BY 1`); err != nil {
			return fmt.Errorf("reset function grants: %w", err)
		}
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT grants"); err != nil {
			return err
		}
		views := slices.IndexFunc(defs, func(d Definition) bool { return strings.HasPrefix(d.Path, "views/") })
		if views < 0 {
			views = len(defs)
		}
		for _, d := range defs[:views] {
			if _, err := tx.Exec(ctx, d.SQL); err != nil {
				return fmt.Errorf("%s: %w", d.Path, err)
			}
		}
		if done.Dropped, err = dropUndefined(ctx, tx); err != nil {
			return err
		}
		for _, d := range defs[views:] {
			if _, err := tx.Exec(ctx, d.SQL); err != nil {
				return fmt.Errorf("%s: %w", d.Path, err)
			}
		}
		if _, err := tx.Exec(ctx, "SELECT audit_refresh()"); err != nil {
			return fmt.Errorf("audit_refresh: %w", err)
		}
		if _, err := tx.Exec(ctx, "DELETE FROM public.schema_repeatable"); err != nil {
			return err
		}
		for _, d := range defs {
			if _, err := tx.Exec(ctx, "INSERT INTO public.schema_repeatable (path, checksum) VALUES ($1, $2)",
				d.Path, checksum(d.SQL)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate definitions: %w", err)
	}
	done.Redefined = true
	return nil
}

// dropUndefined drops the triggers on fanout's tables and the functions of
// schema fanout that this transaction did not write (see redefine), and
// returns what it dropped.
func dropUndefined(ctx context.Context, tx pgx.Tx) ([]string, error) {
	rows, err := tx.Query(ctx, `
		SELECT format('trigger %I on %s', t.tgname, t.tgrelid::regclass),
		       format('DROP TRIGGER %I ON %s', t.tgname, t.tgrelid::regclass)
		  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
		 WHERE c.relnamespace = 'fanout'::regnamespace AND NOT t.tgisinternal
		   AND t.xmin <> xid(pg_current_xact_id())
		UNION ALL
		SELECT format('function %s', p.oid::regprocedure),
		       format('DROP ROUTINE %s', p.oid::regprocedure)
		  FROM pg_proc p
		 WHERE p.pronamespace = 'fanout'::regnamespace AND p.xmin <> xid(pg_current_xact_id())
		 ORDER BY 1 DESC`) // triggers ("t…") before the functions they call ("f…")
	if err != nil {
		return nil, err
	}
	var what, stmt string
	var names, stmts []string
	if _, err := pgx.ForEachRow(rows, []any{&what, &stmt}, func() error {
		names, stmts = append(names, what), append(stmts, stmt)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("find what no file defines: %w", err)
	}
	for i, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("drop %s, which no file defines any more: %w", names[i], err)
		}
	}
	return names, nil
}

// execEach runs query, which returns one SQL statement per row, then each
// statement.
func execEach(ctx context.Context, tx pgx.Tx, query string) error {
	rows, err := tx.Query(ctx, query)
	if err != nil {
		return err
	}
	stmts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return err
		}
	}
	return nil
}
