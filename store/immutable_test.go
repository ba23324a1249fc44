package store_test

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/fanout/fanout/store"
)

var updateSums = flag.Bool("update-migration-sums", false,
	"add the lines of new versioned migrations to migrations/versioned.sum (never changes a line that is there)")

// TestVersionedMigrationsAreImmutable: a versioned migration, once on
// main, is never edited, not even its comments: a database that applied
// it refuses to migrate on a changed checksum (store.Apply). Each file's
// checksum (as store.Apply computes it) is recorded in
// migrations/versioned.sum when the migration is added; a file whose bytes
// changed since fails here, before any database sees it.
func TestVersionedMigrationsAreImmutable(t *testing.T) {
	const path = "../migrations/versioned.sum"
	raw, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	recorded := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if name, sum, ok := strings.Cut(line, " "); ok {
			recorded[name] = sum
		}
	}
	ms, err := store.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var added []string
	for _, m := range ms {
		name := fmt.Sprintf("%04d_%s.sql", m.Version, m.Name)
		sum := sha256.Sum256([]byte(m.SQL))
		got := hex.EncodeToString(sum[:8])
		switch want, ok := recorded[name]; {
		case !ok && *updateSums:
			added = append(added, name+" "+got)
		case !ok:
			t.Errorf("migrations/versioned/%s is not in migrations/versioned.sum: run go test ./store -run TestVersionedMigrationsAreImmutable -update-migration-sums", name)
		case want != got:
			t.Errorf("migrations/versioned/%s changed (checksum %s, recorded %s): a database that applied it refuses to migrate; restore it and add a new migration instead",
				name, got, want)
		}
	}
	if len(added) > 0 {
		out := strings.TrimSpace(string(raw))
		if out != "" {
			out += "\n"
		}
		if err := os.WriteFile(path, []byte(out+strings.Join(added, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
