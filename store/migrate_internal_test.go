package store

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/migrations"
	"github.com/fanout/fanout/store/storetest"
)

// editableMigrations is a copy of the embedded migrations that a test may
// change, as a later (or earlier) release's files would differ.
func editableMigrations(t *testing.T) fstest.MapFS {
	t.Helper()
	out := fstest.MapFS{}
	err := fs.WalkDir(migrations.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, p)
		out[p] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// edit replaces old with new in the file at p, which must contain it.
func edit(t *testing.T, fsys fstest.MapFS, p, old, new string) {
	t.Helper()
	s := string(fsys[p].Data)
	if !strings.Contains(s, old) {
		t.Fatalf("%s does not contain %q", p, old)
	}
	fsys[p] = &fstest.MapFile{Data: []byte(strings.Replace(s, old, new, 1))}
}

type catalog struct {
	t    *testing.T
	ctx  context.Context
	conn *pgx.Conn
}

// newCatalog returns a fresh migrated database's URL and a connection to
// it, closed when t ends.
func newCatalog(t *testing.T) (catalog, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	url := storetest.NewDB(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	return catalog{t: t, ctx: ctx, conn: conn}, url
}

func (c catalog) is(query string, args ...any) bool {
	c.t.Helper()
	var b bool
	if err := c.conn.QueryRow(c.ctx, query, args...).Scan(&b); err != nil {
		c.t.Fatalf("%s: %v", query, err)
	}
	return b
}

func (c catalog) function(sig string) bool {
	return c.is("SELECT to_regprocedure($1) IS NOT NULL", "fanout."+sig)
}

// TestDefinitionsFollowTheFiles: the definitions step makes the database's
// functions, triggers, views and function grants exactly what the files
// say, whichever way they changed — a file removed, a signature changed (the
// old overload must not stay callable), a trigger or a grant taken out —
// and back again.
func TestDefinitionsFollowTheFiles(t *testing.T) {
	t.Parallel()
	c, url := newCatalog(t)
	ctx := c.ctx

	const (
		priceSet  = "price_set(text,text,timestamp with time zone,numeric,numeric,text,text)"
		oldCheck  = "admin_check_tenant_id(text)"
		newCheck  = "admin_check_tenant_id(text,integer)"
		renew     = "semaphore_renew(bigint,text,interval)"
		truncate  = "SELECT EXISTS (SELECT FROM pg_trigger WHERE tgname = 'ledger_entry_no_truncate')"
		openView  = "SELECT to_regclass('fanout.open_reservations') IS NOT NULL"
		appRenews = "SELECT has_function_privilege('fanout_app', 'fanout." + renew + "', 'EXECUTE')"
	)
	if !c.function(priceSet) || !c.function(oldCheck) || c.function(newCheck) || !c.is(truncate) || !c.is(openView) || !c.is(appRenews) {
		t.Fatal("the migrated database is not as the files say before the test changes them")
	}

	other := editableMigrations(t)
	delete(other, "functions/price_set.sql")
	delete(other, "views/open_reservations.sql")
	edit(t, other, "functions/admin_check_tenant_id.sql", "(p_tenant text)", "(p_tenant text, p_spare integer DEFAULT 0)")
	for range 2 { // its REVOKE and its GRANT
		edit(t, other, "functions/admin_check_tenant_id.sql", "admin_check_tenant_id(text)", "admin_check_tenant_id(text, integer)")
	}
	edit(t, other, "functions/ledger_entry_append_only.sql", "CREATE OR REPLACE TRIGGER ledger_entry_no_truncate", "-- CREATE OR REPLACE TRIGGER ledger_entry_no_truncate")
	edit(t, other, "functions/ledger_entry_append_only.sql", "    FOR EACH STATEMENT EXECUTE", "--    FOR EACH STATEMENT EXECUTE")
	edit(t, other, "functions/semaphore_renew.sql", "GRANT EXECUTE", "-- GRANT EXECUTE")

	done, err := apply(ctx, url, other)
	if err != nil {
		t.Fatalf("apply the changed files: %v", err)
	}
	wantDropped := []string{"function " + oldCheck, "function " + priceSet,
		"trigger ledger_entry_no_truncate on ledger_entry"}
	for _, w := range wantDropped {
		if !slices.Contains(done.Dropped, w) {
			t.Errorf("Dropped = %q, want it to name %q", done.Dropped, w)
		}
	}
	if !done.Redefined || !slices.Contains(done.Changed, "functions/semaphore_renew.sql") {
		t.Errorf("Applied = %+v, want the step run and semaphore_renew.sql named changed", done)
	}
	if c.function(priceSet) || c.function(oldCheck) || !c.function(newCheck) || c.is(truncate) || c.is(openView) || c.is(appRenews) {
		t.Error("after the changed files: a function, overload, trigger, view or grant that no file defines any more is still there")
	}

	// And back: the embedded files restore everything and drop the overload.
	done, err = apply(ctx, url, migrations.FS)
	if err != nil {
		t.Fatalf("apply the embedded files again: %v", err)
	}
	if !c.function(priceSet) || !c.function(oldCheck) || c.function(newCheck) || !c.is(truncate) || !c.is(openView) || !c.is(appRenews) {
		t.Error("after the embedded files again: the database is not as they say")
	}
	if !slices.Contains(done.Dropped, "function "+newCheck) {
		t.Errorf("Dropped = %q, want the overload no file defines", done.Dropped)
	}

	// One file edited, nothing else: the next migrate applies it.
	one := editableMigrations(t)
	edit(t, one, "functions/ledger_renew.sql", "AS $$", "AS $$\n-- edited")
	if done, err = apply(ctx, url, one); err != nil {
		t.Fatal(err)
	}
	if !done.Redefined || !slices.Equal(done.Changed, []string{"functions/ledger_renew.sql"}) ||
		!c.is("SELECT prosrc LIKE '%-- edited%' FROM pg_proc WHERE oid = 'fanout.ledger_renew(bigint,bigint,interval,text)'::regprocedure") {
		t.Errorf("one edited file: Applied = %+v; want it applied and named", done)
	}
}

// TestDefinitionsAreAllOrNothing: a definition file that fails leaves the
// database as it was — every view still there, nothing recorded — and the
// error names the file.
func TestDefinitionsAreAllOrNothing(t *testing.T) {
	t.Parallel()
	c, url := newCatalog(t)
	ctx, conn := c.ctx, c.conn

	const views = "SELECT count(*) FROM pg_class WHERE relnamespace = 'fanout'::regnamespace AND relkind = 'v'"
	var before, after int
	if err := conn.QueryRow(ctx, views).Scan(&before); err != nil || before == 0 {
		t.Fatalf("views before: %d, %v", before, err)
	}
	broken := editableMigrations(t)
	edit(t, broken, "views/tool_calls.sql", "FROM tool_call", "FROM no_such_table")
	edit(t, broken, "functions/ledger_renew.sql", "AS $$", "AS $$\n-- changed")
	_, err := apply(ctx, url, broken)
	if err == nil || !strings.Contains(err.Error(), "views/tool_calls.sql") {
		t.Fatalf("err = %v, want the broken file named", err)
	}
	if err := conn.QueryRow(ctx, views).Scan(&after); err != nil || after != before {
		t.Errorf("views after a failed definitions step: %d (%v), before: %d", after, err, before)
	}
	if !c.is("SELECT prosrc NOT LIKE '%-- changed%' FROM pg_proc WHERE oid = 'fanout.ledger_renew(bigint,bigint,interval,text)'::regprocedure") {
		t.Error("a failed definitions step left a function changed")
	}
	done, err := apply(ctx, url, migrations.FS)
	if err != nil || done.Redefined {
		t.Errorf("after the failure, the embedded files: %+v, %v; want nothing to do (nothing was recorded)", done, err)
	}
}

// TestVersionedMigrationRedefines: after a versioned migration the
// definitions are applied again even though no file of theirs changed, so a
// migration may drop what a table change needs out of the way (here a view)
// and find it back.
func TestVersionedMigrationRedefines(t *testing.T) {
	t.Parallel()
	c, url := newCatalog(t)
	ctx := c.ctx

	all, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	v := all[len(all)-1].Version + 1
	next := editableMigrations(t)
	next[fmt.Sprintf("versioned/%04d_next.sql", v)] = &fstest.MapFile{Data: []byte(`DROP VIEW fanout.tool_calls;
		ALTER TABLE fanout.tool_call ALTER COLUMN server SET DEFAULT ''`)}
	done, err := apply(ctx, url, next)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(done.Versions, []int{v}) || !done.Redefined || len(done.Changed) != 0 {
		t.Errorf("Applied = %+v, want version %d and the definitions applied again with no file changed", done, v)
	}
	if !c.is("SELECT to_regclass('fanout.tool_calls') IS NOT NULL") {
		t.Error("the view the versioned migration dropped was not defined again")
	}
	if !c.is("SELECT coalesce('security_invoker=true' = ANY (reloptions), false) FROM pg_class WHERE oid = 'fanout.tool_calls'::regclass") {
		t.Error("audit_refresh did not run after the view was defined again: tool_calls is not security_invoker")
	}
}
