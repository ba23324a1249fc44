// Package storetest gives each test a fresh PostgreSQL database cloned from a migrated template.
//
// A package using it sets the migration in TestMain:
//
//	func TestMain(m *testing.M) {
//		storetest.MigrateFunc = store.Migrate
//		storetest.Main(m)
//	}
//
// and calls NewDB in each test. The server is, in order of preference: the
// one named by FANOUT_TEST_SERVER_URL (set by a parent test process, see
// Env), the one named by TEST_DATABASE_URL, or a throwaway cluster started
// from the local server binaries (in FANOUT_PG_BINDIR if set) and removed
// by Main.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/store/pglocal"
)

// MigrateFunc migrates, when not nil, the template database at databaseURL
// that every NewDB database is cloned from. Set it in TestMain before
// calling Main. It is a variable rather than an import of store.Migrate
// because store's own tests use this package.
var MigrateFunc func(ctx context.Context, databaseURL string) error

const (
	envServerURL   = "FANOUT_TEST_SERVER_URL"
	envDatabaseURL = "TEST_DATABASE_URL"
	envBinDir      = "FANOUT_PG_BINDIR"

	noServerHint = "no PostgreSQL for tests: set TEST_DATABASE_URL=postgres://... " +
		"or install the server binaries: apt-get install -y postgresql"

	objectInUse = "55006" // SQLSTATE of CREATE DATABASE while the template has sessions.
)

var (
	serverOnce sync.Once
	adminURL   string
	serverErr  error
	cluster    *pglocal.Server // the throwaway cluster, if this process started one
	clusterDir string

	templateOnce sync.Once
	templateName string
	templateErr  error

	cloneMu sync.Mutex // serializes clones of the template
)

// Main runs the tests, then stops and removes the throwaway cluster if one
// was started, or drops the template database from a server it did not
// start. Call it from TestMain.
func Main(m *testing.M) {
	m.Run() // Its exit code is used when TestMain returns.
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "storetest: %v\n", err)
	}
}

func teardown() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	if cluster != nil {
		errs = append(errs, cluster.Stop(ctx))
	} else if templateName != "" {
		errs = append(errs, execSQL(ctx, adminURL, "DROP DATABASE IF EXISTS "+ident(templateName)))
	}
	if clusterDir != "" {
		errs = append(errs, os.RemoveAll(clusterDir))
	}
	return errors.Join(errs...)
}

// ServerURL returns the URL of database "postgres" on the server in use,
// starting a throwaway cluster if needed. It fails t if there is no server.
func ServerURL(t testing.TB) string {
	t.Helper()
	serverOnce.Do(func() { adminURL, serverErr = startServer() })
	switch {
	case errors.Is(serverErr, pglocal.ErrNoBinaries): // Its message says how to get them.
		t.Fatalf("no PostgreSQL for tests: %v", serverErr)
	case serverErr != nil:
		t.Fatalf("%s: %v", noServerHint, serverErr)
	}
	return adminURL
}

// Env returns the environment entries a child process running this test
// binary needs to use the same server instead of starting its own.
func Env(t testing.TB) []string {
	t.Helper()
	return []string{envServerURL + "=" + ServerURL(t)}
}

// NewDB returns the URL of a new database unique to t, cloned from the
// migrated template. The database is dropped when t passes and kept, with
// its name logged, when t fails.
func NewDB(t testing.TB) string {
	t.Helper()
	admin := ServerURL(t)
	templateOnce.Do(func() { templateName, templateErr = createTemplate(admin) })
	if templateErr != nil {
		t.Fatalf("create template database: %v", templateErr)
	}

	name := dbName(t.Name())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := clone(ctx, admin, templateName, name); err != nil {
		t.Fatalf("create test database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if cluster != nil {
				t.Logf("test database %s is removed with the throwaway cluster; set %s to keep it", name, envDatabaseURL)
			} else {
				t.Logf("kept test database %s for inspection", name)
			}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := execSQL(ctx, admin, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	u, err := withDatabase(admin, name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// startServer returns the admin URL of the server to use, starting a
// throwaway cluster if no server is configured.
func startServer() (string, error) {
	if u := os.Getenv(envServerURL); u != "" {
		return withDatabase(u, "postgres")
	}
	if u := os.Getenv(envDatabaseURL); u != "" {
		return withDatabase(u, "postgres")
	}
	dir, err := os.MkdirTemp("", "fanout-pg-")
	if err != nil {
		return "", fmt.Errorf("start throwaway cluster: %w", err)
	}
	clusterDir = dir
	// When we are root the cluster runs as another user, who must be able
	// to enter dir.
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", fmt.Errorf("start throwaway cluster: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := pglocal.Start(ctx, pglocal.Config{
		DataDir: filepath.Join(dir, "data"),
		BinDir:  os.Getenv(envBinDir),
		Fast:    true,
	})
	if err != nil {
		return "", err
	}
	cluster = s
	return s.URL("postgres"), nil
}

// createTemplate creates and migrates the template database. It returns
// the template's name even on error, once the database exists, so that
// Main can drop it.
func createTemplate(admin string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("fanout_tpl_%d_%06x", os.Getpid(), rand.N(1<<24))
	if err := execSQL(ctx, admin, "CREATE DATABASE "+ident(name)); err != nil {
		return "", fmt.Errorf("create %s: %w", name, err)
	}
	if MigrateFunc != nil {
		u, err := withDatabase(admin, name)
		if err != nil {
			return name, err
		}
		if err := MigrateFunc(ctx, u); err != nil {
			return name, fmt.Errorf("migrate %s: %w", name, err)
		}
	}
	// Cloning fails while anyone is connected to the template; keep them out.
	if err := execSQL(ctx, admin, "ALTER DATABASE "+ident(name)+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return name, fmt.Errorf("close %s to connections: %w", name, err)
	}
	return name, nil
}

// clone creates database name as a copy of template, retrying while the
// template is briefly in use (a session from the migration still closing).
func clone(ctx context.Context, admin, template, name string) error {
	cloneMu.Lock()
	defer cloneMu.Unlock()
	sql := "CREATE DATABASE " + ident(name) + " TEMPLATE " + ident(template)
	for attempt := 1; ; attempt++ {
		err := execSQL(ctx, admin, sql)
		var pgErr *pgconn.PgError
		if err == nil || attempt == 5 || !errors.As(err, &pgErr) || pgErr.Code != objectInUse {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
}

// execSQL runs one statement on a connection of its own. Statements like
// CREATE DATABASE cannot run in a transaction, and a pool would leave
// goroutines behind for goleak to report.
func execSQL(ctx context.Context, databaseURL, sql string) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, sql)
	return err
}

// The login roles the URL functions connect as, each a member of one
// group role and nothing else, as each kind of process logs in in
// production (docs/operations.md "Database roles").
const (
	NodeRole   = "fanout_node_test"   // an orchestrator: fanout_app
	WorkerRole = "fanout_worker_test" // a worker: fanout_worker
	AdminRole  = "fanout_admin_test"  // AdminService: fanout_admin
)

var (
	loginMu    sync.Mutex
	loginRoles = map[string]error{}
)

// NodeURL returns databaseURL (from NewDB) connecting as NodeRole instead of
// the owner, creating the role on the server the first time. Tests of nodes
// use it so that what a node does is what the node role may do.
func NodeURL(t testing.TB, databaseURL string) string {
	t.Helper()
	return loginURL(t, databaseURL, NodeRole, "fanout_app")
}

// WorkerURL is NodeURL for a worker: it logs in as WorkerRole.
func WorkerURL(t testing.TB, databaseURL string) string {
	t.Helper()
	return loginURL(t, databaseURL, WorkerRole, "fanout_worker")
}

// AdminURL is NodeURL for AdminService: it logs in as AdminRole.
func AdminURL(t testing.TB, databaseURL string) string {
	t.Helper()
	return loginURL(t, databaseURL, AdminRole, "fanout_admin")
}

// loginURL returns databaseURL logging in as login, a member of group only,
// creating the login on the server the first time.
func loginURL(t testing.TB, databaseURL, login, group string) string {
	t.Helper()
	loginMu.Lock()
	err, done := loginRoles[login]
	if !done {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = execSQL(ctx, ServerURL(t), `DO $$ BEGIN
			CREATE ROLE `+login+` LOGIN PASSWORD '`+login+`' IN ROLE `+group+`;
		EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$`)
		cancel()
		loginRoles[login] = err
	}
	loginMu.Unlock()
	if err != nil {
		t.Fatalf("create login role %s in %s (the template's migrations create the group): %v", login, group, err)
	}
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(login, login)
	return u.String()
}

// withDatabase returns rawURL with its database replaced by dbname.
func withDatabase(rawURL, dbname string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", errors.New("database URL is not of the form postgres://user@host:port/dbname")
	}
	u.Path, u.RawPath = "/"+dbname, ""
	return u.String(), nil
}

// dbName returns a new database name derived from testName, so that a kept
// database can be found: lowercase letters, digits and underscores, plus a
// random suffix.
func dbName(testName string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		switch {
		case 'a' <= r && r <= 'z', '0' <= r && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "_"):
			b.WriteByte('_')
		}
	}
	name := b.String()
	if len(name) > 48 { // Identifiers have at most 63 bytes.
		name = name[:48]
	}
	return fmt.Sprintf("%s_%06x", strings.TrimSuffix(name, "_"), rand.N(1<<24))
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// FreeAddr returns a loopback address nothing listens on (a port the
// kernel just handed out and that was closed again), for a process that
// must come up, or come back, at a known address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Querier is what CheckAttemptsApart reads with: a pool or a connection.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckAttemptsApart fails t if two reservations of different attempts on
// one account of the run were held at the same time, by their database
// times (from the reserve's to the resolution's): a task's attempts must
// never hold grants at once, also across a change of orchestrators. It
// returns how many (account, attempt) pairs reserved at all.
func CheckAttemptsApart(t testing.TB, db Querier, runID string) (attempts int) {
	t.Helper()
	var overlaps int
	var example string
	if err := db.QueryRow(context.Background(), `SELECT
		(SELECT count(DISTINCT (account_id, attempt)) FROM reservation WHERE run_id = $1),
		count(*), coalesce(min(format('account %s: attempt %s %s..%s and attempt %s %s..%s',
			r1.account_id, r1.attempt, r1.created_at, r1.resolved_at, r2.attempt, r2.created_at, r2.resolved_at)), '')
		FROM reservation r1 JOIN reservation r2
		  ON r1.account_id = r2.account_id AND r1.attempt < r2.attempt
		 AND tstzrange(r1.created_at, coalesce(r1.resolved_at, 'infinity')) &&
		     tstzrange(r2.created_at, coalesce(r2.resolved_at, 'infinity'))
		WHERE r1.run_id = $1`, runID).Scan(&attempts, &overlaps, &example); err != nil {
		t.Fatal(err)
	}
	if overlaps > 0 {
		t.Errorf("%d pairs of attempts of one account held reservations at the same time, e.g. %s", overlaps, example)
	}
	return attempts
}

// Actor returns how the admin log names whoever q is logged in as,
// "role:LOGIN": the only role actor an admin function accepts from that
// session (admin_check_actor).
func Actor(t testing.TB, q Querier) string {
	t.Helper()
	var who string
	if err := q.QueryRow(context.Background(), "SELECT 'role:' || session_user").Scan(&who); err != nil {
		t.Fatalf("read the session's role: %v", err)
	}
	return who
}

// Background runs run (a Notifier's Run, say) on its own goroutine until
// the test ends, then cancels its context and waits for it to return.
func Background(t testing.TB, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = run(ctx) // its error after cancel is the cancel's
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}
