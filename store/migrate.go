package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/migrations"
)

// migrateLockKey is the advisory lock every migrating node takes first, so
// replicas starting together apply each version once.
const migrateLockKey = 0x66616e6f7574 // "fanout"

// Migration is one numbered schema change.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

// checksum identifies the text of the up migration.
func (m Migration) checksum() string {
	sum := sha256.Sum256([]byte(m.Up))
	return hex.EncodeToString(sum[:8])
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		name := e.Name()
		var dir string
		switch {
		case strings.HasSuffix(name, ".up.sql"):
			dir = "up"
		case strings.HasSuffix(name, ".down.sql"):
			dir = "down"
		default:
			continue
		}
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_name.(up|down).sql", name)
		}
		body, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			return nil, err
		}
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v, Name: strings.TrimSuffix(strings.TrimSuffix(rest, ".up.sql"), ".down.sql")}
			byVersion[v] = m
		}
		if dir == "up" {
			m.Up = string(body)
		} else {
			m.Down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("migration %04d_%s: needs both .up.sql and .down.sql", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// dataStep is the Go half of a migration: rows that SQL cannot convert
// (proto bytes), converted in batches of their own transactions. Each step
// is idempotent.
type dataStep struct {
	// up runs right after the version's up SQL, and again on any later
	// migrate while that version is still the newest applied, so that a
	// migrate cut off during the conversion finishes it the next time. The
	// next version's SQL may then rely on it having finished.
	up func(ctx context.Context, conn *pgx.Conn) error
	// down runs right before the version's down SQL.
	down func(ctx context.Context, conn *pgx.Conn) error
}

// dataSteps are the migrations' Go halves, by version.
var dataSteps = map[int]dataStep{
	// 0006 adds jsonb columns beside the proto bytea ones, the step fills
	// them, 0007 drops the bytea ones; down, the step refills the bytea.
	6: {up: runsToJSONB, down: runsToProto},
}

// Migrate applies every pending migration to the database at databaseURL.
func Migrate(ctx context.Context, databaseURL string) error {
	_, err := MigrateTo(ctx, databaseURL, -1)
	return err
}

// MigrateTo moves the schema to version target (-1 means the newest), applying
// up or down migrations each in its own transaction, with their Go data
// steps (dataSteps) between them, under a session advisory lock so that
// nodes migrating at once wait for each other. It returns the versions
// applied (negative for reverted ones).
func MigrateTo(ctx context.Context, databaseURL string, target int) ([]int, error) {
	all, err := Migrations()
	if err != nil {
		return nil, err
	}
	if target < 0 && len(all) > 0 {
		target = all[len(all)-1].Version
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", redactURLError(err))
	}
	// Objects are created in Schema once it exists (migration 5 made it);
	// the migrations before it created theirs in public, and 5 moved them.
	setSearchPath(cfg, Schema+", public")
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("migrate: connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()

	if err := checkServerVersion(ctx, conn); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrateLockKey); err != nil {
		return nil, fmt.Errorf("migrate: take lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrateLockKey) //nolint:errcheck // the session ends right after

	applied, err := appliedVersions(ctx, conn, all)
	if err != nil {
		return nil, err
	}
	done, err := migrateUp(ctx, conn, all, target, applied)
	if err != nil {
		return done, err
	}
	down, err := migrateDown(ctx, conn, all, target, applied)
	return append(done, down...), err
}

// MinServerVersion is the oldest PostgreSQL fanout migrates, as
// server_version_num: 15, the first with security_invoker views, which the
// per-tenant audit (migration 21) stands on.
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

// appliedVersions reads which versions the database has (creating the
// bookkeeping table the first time) and refuses if an applied migration's
// text changed since: the database would silently differ from what the
// code expects.
func appliedVersions(ctx context.Context, conn *pgx.Conn, all []Migration) (map[int]bool, error) {
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.schema_migration (
		version    int PRIMARY KEY,
		name       text NOT NULL,
		checksum   text,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("migrate: create schema_migration: %w", err)
	}
	// Databases migrated before checksums were kept have none to compare.
	if _, err := conn.Exec(ctx, "ALTER TABLE public.schema_migration ADD COLUMN IF NOT EXISTS checksum text"); err != nil {
		return nil, fmt.Errorf("migrate: add schema_migration.checksum: %w", err)
	}
	rows, err := conn.Query(ctx, "SELECT version, coalesce(checksum, '') FROM public.schema_migration")
	if err != nil {
		return nil, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	applied := map[int]bool{}
	sums := map[int]string{}
	var v int
	var sum string
	if _, err := pgx.ForEachRow(rows, []any{&v, &sum}, func() error {
		applied[v], sums[v] = true, sum
		return nil
	}); err != nil {
		return nil, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	for _, m := range all {
		if applied[m.Version] && sums[m.Version] != "" && sums[m.Version] != m.checksum() {
			return nil, fmt.Errorf("migrate: %04d_%s changed after it was applied to this database "+
				"(checksum %s, now %s): applied migrations are immutable; add a new one instead "+
				"(a dev database can simply be deleted)", m.Version, m.Name, sums[m.Version], m.checksum())
		}
	}
	return applied, nil
}

// migrateUp applies, in order and each in its own transaction, every
// migration up to target that is not applied yet, and runs each version's
// data step (a Go backfill) right after its SQL — and on every later
// migrate while it is the newest version applied, so that a conversion cut
// off midway resumes. It returns the versions applied.
func migrateUp(ctx context.Context, conn *pgx.Conn, all []Migration, target int, applied map[int]bool) ([]int, error) {
	newest := 0 // the newest version applied
	for v := range applied {
		newest = max(newest, v)
	}
	var done []int
	for _, m := range all {
		if m.Version > target {
			break
		}
		if !applied[m.Version] {
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, m.Up); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "INSERT INTO public.schema_migration (version, name, checksum) VALUES ($1, $2, $3)",
					m.Version, m.Name, m.checksum())
				return err
			})
			if err != nil {
				return done, fmt.Errorf("migrate up %04d_%s: %w", m.Version, m.Name, err)
			}
			applied[m.Version], newest = true, max(newest, m.Version)
			done = append(done, m.Version)
		}
		if step := dataSteps[m.Version]; step.up != nil && newest == m.Version {
			if err := step.up(ctx, conn); err != nil {
				return done, fmt.Errorf("migrate up %04d_%s: %w", m.Version, m.Name, err)
			}
		}
	}
	return done, nil
}

// migrateDown reverts, newest first, every applied migration above target:
// its data step first (refilling what the older schema reads), then its
// SQL. It returns the versions reverted, negated.
func migrateDown(ctx context.Context, conn *pgx.Conn, all []Migration, target int, applied map[int]bool) ([]int, error) {
	var done []int
	for i := len(all) - 1; i >= 0; i-- {
		m := all[i]
		if m.Version <= target || !applied[m.Version] {
			continue
		}
		if step := dataSteps[m.Version]; step.down != nil {
			if err := step.down(ctx, conn); err != nil {
				return done, fmt.Errorf("migrate down %04d_%s: %w", m.Version, m.Name, err)
			}
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.Down); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DELETE FROM public.schema_migration WHERE version = $1", m.Version)
			return err
		})
		if err != nil {
			return done, fmt.Errorf("migrate down %04d_%s: %w", m.Version, m.Name, err)
		}
		done = append(done, -m.Version)
	}
	return done, nil
}
