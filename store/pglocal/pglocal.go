// Package pglocal runs a private PostgreSQL cluster from the local server binaries.
package pglocal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoBinaries is returned (wrapped) by FindBinDir and Start when the
// PostgreSQL server binaries cannot be found.
var ErrNoBinaries = errors.New("postgresql server binaries (initdb, pg_ctl, postgres) not found: " +
	"install them with `apt-get install -y postgresql` (Debian/Ubuntu, as root), " +
	"or set TEST_DATABASE_URL / --database-url to an existing server")

// Config configures Start. The zero value of every field but DataDir is a
// usable default.
type Config struct {
	// DataDir is the cluster directory. It is initialized with initdb if it
	// holds no PG_VERSION file and reused otherwise. Required.
	DataDir string

	// BinDir holds initdb, pg_ctl and postgres. If empty, FindBinDir("")
	// picks one.
	BinDir string

	// Port is the TCP port on 127.0.0.1. If zero, a free port is picked.
	Port int

	// OSUser is the user the cluster runs as when the current process is
	// root, because initdb and postgres refuse to run as root. If empty,
	// "postgres" is used if that user exists, else "nobody". Ignored when
	// not root.
	OSUser string

	// Log receives the server log. If nil, the log is appended to a file
	// named server.log next to DataDir.
	Log io.Writer

	// Fast turns off durability (fsync, synchronous_commit,
	// full_page_writes) for throwaway test clusters. A crash may corrupt
	// the cluster.
	Fast bool

	// Conf is more postgresql.conf lines, written after the others on
	// every start (e.g. synchronous_standby_names for a primary,
	// cluster_name for a standby: its walreceiver's application_name).
	// A standby made by StartStandby does not inherit its primary's.
	Conf string
}

// Server is a running cluster started by Start.
type Server struct {
	dataDir string
	binDir  string
	port    int
	cred    *syscall.Credential // nil unless running as root
	killed  bool                // Kill ran: Stop has nothing to stop

	log      io.Writer     // server log destination
	closeLog func() error  // closes log if Start opened it
	tail     *tailBuffer   // recent server output, for error messages
	logDone  chan struct{} // closed when the server's output is drained
}

// Start starts a cluster as described by cfg and waits until it accepts
// connections. The caller must call Stop; the server is a separate
// (daemonized) process and outlives the caller otherwise.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("start postgres: empty data dir")
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	binDir, err := FindBinDir(cfg.BinDir)
	if err != nil {
		return nil, err
	}
	s := &Server{dataDir: dataDir, binDir: binDir, tail: new(tailBuffer)}
	if os.Geteuid() == 0 {
		if s.cred, err = lookupCredential(cfg.OSUser); err != nil {
			return nil, err
		}
	}

	if _, err := os.Stat(filepath.Join(dataDir, "PG_VERSION")); err == nil {
		if err := removeStalePID(dataDir); err != nil {
			return nil, err
		}
	} else if err := s.initdb(ctx); err != nil {
		return nil, err
	}
	if err := s.openLog(cfg.Log); err != nil {
		return nil, err
	}

	// A picked port can be taken before postgres binds it; pick again.
	for attempt := 1; ; attempt++ {
		s.port = cfg.Port
		if s.port == 0 {
			if s.port, err = freePort(); err != nil {
				break
			}
		}
		err = s.start(ctx, cfg.Fast, cfg.Conf)
		if err == nil || cfg.Port != 0 || attempt == 3 || !strings.Contains(err.Error(), "already in use") {
			break
		}
	}
	if err != nil {
		_ = s.closeLog()
		return nil, err
	}
	if err := waitReady(ctx, s.URL("postgres")); err != nil {
		err = fmt.Errorf("wait for postgres in %s: %w", dataDir, err)
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return nil, errors.Join(err, s.Stop(stopCtx))
	}
	return s, nil
}

// URL returns the URL of database dbname on s as the superuser "postgres".
func (s *Server) URL(dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, dbname)
}

// Port returns the TCP port s listens on.
func (s *Server) Port() int { return s.port }

// Stop stops s with a fast shutdown (open sessions are disconnected) and
// waits for it to exit.
func (s *Server) Stop(ctx context.Context) error {
	if s.killed {
		return s.closeLog()
	}
	out, err := s.command(ctx, "pg_ctl", "stop", "-D", s.dataDir, "-m", "fast", "-w", "-s").CombinedOutput()
	if err != nil {
		return fmt.Errorf("stop postgres in %s: %w: %s", s.dataDir, err, out)
	}
	select {
	case <-s.logDone:
	case <-ctx.Done():
		return fmt.Errorf("stop postgres in %s: drain log: %w", s.dataDir, context.Cause(ctx))
	}
	return s.closeLog()
}

// FindBinDir returns the directory holding initdb, pg_ctl and postgres.
// A non-empty hint is checked and returned as is. Otherwise it tries the
// directory of pg_ctl on PATH, then /usr/lib/postgresql/*/bin (highest
// version first), then /usr/local/pgsql/bin. The error wraps ErrNoBinaries
// if none has them.
func FindBinDir(hint string) (string, error) {
	if hint != "" {
		if !hasBinaries(hint) {
			return "", fmt.Errorf("find postgres binaries in %s: %w", hint, ErrNoBinaries)
		}
		return hint, nil
	}
	var dirs []string
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	versioned, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(versioned, func(a, b string) int {
		return -compareVersions(filepath.Base(filepath.Dir(a)), filepath.Base(filepath.Dir(b)))
	})
	dirs = append(dirs, versioned...)
	dirs = append(dirs, "/usr/local/pgsql/bin")
	for _, d := range dirs {
		if hasBinaries(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("find postgres binaries: %w", ErrNoBinaries)
}

func hasBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

// compareVersions compares dotted versions like "9.6" and "15" numerically.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

// lookupCredential returns the credential of the unprivileged user the
// cluster runs as when we are root.
func lookupCredential(name string) (*syscall.Credential, error) {
	var u *user.User
	var err error
	if name != "" {
		u, err = user.Lookup(name)
	} else if u, err = user.Lookup("postgres"); err != nil {
		u, err = user.Lookup("nobody")
	}
	if err != nil {
		return nil, fmt.Errorf("look up user to run postgres as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q: %w", u.Username, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: gid %q: %w", u.Username, u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// command returns a command running binary name from s.binDir as the
// cluster's OS user.
func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, name), args...)
	// The OS user may not be able to enter our working directory.
	cmd.Dir = s.dataDir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// chown gives path to the cluster's OS user, if it is not us.
func (s *Server) chown(path string) error {
	if s.cred == nil {
		return nil
	}
	return os.Chown(path, int(s.cred.Uid), int(s.cred.Gid))
}

// initdb creates the data directory and initializes a cluster in it.
func (s *Server) initdb(ctx context.Context) error {
	dir := s.dataDir
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("initdb %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("initdb %s: %w", dir, err)
	}
	if err := s.chown(dir); err != nil {
		return fmt.Errorf("initdb %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("initdb %s: %w", dir, err)
	}
	if err := s.checkTraversable(); err != nil {
		return fmt.Errorf("initdb %s: %w", dir, err)
	}
	out, err := s.command(ctx, "initdb", "-D", dir, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-locale", "--no-sync", "--no-instructions").CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb %s: %w: %s", dir, err, tail(out))
	}
	// Settings that change per start live in fanout.conf, rewritten by start.
	f, err := os.OpenFile(filepath.Join(dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("initdb %s: %w", dir, err)
	}
	_, err = io.WriteString(f, "\ninclude_if_exists 'fanout.conf'\n")
	if err := errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("initdb %s: %w", dir, err)
	}
	return nil
}

// checkTraversable reports an error naming the first parent of the data
// directory that the cluster's OS user cannot enter.
func (s *Server) checkTraversable() error {
	if s.cred == nil {
		return nil
	}
	for d := filepath.Dir(s.dataDir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		bit := fs.FileMode(0o001)
		switch {
		case st.Uid == s.cred.Uid:
			bit = 0o100
		case st.Gid == s.cred.Gid:
			bit = 0o010
		}
		if fi.Mode().Perm()&bit == 0 {
			return fmt.Errorf("directory %s is not traversable by uid %d, which postgres runs as; chmod o+x it or use another directory", d, s.cred.Uid)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// removeStalePID removes postmaster.pid left behind by a crashed server,
// which would otherwise block a restart if its pid has been reused.
func removeStalePID(dataDir string) error {
	path := filepath.Join(dataDir, "postmaster.pid")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("check %s: %w", path, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && pid > 0 && postmasterRunning(pid, dataDir) {
		return fmt.Errorf("start postgres in %s: already running as pid %d (stop it with pg_ctl stop -D %s)", dataDir, pid, dataDir)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove stale %s: %w", path, err)
	}
	return nil
}

// postmasterRunning reports whether pid is a postmaster serving dataDir.
// A postmaster's working directory is its data directory.
func postmasterRunning(pid int, dataDir string) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false // ESRCH: gone; EPERM: not ours, so not our postmaster either.
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return true // Cannot tell; err on the side of not starting twice.
	}
	real, err := filepath.EvalSymlinks(dataDir)
	return err != nil || cwd == real
}

// openLog opens the destination of the server log: w, or server.log next
// to the data directory if w is nil.
func (s *Server) openLog(w io.Writer) error {
	s.closeLog = func() error { return nil }
	if w == nil {
		path := filepath.Join(filepath.Dir(s.dataDir), "server.log")
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("open postgres log: %w", err)
		}
		w, s.closeLog = f, f.Close
	}
	s.log = w
	return nil
}

// start writes fanout.conf and starts the server with pg_ctl.
func (s *Server) start(ctx context.Context, fast bool, extra string) error {
	sockDir := filepath.Join(s.dataDir, "socket")
	if err := os.Mkdir(sockDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("start postgres in %s: %w", s.dataDir, err)
	}
	if err := s.chown(sockDir); err != nil {
		return fmt.Errorf("start postgres in %s: %w", s.dataDir, err)
	}
	conf := fmt.Sprintf(`# Written by fanout on every start; edits are lost.
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
max_connections = 300
`, s.port, strings.ReplaceAll(sockDir, "'", "''"))
	if fast {
		conf += "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
	}
	conf += extra + "\n"
	confPath := filepath.Join(s.dataDir, "fanout.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return fmt.Errorf("start postgres in %s: %w", s.dataDir, err)
	}
	if err := s.chown(confPath); err != nil {
		return fmt.Errorf("start postgres in %s: %w", s.dataDir, err)
	}

	return s.pgCtl(ctx, "start", "-D", s.dataDir, "-w", "-s")
}

// pgCtl runs pg_ctl with args (start or restart) and waits for it. The
// server inherits pg_ctl's output. It goes through a pipe, not straight to
// s.log, so that it also feeds s.tail for error messages; the copy ends
// when the server exits.
func (s *Server) pgCtl(ctx context.Context, args ...string) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("%s postgres in %s: %w", args[0], s.dataDir, err)
	}
	logDone := make(chan struct{})
	s.logDone = logDone
	go func() {
		defer close(logDone)
		defer func() { _ = pr.Close() }()
		_, _ = io.Copy(io.MultiWriter(s.tail, s.log), pr)
	}()
	cmd := s.command(ctx, "pg_ctl", args...)
	cmd.Stdout, cmd.Stderr = pw, pw
	err = cmd.Run()
	_ = pw.Close()
	if err != nil {
		select {
		case <-logDone: // The server exited; the tail is complete.
		case <-time.After(5 * time.Second):
		}
		return fmt.Errorf("%s postgres in %s: %w: %s", args[0], s.dataDir, err, s.tail)
	}
	return nil
}

// Restart restarts s as `pg_ctl restart -m fast` does (open sessions are
// disconnected, in-flight transactions roll back) on the same port, and
// waits until it accepts connections again. It is how fault tests restart
// a database under load.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.pgCtl(ctx, "restart", "-D", s.dataDir, "-m", "fast", "-w", "-s"); err != nil {
		return err
	}
	if err := waitReady(ctx, s.URL("postgres")); err != nil {
		return fmt.Errorf("wait for postgres in %s after restart: %w", s.dataDir, err)
	}
	return nil
}

// waitReady waits until the server at url answers a ping.
func waitReady(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(ctx)
			if err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a port for postgres: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tailBuffer keeps the last few kilobytes written to it.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

const tailSize = 4 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if n := len(t.b) - tailSize; n > 0 {
		t.b = append(t.b[:0], t.b[n:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(tail(t.b))
}

// tail returns the last lines of out, trimmed.
func tail(out []byte) []byte {
	out = []byte(strings.TrimSpace(string(out)))
	if len(out) > 2<<10 {
		out = out[len(out)-2<<10:]
	}
	return out
}
