package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// The role matrix is documented in roleMatrixDoc, under roleMatrixSection:
// a table of every function of schema fanout, one of every table, view and
// sequence (and the schema itself), and one of the columns granted on their
// own. TestRoleMatrixFromTheCatalog reads those tables at test time; nothing
// about a function or a table is listed here.
const (
	roleMatrixDoc     = "../docs/operations.md" // from the package's directory
	roleMatrixSection = "## What each login may do"
)

// docName is how a failure names the page.
const docName = "docs/operations.md"

// matrixLogins are the columns of the documented tables, in the order the
// docs name them: PUBLIC (any role at all) and one login of each kind.
var matrixLogins = []string{"PUBLIC", "worker", "orchestrator", "admin", "auditor", "tenant auditor"}

// matrixPrivileges are the letters of a relation's cell, in the order a
// cell is written, and the privilege each names; a lowercase letter is the
// privilege on some columns only (listed in the columns table).
var matrixPrivileges = []struct {
	letter    byte
	privilege string
	kinds     string // the relkinds it applies to; "n" for the schema
	column    bool   // may be granted per column
}{
	{'S', "SELECT", "rpvmfS", true},
	{'I', "INSERT", "rpvmf", true},
	{'U', "UPDATE", "rpvmfS", true},
	{'D', "DELETE", "rpvmf", false},
	{'T', "TRUNCATE", "rpvmf", false},
	{'R', "REFERENCES", "rpvmf", true},
	{'G', "TRIGGER", "rpvmf", false},
	{'M', "MAINTAIN", "rpvmf", false}, // PostgreSQL 17 and later
	{'N', "USAGE", "Sn", false},
	{'C', "CREATE", "n", false},
}

var matrixRelkinds = map[string]string{
	"r": "table", "p": "partitioned table", "v": "view", "m": "materialized view",
	"f": "foreign table", "S": "sequence", "n": "schema",
}

// docRow is one row of a documented table: its first cell, its kind, and
// each login's cell.
type docRow struct {
	line  int
	name  string
	kind  string
	cells map[string]string
}

// docColumns is one row of the columns table.
type docColumns struct {
	line      int
	relation  string
	privilege string
	logins    []string
	columns   string // as written
}

type docMatrix struct {
	functions []docRow
	relations []docRow
	columns   []docColumns
}

// readRoleMatrix parses the three tables of the section. Any row it cannot
// read fails the test: a table that says nothing proves nothing.
func readRoleMatrix(t *testing.T) docMatrix {
	t.Helper()
	raw, err := os.ReadFile(roleMatrixDoc)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	start := slices.Index(lines, roleMatrixSection)
	if start < 0 {
		t.Fatalf("%s has no section %q", docName, roleMatrixSection)
	}
	var m docMatrix
	var header []string
	for i := start + 1; i < len(lines) && !strings.HasPrefix(lines[i], "## "); i++ {
		line := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(line, "|") {
			header = nil
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		where := fmt.Sprintf("%s:%d", docName, i+1)
		switch {
		case header == nil:
			header = cells
			continue
		case strings.Trim(strings.Join(cells, ""), "-: ") == "":
			continue // the separator
		case len(cells) != len(header):
			t.Fatalf("%s: %d cells, the header has %d", where, len(cells), len(header))
		}
		name := strings.Trim(cells[0], "`")
		switch {
		case header[0] == "function" || (header[0] == "relation" && header[1] == "kind"):
			if header[1] != "kind" || !slices.Equal(sortedCopy(header[2:]), sortedCopy(matrixLogins)) {
				t.Fatalf("%s: header %q; want %s, kind, then the logins %q", where, header, header[0], matrixLogins)
			}
			row := docRow{line: i + 1, name: name, kind: cells[1], cells: map[string]string{}}
			for j, login := range header[2:] {
				row.cells[login] = cells[j+2]
			}
			if header[0] == "function" {
				m.functions = append(m.functions, row)
			} else {
				m.relations = append(m.relations, row)
			}
		case header[0] == "relation" && header[1] == "privilege" && len(header) == 4:
			var logins []string
			for l := range strings.SplitSeq(cells[2], ",") {
				l = strings.TrimSpace(l)
				if !slices.Contains(matrixLogins, l) {
					t.Fatalf("%s: login %q; want one of %q", where, l, matrixLogins)
				}
				logins = append(logins, l)
			}
			m.columns = append(m.columns, docColumns{line: i + 1, relation: name, privilege: cells[1], logins: logins, columns: cells[3]})
		default:
			t.Fatalf("%s: a table whose header is %q: want function | kind | logins, relation | kind | logins, or relation | privilege | logins | columns", where, header)
		}
	}
	if len(m.functions) == 0 || len(m.relations) == 0 {
		t.Fatalf("%s %q: %d functions and %d relations documented; want both tables", docName, roleMatrixSection, len(m.functions), len(m.relations))
	}
	return m
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	sort.Strings(c)
	return c
}

// letters is a relation cell's privileges as a set of letters, whatever the
// order or spacing it was written in.
func letters(cell string) string {
	var b []byte
	for _, p := range matrixPrivileges {
		for _, c := range []byte{p.letter, p.letter + 'a' - 'A'} {
			if strings.IndexByte(cell, c) >= 0 {
				b = append(b, c)
			}
		}
	}
	return string(b)
}

// matrixProbe runs sql as one login in a transaction it rolls back, and
// returns the error's SQLSTATE and message ("" if none).
type matrixProbe func(ctx context.Context, sql string) (code, msg string)

// probeConn probes on conn; role, if set, is taken with SET LOCAL ROLE.
func probeConn(conn *pgx.Conn, role string) matrixProbe {
	return func(ctx context.Context, sql string) (string, string) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return "begin", err.Error()
		}
		defer tx.Rollback(context.Background()) //nolint:errcheck // always rolled back
		setup := "SET LOCAL statement_timeout = '10s'; SET LOCAL lock_timeout = '5s'"
		if role != "" {
			setup += "; SET LOCAL ROLE " + pgx.Identifier{role}.Sanitize()
		}
		if _, err := tx.Exec(ctx, setup); err != nil {
			return "setup", err.Error()
		}
		_, err = tx.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return "", ""
		case errors.As(err, &pgErr):
			return pgErr.Code, pgErr.Message
		default:
			return "not a PostgreSQL error", err.Error()
		}
	}
}

// refusedByPrivilege tells a privilege check's refusal (PostgreSQL's
// "permission denied for function|table|view|schema ...") from a
// function's own insufficient_privilege, which it raises only after the
// call got past the check.
func refusedByPrivilege(code, msg string) bool {
	return code == "42501" && strings.HasPrefix(msg, "permission denied for ")
}

// probeOutcome says how a probe that got past the privilege check ended.
func probeOutcome(code, msg string) string {
	if code == "" {
		return "it succeeded"
	}
	return fmt.Sprintf("it failed later: SQLSTATE %s %s", code, msg)
}

// TestRoleMatrixFromTheCatalog (issue 41): what each login may do, as
// docs/operations.md "What each login may do" says, is exactly what the
// catalog grants, and what happens when each login tries.
//
// (a) Every function of schema fanout (from pg_proc) has a row, and every
// row a function; for each login (and PUBLIC) has_function_privilege says
// EXECUTE exactly where the row has an x; the row's kind (definer, invoker,
// trigger) is the function's. Every table, view and sequence of the schema,
// and the schema itself, has a row whose cells are exactly its privileges
// for each login (has_table_privilege, has_sequence_privilege,
// has_schema_privilege; lowercase: on some columns only, and then the
// columns table names exactly those columns).
//
// (b) Each function but the trigger functions is called as each login,
// with a NULL of each argument's type, in a transaction rolled back: where
// the docs allow it the call gets past the privilege check (other errors
// are its arguments'), elsewhere it is refused insufficient_privilege. The
// same for SELECT on every table and view (LIMIT 0).
//
// The logins: a worker's, an orchestrator's and AdminService's (storetest's,
// each in its one group), a role in fanout_auditor, a tenant's auditor made
// by `fanout audit grant`, and, for PUBLIC, a role in no group.
func TestRoleMatrixFromTheCatalog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	doc := readRoleMatrix(t)

	// The logins, and how to act as each.
	auditor, tenantAuditor, nobody := testRole(t, b, "matrix_aud"), testRole(t, b, "matrix_tenant_aud"), testRole(t, b, "matrix_nobody")
	if _, err := b.pool.Exec(b.ctx, fmt.Sprintf("CREATE ROLE %s NOLOGIN IN ROLE fanout_auditor; CREATE ROLE %s NOLOGIN", auditor, nobody)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `SELECT * FROM fanout.admin_create_tenant($1, 'matrix', NULL, NULL, NULL, NULL)`, storetest.Actor(t, b.pool)); err != nil {
		t.Fatal(err)
	}
	if _, err := store.NewAudit(b.pool).Grant(b.ctx, "matrix", tenantAuditor); err != nil {
		t.Fatalf("audit grant: %v", err)
	}
	owner, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Release)
	roles := map[string]string{ // the role the catalog is asked about
		"PUBLIC":         "public",
		"worker":         storetest.WorkerRole,
		"orchestrator":   storetest.NodeRole,
		"admin":          storetest.AdminRole,
		"auditor":        auditor,
		"tenant auditor": tenantAuditor,
	}
	probes := map[string]matrixProbe{
		"PUBLIC":         probeConn(owner.Conn(), nobody),
		"auditor":        probeConn(owner.Conn(), auditor),
		"tenant auditor": probeConn(owner.Conn(), tenantAuditor),
	}
	for login, url := range map[string]string{
		"worker":       storetest.WorkerURL(t, b.url),
		"orchestrator": storetest.NodeURL(t, b.url),
		"admin":        storetest.AdminURL(t, b.url),
	} {
		conn, err := pgx.Connect(b.ctx, url)
		if err != nil {
			t.Fatalf("connect as the %s login: %v", login, err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		probes[login] = probeConn(conn, "")
	}
	roleList := make([]string, len(matrixLogins))
	for i, l := range matrixLogins {
		roleList[i] = roles[l]
	}

	checkFunctions(t, b, doc, roleList, probes)
	checkRelations(t, b, doc, roleList, probes)
}

// catalogFunction is a function of schema fanout as the catalog has it.
type catalogFunction struct {
	name, signature, kind string
	call                  string // "" for one not called (a trigger function)
	execute               []bool // per matrixLogins
}

func checkFunctions(t *testing.T, b *testBundle, doc docMatrix, roleList []string, probes map[string]matrixProbe) {
	// format_type names a type outside search_path with its schema: the
	// calls are made by logins whose search_path is their own.
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // read only
	if _, err := tx.Exec(b.ctx, "SET LOCAL search_path = pg_catalog"); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(b.ctx, `
		SELECT p.proname,
		       p.proname || '(' || coalesce((SELECT string_agg(format_type(a.t, NULL), ',' ORDER BY a.i)
		                                        FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY a(t, i)), '') || ')',
		       concat_ws(', ', CASE WHEN p.prorettype = 'trigger'::regtype THEN 'trigger' END,
		                       CASE WHEN p.prosecdef THEN 'definer' END,
		                       CASE WHEN NOT p.prosecdef AND p.prorettype <> 'trigger'::regtype THEN 'invoker' END,
		                       CASE WHEN p.prokind <> 'f' THEN 'prokind ' || p.prokind::text END),
		       CASE WHEN p.prokind = 'f' AND p.prorettype <> 'trigger'::regtype
		                 AND NOT EXISTS (SELECT FROM unnest(p.proargtypes::oid[]) a(t) JOIN pg_type ty ON ty.oid = a.t WHERE ty.typtype = 'p')
		            THEN format('SELECT %I.%I(%s)', n.nspname, p.proname,
		                        coalesce((SELECT string_agg('NULL::' || format_type(a.t, NULL), ', ' ORDER BY a.i)
		                                    FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY a(t, i)), ''))
		            ELSE '' END,
		       array(SELECT has_function_privilege(r, p.oid, 'EXECUTE') FROM unnest($1::text[]) WITH ORDINALITY x(r, i) ORDER BY x.i)
		  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname = 'fanout'
		 ORDER BY 2`, roleList)
	if err != nil {
		t.Fatal(err)
	}
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (catalogFunction, error) {
		var f catalogFunction
		err := r.Scan(&f.name, &f.signature, &f.kind, &f.call, &f.execute)
		return f, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if len(fns) == 0 {
		t.Fatal("no function in schema fanout: the catalog query is wrong")
	}
	overloaded := map[string]int{}
	for _, f := range fns {
		overloaded[f.name]++
	}
	documented := map[string]docRow{}
	for _, r := range doc.functions {
		if _, dup := documented[r.name]; dup {
			t.Errorf("%s:%d: function %s documented twice", docName, r.line, r.name)
		}
		documented[r.name] = r
	}
	seen := map[string]bool{}
	for _, f := range fns {
		key := f.name
		if overloaded[f.name] > 1 {
			key = f.signature // an overloaded name is documented by its signature
		}
		row, ok := documented[key]
		if !ok {
			t.Errorf("function %s is in the catalog but not in %s %q (add a row named %s: its kind %q and an x for each login that may execute it: %s)",
				f.signature, docName, roleMatrixSection, key, f.kind, whoMay(f.execute))
			continue
		}
		seen[key] = true
		if row.kind != f.kind {
			t.Errorf("function %s: %s:%d says kind %q, the catalog %q", f.signature, docName, row.line, row.kind, f.kind)
		}
		for i, login := range matrixLogins {
			cell := row.cells[login]
			if cell != "" && cell != "x" {
				t.Errorf("%s:%d: function %s, %s: cell %q; want x or nothing", docName, row.line, f.signature, login, cell)
			}
			may := cell == "x"
			if may != f.execute[i] {
				t.Errorf("function %s, login %s: %s:%d says %s, the catalog says %s (has_function_privilege(%s, EXECUTE))",
					f.signature, login, docName, row.line, executeWord(may), executeWord(f.execute[i]), roleList[i])
			}
			if f.call == "" {
				if !strings.Contains(f.kind, "trigger") && i == 0 {
					t.Errorf("function %s (%s) is not called as each login: a procedure, an aggregate or a pseudo-type argument; teach the test to call it", f.signature, f.kind)
				}
				continue // a trigger function is not called, only its grants checked
			}
			code, msg := probes[login](b.ctx, f.call)
			switch refused := refusedByPrivilege(code, msg); {
			case may && refused:
				t.Errorf("function %s, login %s: the docs say it may execute it, but %s was refused: %s (SQLSTATE %s)", f.signature, login, f.call, msg, code)
			case !may && !refused:
				t.Errorf("function %s, login %s: the docs say it may not execute it, but %s got past the privilege check (%s)", f.signature, login, f.call, probeOutcome(code, msg))
			}
		}
	}
	for _, r := range doc.functions {
		if !seen[r.name] {
			t.Errorf("%s:%d: function %s is documented but schema fanout has no such function", docName, r.line, r.name)
		}
	}
}

func whoMay(execute []bool) string {
	var who []string
	for i, e := range execute {
		if e {
			who = append(who, matrixLogins[i])
		}
	}
	if len(who) == 0 {
		return "none"
	}
	return strings.Join(who, ", ")
}

func executeWord(may bool) string {
	if may {
		return "EXECUTE"
	}
	return "no EXECUTE"
}

// catalogRelation is a table, view or sequence of schema fanout, or the
// schema itself (kind "n"), with each login's cell.
type catalogRelation struct {
	name, relkind string
	cells         []string   // per matrixLogins, letters in matrixPrivileges' order
	columns       [][]string // per matrixLogins and lowercase letter: "PRIV col,col"
	all           []string   // every column
}

func checkRelations(t *testing.T, b *testBundle, doc docMatrix, roleList []string, probes map[string]matrixProbe) {
	var version int
	if err := b.pool.QueryRow(b.ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		t.Fatal(err)
	}
	// Every relation, login and privilege in one query (one round trip
	// each would be thousands): whether the login holds the privilege on the
	// whole relation, else on which columns.
	var letterList, privileges, kinds []string
	var column []bool
	for _, p := range matrixPrivileges {
		if p.privilege == "MAINTAIN" && version < 170000 {
			continue
		}
		letterList, privileges, kinds, column = append(letterList, string(p.letter)), append(privileges, p.privilege), append(kinds, p.kinds), append(column, p.column)
	}
	rows, err := b.pool.Query(b.ctx, `
		WITH rel AS (
		    SELECT c.relname::text AS name, c.relkind::text AS kind, c.oid,
		           array(SELECT a.attname::text FROM pg_attribute a
		                  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum) AS cols
		      FROM pg_class c
		     WHERE c.relnamespace = 'fanout'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
		    UNION ALL
		    SELECT 'fanout', 'n', 0::oid, '{}'::text[]
		)
		SELECT rel.name, rel.kind, rel.cols, l.i::int, p.letter,
		       CASE rel.kind WHEN 'n' THEN has_schema_privilege(l.role, rel.name, p.priv)
		                     WHEN 'S' THEN has_sequence_privilege(l.role, rel.oid, p.priv)
		                     ELSE has_table_privilege(l.role, rel.oid, p.priv) END,
		       CASE WHEN rel.kind NOT IN ('n', 'S') AND p.col
		            THEN array(SELECT a.attname::text FROM pg_attribute a
		                        WHERE a.attrelid = rel.oid AND a.attnum > 0 AND NOT a.attisdropped
		                          AND has_column_privilege(l.role, rel.oid, a.attnum, p.priv) ORDER BY a.attnum)
		            ELSE '{}' END
		  FROM rel
		 CROSS JOIN unnest($1::text[]) WITH ORDINALITY l(role, i)
		  JOIN unnest($2::text[], $3::text[], $4::text[], $5::bool[]) p(letter, priv, kinds, col) ON strpos(p.kinds, rel.kind) > 0
		 ORDER BY rel.name, l.i, array_position($2::text[], p.letter)`, roleList, letterList, privileges, kinds, column)
	if err != nil {
		t.Fatal(err)
	}
	var catalog []catalogRelation
	for rows.Next() {
		var name, kind, letter string
		var all, cols []string
		var i int
		var whole bool
		if err := rows.Scan(&name, &kind, &all, &i, &letter, &whole, &cols); err != nil {
			t.Fatal(err)
		}
		if n := len(catalog); n == 0 || catalog[n-1].name != name {
			catalog = append(catalog, catalogRelation{name: name, relkind: kind, all: all,
				cells: make([]string, len(matrixLogins)), columns: make([][]string, len(matrixLogins))})
		}
		cr := &catalog[len(catalog)-1]
		switch i--; {
		case whole:
			cr.cells[i] += letter
		case len(cols) > 0:
			cr.cells[i] += strings.ToLower(letter)
			cr.columns[i] = append(cr.columns[i], privilegeOf(letter)+" "+strings.Join(cols, ","))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(catalog) < 2 {
		t.Fatal("no relation in schema fanout: the catalog query is wrong")
	}

	documented := map[string]docRow{}
	for _, r := range doc.relations {
		if _, dup := documented[r.name]; dup {
			t.Errorf("%s:%d: relation %s documented twice", docName, r.line, r.name)
		}
		documented[r.name] = r
	}
	// The columns table, by relation, privilege and login.
	docCols := map[string]docColumns{}
	usedCols := map[string]bool{}
	for _, c := range doc.columns {
		for _, l := range c.logins {
			k := c.relation + "\x00" + c.privilege + "\x00" + l
			if _, dup := docCols[k]; dup {
				t.Errorf("%s:%d: columns of %s %s for %s documented twice", docName, c.line, c.privilege, c.relation, l)
			}
			docCols[k] = c
		}
	}
	seen := map[string]bool{}
	for _, cr := range catalog {
		kind := matrixRelkinds[cr.relkind]
		row, ok := documented[cr.name]
		if !ok {
			t.Errorf("%s %s is in the catalog but not in %s %q (add a row: %s)", kind, cr.name, docName, roleMatrixSection, describeCells(cr.cells))
			continue
		}
		seen[cr.name] = true
		if row.kind != kind {
			t.Errorf("%s: %s:%d says kind %q, the catalog %q", cr.name, docName, row.line, row.kind, kind)
		}
		for i, login := range matrixLogins {
			want, got := letters(row.cells[login]), cr.cells[i]
			if strings.ContainsFunc(row.cells[login], func(r rune) bool { return !strings.ContainsRune("SIUDTRGMNCsiur ,", r) }) {
				t.Errorf("%s:%d: %s, %s: cell %q has letters that name no privilege", docName, row.line, cr.name, login, row.cells[login])
			}
			if want != got {
				t.Errorf("%s %s, login %s: %s:%d says %q (%s), the catalog %q (%s)", kind, cr.name, login, docName, row.line,
					want, privilegeWords(want), got, privilegeWords(got))
			}
			// Columns granted on their own: exactly the documented ones.
			for _, pc := range cr.columns[i] {
				priv, cols, _ := strings.Cut(pc, " ")
				k := cr.name + "\x00" + priv + "\x00" + login
				usedCols[k] = true
				dc, ok := docCols[k]
				if !ok {
					t.Errorf("%s %s, login %s: %s on columns %s, but the columns table of %s has no row for it", kind, cr.name, login, priv, cols, docName)
					continue
				}
				wantCols, err := expandColumns(dc.columns, cr.all)
				if err != nil {
					t.Errorf("%s:%d: %s: %v", docName, dc.line, cr.name, err)
					continue
				}
				if gotCols := strings.Split(cols, ","); !slices.Equal(sortedCopy(wantCols), sortedCopy(gotCols)) {
					t.Errorf("%s %s, login %s: %s:%d says %s on %v, the catalog on %v", kind, cr.name, login, docName, dc.line, priv, wantCols, gotCols)
				}
			}
			// (b) SELECT as the login.
			if cr.relkind == "S" || cr.relkind == "n" {
				continue // the catalog is enough for sequences and the schema
			}
			may := strings.ContainsAny(letters(row.cells[login]), "Ss")
			sql := "SELECT 1 FROM " + pgx.Identifier{"fanout", cr.name}.Sanitize() + " LIMIT 0"
			code, msg := probes[login](b.ctx, sql)
			switch refused := refusedByPrivilege(code, msg); {
			case may && refused:
				t.Errorf("%s %s, login %s: the docs say it may read it, but %s was refused: %s", kind, cr.name, login, sql, msg)
			case may && code != "":
				t.Errorf("%s %s, login %s: %s failed: SQLSTATE %s %s", kind, cr.name, login, sql, code, msg)
			case !may && !refused:
				t.Errorf("%s %s, login %s: the docs say it may not read it, but %s got past the privilege check (%s)", kind, cr.name, login, sql, probeOutcome(code, msg))
			}
		}
	}
	for _, r := range doc.relations {
		if !seen[r.name] {
			t.Errorf("%s:%d: %s is documented but schema fanout has no such relation", docName, r.line, r.name)
		}
	}
	for k, c := range docCols {
		if !usedCols[k] {
			parts := strings.Split(k, "\x00")
			t.Errorf("%s:%d: %s on columns of %s documented for %s, but the catalog grants it no columns on their own", docName, c.line, parts[1], parts[0], parts[2])
		}
	}
}

// expandColumns reads a columns cell: "`a`, `b`", "every column", or
// "every column but `a`, `b`", against all, the relation's columns.
func expandColumns(cell string, all []string) ([]string, error) {
	names := func(s string) ([]string, error) {
		var out []string
		for c := range strings.SplitSeq(s, ",") {
			c = strings.Trim(strings.TrimSpace(c), "`")
			if !slices.Contains(all, c) {
				return nil, fmt.Errorf("column %q: not a column of the relation (%v)", c, all)
			}
			out = append(out, c)
		}
		return out, nil
	}
	switch {
	case cell == "every column":
		return all, nil
	case strings.HasPrefix(cell, "every column but "):
		but, err := names(strings.TrimPrefix(cell, "every column but "))
		if err != nil {
			return nil, err
		}
		var out []string
		for _, c := range all {
			if !slices.Contains(but, c) {
				out = append(out, c)
			}
		}
		return out, nil
	default:
		return names(cell)
	}
}

func privilegeOf(letter string) string {
	for _, p := range matrixPrivileges {
		if string(p.letter) == letter {
			return p.privilege
		}
	}
	return "?" + letter
}

func privilegeWords(letters string) string {
	if letters == "" {
		return "nothing"
	}
	var w []string
	for _, c := range []byte(letters) {
		for _, p := range matrixPrivileges {
			switch c {
			case p.letter:
				w = append(w, p.privilege)
			case p.letter + 'a' - 'A':
				w = append(w, p.privilege+" on some columns")
			}
		}
	}
	return strings.Join(w, ", ")
}

func describeCells(cells []string) string {
	var d []string
	for i, c := range cells {
		d = append(d, fmt.Sprintf("%s %q", matrixLogins[i], c))
	}
	return strings.Join(d, ", ")
}
