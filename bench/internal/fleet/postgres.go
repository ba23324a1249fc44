package fleet

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/pglocal"
)

// Database is a bench's private PostgreSQL: one database for fanout
// (migrated; nodes log in as a member of fanout_app, as under `fanout dev`)
// and any others the bench asked for.
type Database struct {
	OwnerURL, NodeURL string
	// Others are the URLs of the other databases, by name.
	Others   map[string]string
	Settings string // server version and durability settings, as the server reports them
	// PIDFile holds the postmaster's pid on its first line.
	PIDFile string
	Stop    func()
}

// StartPostgres starts a PostgreSQL in dir (from the local server binaries
// in binDir, or found) and sets its databases up: fanout's with the schema
// of fanoutBin (`fanout migrate`: a binary of another commit is measured on
// its own schema), and an empty one per name of others. Durable: fsync,
// synchronous_commit and full_page_writes keep their defaults (on), which
// it checks.
func StartPostgres(ctx context.Context, dir, binDir, fanoutBin string, others ...string) (*Database, error) {
	logFile, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return nil, err
	}
	srv, err := pglocal.Start(ctx, pglocal.Config{DataDir: filepath.Join(dir, "pg"), BinDir: binDir, Log: logFile})
	if err != nil {
		_ = logFile.Close()
		return nil, err
	}
	db := &Database{PIDFile: filepath.Join(dir, "pg", "postmaster.pid"), Others: map[string]string{}, Stop: func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		}
		_ = logFile.Close()
	}}
	if err := db.setup(ctx, srv, fanoutBin, others); err != nil {
		db.Stop()
		return nil, err
	}
	return db, nil
}

func (db *Database) setup(ctx context.Context, srv *pglocal.Server, fanoutBin string, others []string) error {
	for _, name := range append([]string{"fanout"}, others...) {
		if err := store.CreateDatabase(ctx, srv.URL("postgres"), name); err != nil {
			return err
		}
		db.Others[name] = srv.URL(name)
	}
	db.OwnerURL = srv.URL("fanout")
	delete(db.Others, "fanout")
	migrate := exec.CommandContext(ctx, fanoutBin, "migrate", "--database-url", db.OwnerURL)
	migrate.Env = ChildEnv()
	if out, err := migrate.CombinedOutput(); err != nil {
		return fmt.Errorf("%s migrate: %w: %s", fanoutBin, err, strings.TrimSpace(string(out)))
	}
	if err := store.CreateLoginRole(ctx, db.OwnerURL, "fanout_node", "fanout_app"); err != nil {
		return err
	}
	var err error
	if db.NodeURL, err = roleURL(db.OwnerURL, "fanout_node"); err != nil {
		return err
	}
	pool, err := store.Open(ctx, db.OwnerURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	var version, fsync, syncCommit, fpw string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('full_page_writes')`).Scan(&version, &fsync, &syncCommit, &fpw); err != nil {
		return fmt.Errorf("read durability settings: %w", err)
	}
	if fsync != "on" || syncCommit != "on" || fpw != "on" {
		return fmt.Errorf("postgres is not durable: fsync=%s synchronous_commit=%s full_page_writes=%s", fsync, syncCommit, fpw)
	}
	db.Settings = fmt.Sprintf("PostgreSQL %s (fsync=%s, synchronous_commit=%s, full_page_writes=%s)", version, fsync, syncCommit, fpw)
	return nil
}

// Postmaster is the pid of the server's postmaster, from its pid file.
func (db *Database) Postmaster() (int, error) { return PIDFromFile(db.PIDFile) }

// PIDFromFile is the pid on the first line of a pid file (PostgreSQL's
// postmaster.pid).
func PIDFromFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(first))
}

// roleURL returns ownerURL logging in as role.
func roleURL(ownerURL, role string) (string, error) {
	u, err := url.Parse(ownerURL)
	if err != nil {
		return "", err
	}
	u.User = url.User(role)
	return u.String(), nil
}

// TempDir makes the bench's temporary directory under parent (the
// system's if empty), which PostgreSQL, running as an unprivileged user
// under root, can enter; it warns on tmpfs, where fsync costs nothing.
func TempDir(parent, pattern string) (string, error) {
	tmp, err := os.MkdirTemp(parent, pattern)
	if err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	var st syscall.Statfs_t
	if syscall.Statfs(tmp, &st) == nil && st.Type == 0x01021994 { // TMPFS_MAGIC
		fmt.Fprintf(os.Stderr, "bench: warning: %s is on tmpfs, where fsync costs nothing; use -tmp-dir on a disk for a durable PostgreSQL\n", tmp)
	}
	return tmp, nil
}

// LoadAverage is the first three fields of /proc/loadavg, or "?".
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}
