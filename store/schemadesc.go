package store

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// TxBeginner is what DescribeSchema reads through: a *pgx.Conn or a
// *pgxpool.Pool. It needs a transaction rather than single queries because
// the catalog's deparse functions print names and constants according to
// session settings, which it pins for the duration.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// DescribeSchema returns fanout's schema (Schema, plus the migrator's
// bookkeeping tables in public) as SQL-like text read from the catalog,
// for committing as a golden file: the same schema gives the same text,
// whatever history led to it and whoever ran the migrations (the owner of
// Schema is written OWNER). Function bodies are written as a hash and a
// line count, since their source is in migrations/. Not every line is
// runnable SQL.
func DescribeSchema(ctx context.Context, db TxBeginner) (string, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return "", fmt.Errorf("describe schema: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// With only pg_catalog on the path every name of ours comes out
	// schema-qualified, and the styles fix how constants in defaults and
	// views print, whatever the caller's session had.
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', 'pg_catalog', true),
		set_config('DateStyle', 'ISO, MDY', true), set_config('IntervalStyle', 'postgres', true),
		set_config('TimeZone', 'UTC', true), set_config('extra_float_digits', '1', true),
		set_config('bytea_output', 'hex', true)`); err != nil {
		return "", fmt.Errorf("describe schema: settings: %w", err)
	}
	var lines []descLine
	for _, q := range describeQueries {
		rows, err := tx.Query(ctx, q.sql, Schema)
		if err != nil {
			return "", fmt.Errorf("describe schema: %s: %w", q.name, err)
		}
		var l descLine
		if _, err := pgx.ForEachRow(rows, []any{&l.sect, &l.obj, &l.part, &l.sub, &l.text}, func() error {
			lines = append(lines, l)
			return nil
		}); err != nil {
			return "", fmt.Errorf("describe schema: %s: %w", q.name, err)
		}
	}
	return formatDescription(lines), nil
}

// descLine is one line of the description with where it goes: the
// section, the object it belongs to, its part of that object and its place
// in the part. Sorting in Go rather than in SQL keeps the order out of the
// server's collation.
type descLine struct {
	sect int
	obj  string
	part int
	sub  string
	text string
}

// The parts of an object, in the order they are written, are numbered
// in the queries: 10 its CREATE statement, 20 columns and 21 constraints
// inside it (comma-separated), 30 the closing parenthesis, 40 ALTER
// statements, 50 indexes, 60 triggers, 70 policies, 80 comments, 90
// privileges.
const (
	partColumn     = 20
	partConstraint = 21
)

var sectionTitles = map[int]string{
	10: "Schema",
	30: "Types",
	40: "Sequences",
	50: "Tables",
	60: "Views",
	70: "Functions and procedures",
}

// formatDescription writes lines in a fixed order, a blank line between
// objects, so that a change to one object is a diff confined to it.
func formatDescription(lines []descLine) string {
	sort.Slice(lines, func(i, j int) bool {
		a, b := lines[i], lines[j]
		switch {
		case a.sect != b.sect:
			return a.sect < b.sect
		case a.obj != b.obj:
			return a.obj < b.obj
		case a.part != b.part:
			return a.part < b.part
		case a.sub != b.sub:
			return a.sub < b.sub
		}
		return a.text < b.text
	})
	inBody := func(l descLine) bool { return l.part == partColumn || l.part == partConstraint }
	var b strings.Builder
	for i, l := range lines {
		switch {
		case i == 0 || l.sect != lines[i-1].sect:
			if i > 0 {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "-- %s\n\n", sectionTitles[l.sect])
		case l.obj != lines[i-1].obj:
			b.WriteString("\n")
		}
		b.WriteString(l.text)
		if next := i + 1; inBody(l) && next < len(lines) && lines[next].obj == l.obj && lines[next].sect == l.sect && inBody(lines[next]) {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// describeCTEs name what is described, for every query: own is the owner
// role (of Schema, or the current user before Schema exists), written
// OWNER; roles names roles as the description writes them.
const describeCTEs = `
own AS (
	SELECT coalesce((SELECT nspowner FROM pg_namespace WHERE nspname = $1),
	                (SELECT oid FROM pg_roles WHERE rolname = current_user)) AS oid
),
roles AS (
	SELECT r.oid, CASE WHEN r.oid = own.oid THEN 'OWNER' ELSE quote_ident(r.rolname) END AS name
	  FROM pg_roles r, own
	UNION ALL
	SELECT 0, 'PUBLIC'
),
rels AS (
	SELECT c.oid, c.relkind, c.oid::regclass::text AS name, c.relowner AS owner, c.relacl,
	       c.relrowsecurity, c.relforcerowsecurity, c.relpersistence, c.relispartition, c.relpartbound,
	       CASE c.relkind WHEN 'c' THEN 30 WHEN 'S' THEN 40 WHEN 'r' THEN 50 WHEN 'p' THEN 50 ELSE 60 END AS sect,
	       CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
	                      ELSE 'TABLE' END AS kw,
	       coalesce(' WITH (' || (SELECT string_agg(o, ', ' ORDER BY o COLLATE "C") FROM unnest(c.reloptions) o) || ')',
	                '') AS opts
	  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'c')
	   AND (n.nspname = $1 OR (n.nspname = 'public' AND c.relname IN ('schema_migration', 'schema_repeatable')))
	   -- An identity column's sequence is part of the column.
	   AND NOT (c.relkind = 'S' AND EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
	                                        AND d.objid = c.oid AND d.deptype = 'i'))
),
types AS (
	SELECT t.oid, t.typtype, format_type(t.oid, NULL) AS name, t.typowner AS owner, t.typacl,
	       t.typbasetype, t.typtypmod, t.typcollation, t.typdefaultbin, t.typnotnull,
	       CASE t.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END AS kw
	  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
	 WHERE n.nspname = $1 AND t.typtype <> 'm'
	   -- A table's row type is the table; an array type comes with its element.
	   AND (t.typrelid = 0 OR (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')
	   AND NOT EXISTS (SELECT FROM pg_type e WHERE e.oid = t.typelem AND e.typarray = t.oid)
),
funcs AS (
	SELECT p.oid, p.oid::regprocedure::text AS name, format('%I.%I', n.nspname, p.proname) AS qname,
	       p.prokind, p.proowner AS owner, p.proacl, p.provolatile, p.proisstrict, p.prosecdef,
	       p.proleakproof, p.proparallel, p.procost, p.prorows, p.proretset, p.proconfig, l.lanname,
	       CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE' ELSE 'FUNCTION' END AS kw,
	       CASE WHEN p.prosqlbody IS NULL THEN p.prosrc ELSE pg_get_function_sqlbody(p.oid) END AS body
	  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang
	 WHERE n.nspname = $1
)
`

// describeQueries each return rows of (sect, obj, part, sub, text), see
// descLine.
//
// Left out: roles and their memberships (cluster-wide, not the
// database's); the ACL of schema public (owned by the database's owner,
// its defaults differ with the server version and with who created the
// database); the options of identity sequences, storage, statistics and
// replica identity settings, which the migrations leave at their defaults;
// and kinds of object the migrations do not make (rules, extended
// statistics, operators, collations, text search, foreign tables,
// extensions).
// describeQueries are constants, each the CTEs and its own query.
var describeQueries = []struct{ name, sql string }{
	{"schema", "WITH " + describeCTEs + `
SELECT 10, '', 10, '', format('CREATE SCHEMA %I;', nspname) FROM pg_namespace WHERE nspname = $1`},

	{"types", "WITH " + describeCTEs + `
SELECT 30, name, 10, '', CASE typtype
	WHEN 'c' THEN format('CREATE TYPE %s AS (', name)
	WHEN 'e' THEN format('CREATE TYPE %s AS ENUM (%s);', name,
		(SELECT string_agg(quote_literal(enumlabel), ', ' ORDER BY enumsortorder) FROM pg_enum WHERE enumtypid = t.oid))
	WHEN 'd' THEN format('CREATE DOMAIN %s AS %s%s%s%s;', name, format_type(typbasetype, typtypmod),
		CASE WHEN typcollation <> (SELECT typcollation FROM pg_type WHERE oid = typbasetype)
		     THEN ' COLLATE ' || typcollation::regcollation::text END,
		' DEFAULT ' || pg_get_expr(typdefaultbin, 0, true), CASE WHEN typnotnull THEN ' NOT NULL' END)
	WHEN 'r' THEN format('CREATE TYPE %s AS RANGE (SUBTYPE = %s);', name,
		(SELECT format_type(rngsubtype, NULL) FROM pg_range WHERE rngtypid = t.oid))
	ELSE format('CREATE TYPE %s; -- of typtype %s, not described further', name, typtype) END
  FROM types t
UNION ALL
SELECT 30, name, 30, '', ');' FROM types WHERE typtype = 'c'
UNION ALL
SELECT 30, t.name, 40, k.conname::text, format('ALTER DOMAIN %s ADD CONSTRAINT %I %s;', t.name, k.conname, pg_get_constraintdef(k.oid, true))
  FROM types t JOIN pg_constraint k ON k.contypid = t.oid
 WHERE k.contype <> 'n' -- NOT NULL is on the domain line
UNION ALL
SELECT 30, name, 40, '~', format('ALTER %s %s OWNER TO %s;', kw, name, (SELECT r.name FROM roles r WHERE r.oid = owner))
  FROM types WHERE owner <> (SELECT oid FROM own)`},

	{"sequences", "WITH " + describeCTEs + `
SELECT 40, c.name, 10, '', format('CREATE SEQUENCE %s AS %s INCREMENT %s MINVALUE %s MAXVALUE %s START %s CACHE %s%s%s;',
	c.name, format_type(s.seqtypid, NULL), s.seqincrement, s.seqmin, s.seqmax, s.seqstart, s.seqcache,
	CASE WHEN s.seqcycle THEN ' CYCLE' END,
	(SELECT format(' OWNED BY %s.%I', d.refobjid::regclass, a.attname)
	   FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
	  WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.refclassid = 'pg_class'::regclass
	    AND d.deptype = 'a'))
  FROM rels c JOIN pg_sequence s ON s.seqrelid = c.oid`},

	{"relations", "WITH " + describeCTEs + `
SELECT sect, name, 10, '', CASE relkind
	WHEN 'v' THEN format(E'CREATE VIEW %s%s AS\n%s', name, opts, pg_get_viewdef(oid, true))
	WHEN 'm' THEN format(E'CREATE MATERIALIZED VIEW %s%s AS\n%s', name, opts, pg_get_viewdef(oid, true))
	ELSE format('CREATE %sTABLE %s (', CASE WHEN relpersistence = 'u' THEN 'UNLOGGED ' END, name) END
  FROM rels WHERE relkind IN ('r', 'p', 'v', 'm')
UNION ALL
SELECT sect, name, 30, '', format(')%s%s;', ' PARTITION BY ' || pg_get_partkeydef(oid), opts)
  FROM rels WHERE relkind IN ('r', 'p')
UNION ALL
SELECT sect, name, 40, 'a', format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY;', name) FROM rels WHERE relrowsecurity
UNION ALL
SELECT sect, name, 40, 'b', format('ALTER TABLE %s FORCE ROW LEVEL SECURITY;', name) FROM rels WHERE relforcerowsecurity
UNION ALL
SELECT c.sect, c.name, 40, 'c', format('ALTER TABLE %s ATTACH PARTITION %s %s;', i.inhparent::regclass, c.name,
	pg_get_expr(c.relpartbound, c.oid, true))
  FROM rels c JOIN pg_inherits i ON i.inhrelid = c.oid WHERE c.relispartition
UNION ALL
SELECT sect, name, 40, 'd', format('ALTER %s %s OWNER TO %s;', kw, name, (SELECT r.name FROM roles r WHERE r.oid = owner))
  FROM rels WHERE relkind <> 'c' AND owner <> (SELECT oid FROM own)`},

	// Only the order of the columns shows, not their attnum: a dropped
	// column leaves a gap that a database created afresh does not have.
	{"columns", "WITH " + describeCTEs + `
SELECT c.sect, c.name, 20, lpad(a.attnum::text, 5, '0'), concat('    ', quote_ident(a.attname), ' ',
	format_type(a.atttypid, a.atttypmod),
	CASE WHEN a.attcollation <> t.typcollation THEN ' COLLATE ' || a.attcollation::regcollation::text END,
	CASE WHEN a.attgenerated = 's' THEN ' GENERATED ALWAYS AS (' || pg_get_expr(d.adbin, d.adrelid, true) || ') STORED'
	     ELSE ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid, true) END,
	CASE a.attidentity WHEN 'a' THEN ' GENERATED ALWAYS AS IDENTITY' WHEN 'd' THEN ' GENERATED BY DEFAULT AS IDENTITY' END,
	CASE WHEN a.attnotnull THEN ' NOT NULL' END)
  FROM rels c
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  JOIN pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE c.relkind IN ('r', 'p', 'c')`},

	// PostgreSQL 18 lists NOT NULL as constraints too, named; the columns
	// say it already, the same way on every version.
	{"constraints", "WITH " + describeCTEs + `
SELECT c.sect, c.name, 21, k.conname::text, format('    CONSTRAINT %I %s', k.conname, pg_get_constraintdef(k.oid, true))
  FROM rels c JOIN pg_constraint k ON k.conrelid = c.oid
 WHERE c.relkind IN ('r', 'p') AND k.contype <> 'n'`},

	// An index that implements a constraint is that constraint.
	{"indexes", "WITH " + describeCTEs + `
SELECT c.sect, c.name, 50, i.relname::text, pg_get_indexdef(x.indexrelid, 0, true) || ';'
  FROM rels c JOIN pg_index x ON x.indrelid = c.oid JOIN pg_class i ON i.oid = x.indexrelid
 WHERE NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conrelid = c.oid AND k.conindid = x.indexrelid
                                                AND k.contype IN ('p', 'u', 'x'))`},

	{"triggers", "WITH " + describeCTEs + `
SELECT c.sect, c.name, 60, t.tgname || ' 1', pg_get_triggerdef(t.oid, true) || ';'
  FROM rels c JOIN pg_trigger t ON t.tgrelid = c.oid WHERE NOT t.tgisinternal
UNION ALL
SELECT c.sect, c.name, 60, t.tgname || ' 2', format('ALTER TABLE %s %s TRIGGER %I;', c.name,
	CASE t.tgenabled WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA' ELSE 'ENABLE ALWAYS' END, t.tgname)
  FROM rels c JOIN pg_trigger t ON t.tgrelid = c.oid WHERE NOT t.tgisinternal AND t.tgenabled <> 'O'`},

	{"policies", "WITH " + describeCTEs + `
SELECT c.sect, c.name, 70, p.polname::text, format('CREATE POLICY %I ON %s%s FOR %s TO %s%s%s;', p.polname, c.name,
	CASE WHEN NOT p.polpermissive THEN ' AS RESTRICTIVE' END,
	CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
	(SELECT string_agg(r.name, ', ' ORDER BY r.name COLLATE "C") FROM roles r WHERE r.oid = ANY (p.polroles)),
	' USING (' || pg_get_expr(p.polqual, p.polrelid, true) || ')',
	' WITH CHECK (' || pg_get_expr(p.polwithcheck, p.polrelid, true) || ')')
  FROM rels c JOIN pg_policy p ON p.polrelid = c.oid`},

	{"comments", "WITH " + describeCTEs + `
SELECT sect, obj, 80, sub, format('COMMENT ON %s IS %L;', target, d) FROM (
	SELECT 10 AS sect, '' AS obj, '' AS sub, format('SCHEMA %I', nspname) AS target,
	       obj_description(oid, 'pg_namespace') AS d
	  FROM pg_namespace WHERE nspname = $1
	UNION ALL
	SELECT sect, name, '0', kw || ' ' || name, obj_description(oid, 'pg_class') FROM rels WHERE relkind <> 'c'
	UNION ALL
	SELECT c.sect, c.name, '1' || lpad(a.attnum::text, 5, '0'), format('COLUMN %s.%I', c.name, a.attname),
	       col_description(c.oid, a.attnum)
	  FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
	UNION ALL
	SELECT c.sect, c.name, '2' || k.conname, format('CONSTRAINT %I ON %s', k.conname, c.name),
	       obj_description(k.oid, 'pg_constraint')
	  FROM rels c JOIN pg_constraint k ON k.conrelid = c.oid
	UNION ALL
	SELECT c.sect, c.name, '3' || x.indexrelid::regclass::text, 'INDEX ' || x.indexrelid::regclass::text,
	       obj_description(x.indexrelid, 'pg_class')
	  FROM rels c JOIN pg_index x ON x.indrelid = c.oid
	UNION ALL
	SELECT c.sect, c.name, '4' || t.tgname, format('TRIGGER %I ON %s', t.tgname, c.name), obj_description(t.oid, 'pg_trigger')
	  FROM rels c JOIN pg_trigger t ON t.tgrelid = c.oid WHERE NOT t.tgisinternal
	UNION ALL
	SELECT c.sect, c.name, '5' || p.polname, format('POLICY %I ON %s', p.polname, c.name), obj_description(p.oid, 'pg_policy')
	  FROM rels c JOIN pg_policy p ON p.polrelid = c.oid
	UNION ALL
	SELECT 30, name, '0', kw || ' ' || name, obj_description(oid, 'pg_type') FROM types
	UNION ALL
	SELECT 30, t.name, '2' || k.conname, format('CONSTRAINT %I ON DOMAIN %s', k.conname, t.name),
	       obj_description(k.oid, 'pg_constraint')
	  FROM types t JOIN pg_constraint k ON k.contypid = t.oid
	UNION ALL
	SELECT 70, name, '0', kw || ' ' || name, obj_description(oid, 'pg_proc') FROM funcs
) x WHERE d IS NOT NULL`},

	// The body is in migrations/; a copy here would be a second one to
	// keep in step. The hash still shows every change to it.
	{"functions", "WITH " + describeCTEs + `
SELECT 70, name, 10, '', CASE WHEN prokind = 'a' THEN format('CREATE AGGREGATE %s; -- not described further', name)
	ELSE format(E'CREATE %s %s(%s)%s\n    %s%s;\n    -- body: %s, sha256 %s',
		kw, qname, pg_get_function_arguments(oid),
		CASE WHEN prokind <> 'p' THEN ' RETURNS ' || pg_get_function_result(oid) END,
		concat_ws(' ', 'LANGUAGE ' || quote_ident(lanname),
			CASE WHEN prokind <> 'p' THEN CASE provolatile WHEN 'i' THEN 'IMMUTABLE' WHEN 's' THEN 'STABLE' ELSE 'VOLATILE' END END,
			CASE WHEN proisstrict THEN 'STRICT' END,
			CASE WHEN prosecdef THEN 'SECURITY DEFINER' END,
			CASE WHEN proleakproof THEN 'LEAKPROOF' END,
			CASE proparallel WHEN 's' THEN 'PARALLEL SAFE' WHEN 'r' THEN 'PARALLEL RESTRICTED' END,
			CASE WHEN prokind = 'w' THEN 'WINDOW' END,
			CASE WHEN procost <> CASE WHEN lanname IN ('internal', 'c') THEN 1 ELSE 100 END THEN 'COST ' || procost END,
			CASE WHEN proretset AND prorows <> 1000 THEN 'ROWS ' || prorows END),
		(SELECT string_agg(E'\n    SET ' || regexp_replace(s, '=', ' = '), '' ORDER BY s COLLATE "C") FROM unnest(proconfig) s),
		(SELECT n || CASE n WHEN 1 THEN ' line' ELSE ' lines' END
		   FROM cardinality(string_to_array(btrim(body, E'\n'), E'\n')) n),
		left(encode(sha256(convert_to(body, 'UTF8')), 'hex'), 12)) END
  FROM funcs
UNION ALL
SELECT 70, name, 40, '', format('ALTER %s %s OWNER TO %s;', kw, name, (SELECT r.name FROM roles r WHERE r.oid = owner))
  FROM funcs WHERE owner <> (SELECT oid FROM own)`},

	// Privileges as what differs from an object's defaults, in the GRANT
	// and REVOKE statements that would make the difference: aclexplode
	// undoes the order grants were given in, and the defaults of NULL and
	// of an ACL that only spells them out are the same.
	{"privileges", "WITH " + describeCTEs + `,
acls AS (
	SELECT 10 AS sect, '' AS obj, '' AS prefix, format('SCHEMA %I', nspname) AS target, NULL::name AS col, 0 AS colnum,
	       nspowner AS owner, coalesce(nspacl, acldefault('n', nspowner)) AS acl, acldefault('n', nspowner) AS base
	  FROM pg_namespace WHERE nspname = $1
	UNION ALL
	SELECT 10, '', format('ALTER DEFAULT PRIVILEGES FOR ROLE %s%s ', (SELECT r.name FROM roles r WHERE r.oid = d.defaclrole),
	                      ' IN SCHEMA ' || quote_ident(n.nspname)),
	       CASE d.defaclobjtype WHEN 'r' THEN 'TABLES' WHEN 'S' THEN 'SEQUENCES' WHEN 'f' THEN 'FUNCTIONS'
	                            WHEN 'T' THEN 'TYPES' ELSE 'SCHEMAS' END,
	       NULL, 0, d.defaclrole, d.defaclacl,
	       -- Defaults for a schema add to the global ones; global ones replace the built-in ones.
	       CASE WHEN d.defaclnamespace = 0
	            THEN acldefault((CASE d.defaclobjtype WHEN 'S' THEN 's' ELSE d.defaclobjtype END)::"char", d.defaclrole)
	            ELSE '{}' END
	  FROM pg_default_acl d LEFT JOIN pg_namespace n ON n.oid = d.defaclnamespace
	 WHERE d.defaclrole = (SELECT oid FROM own) AND (d.defaclnamespace = 0 OR n.nspname = $1)
	UNION ALL
	SELECT sect, name, '', CASE relkind WHEN 'S' THEN 'SEQUENCE ' ELSE 'TABLE ' END || name, NULL, 0, owner,
	       coalesce(relacl, acldefault((CASE relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", owner)),
	       acldefault((CASE relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", owner)
	  FROM rels WHERE relkind <> 'c'
	UNION ALL
	SELECT c.sect, c.name, '', 'TABLE ' || c.name, a.attname, a.attnum, c.owner, a.attacl, '{}'
	  FROM rels c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
	 WHERE a.attacl IS NOT NULL
	UNION ALL
	SELECT 30, name, '', kw || ' ' || name, NULL, 0, owner, coalesce(typacl, acldefault('T', owner)), acldefault('T', owner)
	  FROM types
	UNION ALL
	SELECT 70, name, '', kw || ' ' || name, NULL, 0, owner, coalesce(proacl, acldefault('f', owner)), acldefault('f', owner)
	  FROM funcs
),
diff AS (
	-- aclexplode refuses an empty array.
	SELECT a.*, 'GRANT' AS verb, x.*
	  FROM acls a, LATERAL (SELECT * FROM aclexplode(CASE WHEN cardinality(a.acl) > 0 THEN a.acl END)
	                        EXCEPT SELECT * FROM aclexplode(CASE WHEN cardinality(a.base) > 0 THEN a.base END)) x
	UNION ALL
	SELECT a.*, 'REVOKE', x.*
	  FROM acls a, LATERAL (SELECT * FROM aclexplode(CASE WHEN cardinality(a.base) > 0 THEN a.base END)
	                        EXCEPT SELECT * FROM aclexplode(CASE WHEN cardinality(a.acl) > 0 THEN a.acl END)) x
)
SELECT sect, obj, 90, CASE WHEN prefix <> '' THEN '0' WHEN verb = 'REVOKE' THEN '1' ELSE '2' END,
	format('%s%s %s%s ON %s %s %s%s%s;', prefix, verb, privs, cols, target,
	CASE verb WHEN 'GRANT' THEN 'TO' ELSE 'FROM' END, (SELECT r.name FROM roles r WHERE r.oid = grantee),
	CASE WHEN is_grantable AND verb = 'GRANT' THEN ' WITH GRANT OPTION' END,
	CASE WHEN grantor <> owner THEN ' GRANTED BY ' || (SELECT r.name FROM roles r WHERE r.oid = grantor) END)
  FROM (
	SELECT sect, obj, prefix, target, owner, verb, grantor, grantee, is_grantable,
	       string_agg(privilege_type, ', ' ORDER BY privilege_type COLLATE "C") AS privs, '' AS cols
	  FROM diff WHERE col IS NULL
	 GROUP BY sect, obj, prefix, target, owner, verb, grantor, grantee, is_grantable
	UNION ALL
	SELECT sect, obj, prefix, target, owner, verb, grantor, grantee, is_grantable, privilege_type,
	       ' (' || string_agg(quote_ident(col), ', ' ORDER BY colnum) || ')'
	  FROM diff WHERE col IS NOT NULL
	 GROUP BY sect, obj, prefix, target, owner, verb, grantor, grantee, is_grantable, privilege_type
  ) g`},
}
