// Package store is fanout's PostgreSQL layer and the only package that imports
// pgx: the connection pool, the ledger, the migrator and LISTEN/NOTIFY.
package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// defaultMaxConns is the pool size when neither PoolConfig nor the database
// URL sets one.
const defaultMaxConns = 16

// PoolConfig tunes a pool OpenPool builds. Zero values take the documented
// defaults.
type PoolConfig struct {
	// MaxConns is the most connections the pool opens. It wins over the
	// URL's pool_max_conns; zero means the URL's, or 16 if it sets none.
	MaxConns int32
	// Name is the pool's application_name, so that pg_stat_activity tells a
	// process's pools apart, unless the URL sets application_name. Default
	// none.
	Name string
}

// Open builds a connection pool for databaseURL and checks that it answers:
// OpenPool with the zero PoolConfig.
func Open(ctx context.Context, databaseURL string) (*pgxpool.Pool, error) {
	return OpenPool(ctx, databaseURL, PoolConfig{})
}

// OpenPool builds a connection pool for databaseURL tuned by pc and checks
// that it answers. Queries use the extended protocol (pgx's default), never
// the simple one.
func OpenPool(ctx context.Context, databaseURL string, pc PoolConfig) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", redactURLError(err))
	}
	switch {
	case pc.MaxConns > 0:
		cfg.MaxConns = pc.MaxConns
	case !strings.Contains(databaseURL, "pool_max_conns"):
		// pgx's default, max(4, CPUs), starves a server with hundreds of
		// streams in flight.
		cfg.MaxConns = defaultMaxConns
	}
	if pc.Name != "" && cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = pc.Name
	}
	setSearchPath(cfg.ConnConfig, Schema)
	cfg.ConnConfig.Tracer = queryTracer{}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping %s: %w", cfg.ConnConfig.Host, err)
	}
	return pool, nil
}

// Schema is the PostgreSQL schema that holds fanout's tables, views and
// ledger functions. Only the owner role (the one that runs migrations) can
// create objects in it.
const Schema = "fanout"

// setSearchPath makes unqualified names resolve in path, unless the
// database URL chose a search_path itself.
func setSearchPath(cfg *pgx.ConnConfig, path string) {
	if cfg.RuntimeParams["search_path"] == "" {
		cfg.RuntimeParams["search_path"] = path
	}
}

// redactURLError keeps a password in a malformed URL out of error messages.
func redactURLError(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New("invalid connection string (details withheld: it may hold a password)")
	}
	return err
}

// isCheckViolation reports whether err is a CHECK constraint firing (23514).
func isCheckViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514"
}

// isCode reports whether err is a PostgreSQL error with SQLSTATE code.
func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// pgMessage is the message of a PostgreSQL error, or err's text.
func pgMessage(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	return err.Error()
}

// isUniqueViolation reports whether err is a UNIQUE constraint firing (23505).
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// Pool is the connection pool Open returns, named here so that callers can
// hold one without importing pgx.
type Pool = pgxpool.Pool

// CreateDatabase creates database name on the server at adminURL unless it exists.
func CreateDatabase(ctx context.Context, adminURL, name string) error {
	pool, err := Open(ctx, adminURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("look for database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	if _, err := pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil && !isCode(err, "42P04") { // duplicate_database: created meanwhile
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// CreateLoginRole creates (unless it exists) a login role on the server at
// adminURL that is a member of memberOf and nothing else: fanout_app for a
// node, fanout_auditor for an auditor. It sets no password (for a local
// cluster with trust authentication, as `fanout dev` runs); production roles
// are made by the operator (docs/operations.md).
func CreateLoginRole(ctx context.Context, adminURL, role, memberOf string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("create role %s: %w", role, redactURLError(err))
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
		CREATE ROLE %s LOGIN IN ROLE %s;
	EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$`,
		pgx.Identifier{role}.Sanitize(), pgx.Identifier{memberOf}.Sanitize()))
	if err != nil {
		return fmt.Errorf("create role %s: %w", role, err)
	}
	return nil
}

// AllowAnonymousAdmin opts the database at ownerURL (as its owner) in to
// admin functions acting for "anonymous", the actor of a node run with
// --auth none: for `fanout dev` and tests, never a production database.
func AllowAnonymousAdmin(ctx context.Context, ownerURL string) error {
	conn, err := pgx.Connect(ctx, ownerURL)
	if err != nil {
		return fmt.Errorf("allow anonymous admin: %w", redactURLError(err))
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, `INSERT INTO fanout.setting (name, value) VALUES ('anonymous_admin', 'on')
		ON CONFLICT (name) DO UPDATE SET value = 'on', set_at = now()`); err != nil {
		return fmt.Errorf("allow anonymous admin: %w", err)
	}
	return nil
}

// OwnsSchema reports whether pool's login role owns Schema (or is a
// superuser): a node connected so could change the ledger outside its
// functions.
func OwnsSchema(ctx context.Context, pool *Pool) (bool, error) {
	var owns bool
	err := pool.QueryRow(ctx, `SELECT coalesce((SELECT pg_has_role(current_user, nspowner, 'USAGE')
		FROM pg_namespace WHERE nspname = $1), false) OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)`,
		Schema).Scan(&owns)
	if err != nil {
		return false, fmt.Errorf("check the owner of schema %s: %w", Schema, err)
	}
	return owns, nil
}

// InGroup reports whether the pool's login is a member of the database
// role group (fanout_app, fanout_worker, ...), directly or not.
func InGroup(ctx context.Context, pool *Pool, group string) (bool, error) {
	var in bool
	if err := pool.QueryRow(ctx, `SELECT pg_has_role(current_user, $1, 'USAGE')`, group).Scan(&in); err != nil {
		return false, fmt.Errorf("check whether this login is in %s: %w", group, err)
	}
	return in, nil
}
