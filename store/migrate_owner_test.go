package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestMigrateNamesTheOwnersMissingPrivilege (issue 40): migrating a new
// database as an owner without CREATEROLE is refused before anything is
// written, naming the privilege, the groups it is for and the statement
// that grants it. Once granted, the same role (no superuser: the
// database's owner with CREATEROLE, as docs/operations.md says) migrates
// the database to the current schema. In a database it does not own, the
// CREATE privileges it lacks there are named too.
func TestMigrateNamesTheOwnersMissingPrivilege(t *testing.T) {
	t.Parallel()
	storetest.NewDB(t) // the template's migration makes fanout's groups: this owner makes none
	admin := connectConn(t, storetest.ServerURL(t))
	suffix := fmt.Sprintf("%06x", rand.N(1<<24))
	role, db := "owner_"+suffix, "owner_db_"+suffix
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD '" + role + "' NOSUPERUSER NOCREATEROLE NOCREATEDB",
		"CREATE DATABASE " + db + " OWNER " + role + " TEMPLATE template0",
	} {
		if _, err := admin.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", db, err)
		}
		if _, err := admin.Exec(ctx, "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	u, err := url.Parse(storetest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	adminOnDB := u.String()
	u.User = url.UserPassword(role, role)
	owner := u.String()

	_, err = store.Apply(t.Context(), owner)
	if err == nil {
		t.Fatal("migrate as an owner without CREATEROLE succeeded; want refused")
	}
	t.Logf("the refusal: %v", err)
	for _, want := range []string{"CREATEROLE", "ALTER ROLE " + role + " CREATEROLE", "fanout_app", "versioned/0021_baseline.sql", "Database roles"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("migrate as an owner without CREATEROLE: %v; want it to name %q", err, want)
		}
	}
	var written bool
	ownerDB := connectConn(t, adminOnDB)
	if err := ownerDB.QueryRow(t.Context(), `SELECT to_regnamespace('fanout') IS NOT NULL
		OR to_regclass('public.schema_migration') IS NOT NULL`).Scan(&written); err != nil || written {
		t.Errorf("after the refusal: schema or bookkeeping written %v (%v); want nothing", written, err)
	}
	if err := ownerDB.Close(t.Context()); err != nil {
		t.Fatal(err)
	}

	// A database the role does not own: each privilege it lacks is named.
	if _, err := admin.Exec(t.Context(), "CREATE DATABASE "+db+"_other TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db+"_other WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s_other: %v", db, err)
		}
	})
	other := *u
	other.Path += "_other"
	_, err = store.Apply(t.Context(), other.String())
	for _, want := range []string{"ALTER ROLE " + role + " CREATEROLE", "GRANT CREATE ON DATABASE " + db + "_other TO " + role,
		"GRANT CREATE ON SCHEMA public TO " + role} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("migrate a database the role does not own: %v; want it to name %q", err, want)
		}
	}

	if _, err := admin.Exec(t.Context(), "ALTER ROLE "+role+" CREATEROLE"); err != nil {
		t.Fatal(err)
	}
	applied, err := store.Apply(t.Context(), owner)
	if err != nil {
		t.Fatalf("migrate as the database's owner with CREATEROLE: %v", err)
	}
	if len(applied.Versions) == 0 || !applied.Redefined {
		t.Errorf("migrate as the database's owner with CREATEROLE: %+v; want every migration applied", applied)
	}
}
