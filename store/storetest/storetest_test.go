package storetest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/store/storetest"
)

func TestMain(m *testing.M) {
	storetest.MigrateFunc = func(ctx context.Context, databaseURL string) error {
		conn, err := pgx.Connect(ctx, databaseURL)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close(ctx) }()
		_, err = conn.Exec(ctx, "CREATE TABLE probe (id int PRIMARY KEY)")
		return err
	}
	storetest.Main(m)
}

func TestNewDB(t *testing.T) {
	t.Parallel()
	urls := make([]string, 2)
	t.Run("group", func(t *testing.T) {
		for i := range urls {
			t.Run("Same/Name", func(t *testing.T) {
				t.Parallel()
				urls[i] = storetest.NewDB(t)
				if !strings.Contains(urls[i], "/testnewdb_group_same_name_") {
					t.Errorf("NewDB = %s, want a database named after the test", urls[i])
				}
				useDB(t, urls[i])
			})
		}
	})
	if urls[0] != "" && urls[0] == urls[1] {
		t.Errorf("two tests got the same database %s", urls[0])
	}
}

// TestChildProcess checks that a child test process uses its parent's
// server, found through storetest.Env.
func TestChildProcess(t *testing.T) {
	t.Parallel()
	if os.Getenv("STORETEST_CHILD") != "" {
		useDB(t, storetest.NewDB(t))
		if got, want := storetest.ServerURL(t), os.Getenv("FANOUT_TEST_SERVER_URL"); got != want {
			t.Errorf("child ServerURL = %s, want parent's %s", got, want)
		}
		return
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestChildProcess$", "-test.v")
	cmd.Env = append(append(os.Environ(), "STORETEST_CHILD=1"), storetest.Env(t)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// useDB checks that the template's probe table was cloned and that the
// database is writable.
func useDB(t *testing.T, databaseURL string) {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "INSERT INTO probe VALUES (1)"); err != nil {
		t.Errorf("insert into probe from template: %v", err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE mine (id int)"); err != nil {
		t.Errorf("create table: %v", err)
	}
}
