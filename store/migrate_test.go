package store_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/fanout/fanout/store"
)

// TestMigrateTwiceAppliesNothing: a migrated database is left alone, and
// several nodes migrating at once wait on the advisory lock.
func TestMigrateTwiceAppliesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done, err := store.Apply(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	if len(done.Versions) > 0 || done.Redefined || len(done.Changed) > 0 || len(done.Dropped) > 0 {
		t.Errorf("migrating a migrated database did %+v, want nothing", done)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := store.Migrate(b.ctx, b.url); err != nil {
				t.Errorf("concurrent migrate: %v", err)
			}
		}()
	}
	wg.Wait()
}

// TestMigrateRefusesAChangedMigration: editing an applied versioned
// migration is caught with a message that says what to do, instead of a
// schema that silently differs from the code.
func TestMigrateRefusesAChangedMigration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tag, err := b.pool.Exec(b.ctx, "UPDATE public.schema_migration SET checksum = 'edited' WHERE version = $1 AND name = 'baseline'", store.Baseline)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("mark the baseline edited: %v, %d rows", err, tag.RowsAffected())
	}
	err = store.Migrate(b.ctx, b.url)
	if err == nil || !strings.Contains(err.Error(), "versioned/0021_baseline.sql changed after it was applied") {
		t.Fatalf("err = %v, want the changed migration named", err)
	}
}

// TestMigrateRefusesSchemasBeforeTheBaseline: a database that an earlier
// release left below version 21 is not half-upgraded: it is refused,
// naming its version and the way forward, and nothing is written.
func TestMigrateRefusesSchemasBeforeTheBaseline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM public.schema_migration;
		INSERT INTO public.schema_migration (version, name, checksum)
		SELECT v, 'old', 'x' FROM generate_series(1, 19) v`); err != nil {
		t.Fatal(err)
	}
	err := store.Migrate(b.ctx, b.url)
	if err == nil || !strings.Contains(err.Error(), "at schema version 19") ||
		!strings.Contains(err.Error(), "version 21 or later") || !strings.Contains(err.Error(), "docs/operations.md") {
		t.Fatalf("err = %v, want the database's version, the minimum and where to read how", err)
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM public.schema_migration WHERE version > 19").Scan(&n); err != nil || n != 0 {
		t.Errorf("versions above 19 after the refusal: %d, %v", n, err)
	}
}
