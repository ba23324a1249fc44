package pglocal_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/store/pglocal"
)

func TestStartStopRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// t.TempDir's parent is private to us; the cluster may run as another
	// user when we are root.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	cfg := pglocal.Config{DataDir: filepath.Join(dir, "data"), Fast: true, Log: new(syncBuffer)}

	for _, run := range []string{"init", "reuse"} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		start := time.Now()
		srv, err := pglocal.Start(ctx, cfg)
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", run, err)
		}
		t.Logf("%s: started on port %d in %v", run, srv.Port(), time.Since(start).Round(time.Millisecond))

		conn, err := pgx.Connect(ctx, srv.URL("postgres"))
		if err != nil {
			t.Fatalf("%s: connect: %v", run, err)
		}
		var one int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Errorf("%s: SELECT 1 = %d, %v", run, one, err)
		}
		_ = conn.Close(ctx)

		if err := srv.Stop(ctx); err != nil {
			t.Fatalf("%s: %v", run, err)
		}
		cancel()

		// A crash leaves postmaster.pid behind, and its pid may be reused by
		// another process, here this one.
		pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
		if err := os.WriteFile(filepath.Join(cfg.DataDir, "postmaster.pid"), pid, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Contains(cfg.Log.(*syncBuffer).Bytes(), []byte("database system is ready")) {
		t.Errorf("server log lacks the ready message:\n%s", cfg.Log.(*syncBuffer).Bytes())
	}
}

func TestStartUntraversable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir() // Mode 0700 parent, owned by whoever runs the test.
	srv, err := pglocal.Start(t.Context(), pglocal.Config{DataDir: filepath.Join(dir, "data"), Fast: true})
	if os.Geteuid() != 0 {
		// Not root: the server runs as us, and the private dir is ours.
		if err != nil {
			t.Fatalf("Start as the owner of a private dir: %v", err)
		}
		if err := srv.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
		return
	}
	// Root runs postgres as another user, who cannot pass a 0700 root dir.
	if err == nil || !strings.Contains(err.Error(), filepath.Dir(dir)) {
		t.Errorf("Start under an untraversable dir: err = %v, want one naming %s", err, filepath.Dir(dir))
	}
}

func TestFindBinDir(t *testing.T) {
	t.Parallel()
	if _, err := pglocal.FindBinDir(t.TempDir()); err == nil {
		t.Errorf("FindBinDir(empty dir) succeeded")
	}
	if _, err := pglocal.FindBinDir(""); err != nil {
		t.Errorf("FindBinDir: %v", err)
	}
}

// syncBuffer is a bytes.Buffer safe for the server's log copier and the
// test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.b.Bytes())
}
