package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// writeTree writes files (slash path -> content) under a new directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, s := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func mustParse(t *testing.T, name, text string) *Mutant {
	t.Helper()
	m, err := ParseMutant(name, text)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

const limitGo = `package limit

// Over says whether n is over the limit.
func Over(n, limit int) bool {
	if n > limit {
		return true
	}
	return false
}

func Under(n, limit int) bool {
	if n > limit {
		return false
	}
	return true
}
`

const overMutant = `# claim: a call at the limit is not over it
# mutation: at the limit counts as over
# invariant: I1
# test: ./limit/ ^TestOver$
@@ limit/limit.go func Over
-	if n > limit {
+	if n >= limit {
`

func TestParseMutant(t *testing.T) {
	m := mustParse(t, "mutants/07-at-limit.mutant", overMutant)
	if m.Num != 7 || m.Name != "07-at-limit" {
		t.Errorf("Num, Name = %d, %q; want 7, 07-at-limit", m.Num, m.Name)
	}
	if got := m.HeaderValues("test"); !slices.Equal(got, []string{"./limit/ ^TestOver$"}) {
		t.Errorf("test lines = %q", got)
	}
	if len(m.Hunks) != 1 || m.Hunks[0].File != "limit/limit.go" || m.Hunks[0].Decl != "func Over" || len(m.Hunks[0].Lines) != 2 {
		t.Errorf("hunks = %+v", m.Hunks)
	}
	if got := m.Format(); got != overMutant {
		t.Errorf("Format:\n%s\nwant\n%s", got, overMutant)
	}
	p := mustParse(t, "mutants/8-x.patch", "# test: ./a/ ^T$\ndiff --git a/a/a.go b/a/a.go\n--- a/a/a.go\n+++ b/a/a.go\n@@ -1 +1 @@\n-x\n+y\n")
	if !slices.Equal(p.Files(), []string{"a/a.go"}) || len(p.Hunks) != 0 {
		t.Errorf("a patch: files %q, hunks %d", p.Files(), len(p.Hunks))
	}
	for name, bad := range map[string]string{
		"no number":        "mutants/x.mutant\n" + overMutant,
		"no change":        "# test: ./a/ ^T$\n",
		"only context":     "# test: ./a/ ^T$\n@@ a.go func F\n \treturn\n",
		"only added lines": "# test: ./a/ ^T$\n@@ a.go func F\n+\treturn\n",
		"stray line":       "# test: ./a/ ^T$\nhello\n",
	} {
		path := "mutants/9-x.mutant"
		if name == "no number" {
			path, bad = "mutants/x.mutant", overMutant
		}
		if _, err := ParseMutant(path, bad); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestApplyFindsTheSnippetInItsDeclaration(t *testing.T) {
	root := writeTree(t, map[string]string{"limit/limit.go": limitGo})
	got, err := Apply(root, mustParse(t, "07-x.mutant", overMutant))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(limitGo, "if n > limit {\n\t\treturn true", "if n >= limit {\n\t\treturn true", 1)
	if got["limit/limit.go"] != want {
		t.Errorf("applied:\n%s\nwant\n%s", got["limit/limit.go"], want)
	}
	// The same snippet is in Under too: anchored to Over, it is found once.
	if err := write(root, got); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(root, mustParse(t, "07-x.mutant", overMutant)); err == nil || !strings.Contains(err.Error(), "refresh the mutant") {
		t.Errorf("applied twice: %v, want the snippet not found", err)
	}
}

func TestApplySurvivesAMoveAndAReformat(t *testing.T) {
	// Over moved to another file of its package, reindented and with a
	// blank line inside the snippet's span.
	moved := "package limit\n\nfunc Over(n, limit int) bool {\n\n    if   n > limit {\n\t\treturn true\n\t}\n\treturn false\n}\n"
	root := writeTree(t, map[string]string{
		"limit/limit.go": "package limit\n",
		"limit/over.go":  moved,
	})
	got, err := Apply(root, mustParse(t, "07-x.mutant", overMutant))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got["limit/over.go"], "if n >= limit {") || len(got) != 1 {
		t.Errorf("applied to %v:\n%s", keys(got), got["limit/over.go"])
	}
	m := mustParse(t, "07-x.mutant", overMutant)
	if moved, err := Refile(root, m); err != nil || !moved || m.Hunks[0].File != "limit/over.go" {
		t.Errorf("Refile: %v, %v; the hunk names %s, want limit/over.go", moved, err, m.Hunks[0].File)
	}
}

func TestApplySaysWhatIsWrong(t *testing.T) {
	root := writeTree(t, map[string]string{"limit/limit.go": limitGo})
	for name, c := range map[string]struct{ mutant, want string }{
		"ambiguous":      {"# test: x\n@@ limit/limit.go\n-\tif n > limit {\n+\tif n >= limit {\n", "2 times"},
		"missing decl":   {"# test: x\n@@ limit/limit.go func Gone\n-\tif n > limit {\n+\tif n >= limit {\n", "no file of package limit"},
		"missing code":   {"# test: x\n@@ limit/limit.go func Over\n-\tif n < limit {\n+\tif n >= limit {\n", "refresh the mutant"},
		"does not parse": {"# test: x\n@@ limit/limit.go func Over\n-\tif n > limit {\n+\tif n >= limit {{\n", "does not parse"},
		"method form":    {"# test: x\n@@ limit/limit.go func (*T).Over\n-\tif n > limit {\n+\tif n >= limit {\n", "no file of package limit"},
	} {
		_, err := Apply(root, mustParse(t, "07-x.mutant", c.mutant))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}

func TestConvertAnchorsAPatchThatMoved(t *testing.T) {
	// The patch's line numbers are 3 lines off (code was added above), and
	// it moves a line up: its hunks are found where they are.
	src := "package limit\n\n// added\n// added\n// added\n" + limitGo[len("package limit\n"):] +
		"\nfunc Both(n int) int {\n\ta := n + 1\n\tb := n * 2\n\treturn a + b\n}\n"
	root := writeTree(t, map[string]string{"limit/limit.go": src})
	patch := `# test: ./limit/ ^TestOver$
diff --git a/limit/limit.go b/limit/limit.go
--- a/limit/limit.go
+++ b/limit/limit.go
@@ -4,7 +4,7 @@ package limit
 // Over says whether n is over the limit.
 func Over(n, limit int) bool {
-	if n > limit {
+	if n >= limit {
 		return true
 	}
 	return false
@@ -18,6 +18,6 @@ func Under(n, limit int) bool {
 func Both(n int) int {
+	b := n * 2
 	a := n + 1
-	b := n * 2
 	return a + b
 }
`
	m := mustParse(t, "mutants/5-x.patch", patch)
	a, err := Convert(root, m)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Hunks) != 2 || a.Hunks[1].Decl != "func Over" || a.Hunks[0].Decl != "func Both" {
		t.Fatalf("anchored:\n%s", a.Format())
	}
	// Only as much context as makes each snippet unique in its function.
	if got := a.Hunks[1].Lines; !slices.Equal(got, []string{"-\tif n > limit {", "+\tif n >= limit {"}) {
		t.Errorf("Over's hunk: %q", got)
	}
	again := mustParse(t, "mutants/5-x.mutant", a.Format())
	got, err := Apply(root, again)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got["limit/limit.go"], "\tb := n * 2\n\ta := n + 1\n\treturn a + b") {
		t.Errorf("converted mutant made:\n%s", got["limit/limit.go"])
	}
}

func TestChangedSelectsByFilePackageAndTest(t *testing.T) {
	over := mustParse(t, "mutants/1-over.mutant", overMutant)
	sql := mustParse(t, "mutants/2-sql.mutant", "# test: ./store/ ^TestX$\n@@ migrations/functions/f.sql\n-a\n+b\n")
	ms := []*Mutant{over, sql}
	for name, c := range map[string]struct {
		files []string
		want  []string
	}{
		"its file":                     {[]string{"limit/limit.go"}, []string{over.Path}},
		"its package (the func moved)": {[]string{"limit/other.go"}, []string{over.Path}},
		"its test's package":           {[]string{"store/x_test.go"}, []string{sql.Path}},
		"the mutant itself":            {[]string{"mutants/2-sql.mutant"}, []string{sql.Path}},
		"another SQL file":             {[]string{"migrations/functions/g.sql"}, nil},
		"nothing of theirs":            {[]string{"README.md"}, nil},
	} {
		var got []string
		for _, m := range Changed(ms, c.files) {
			got = append(got, m.Path)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", name, got, c.want)
		}
	}
}

// TestSchemataSwitchesEachMutantOn builds a module with mutants compiled
// in and runs it with each switched on, and none.
func TestSchemataSwitchesEachMutantOn(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the go command is needed to build the schemata: put it on PATH")
	}
	src := `package main

import (
	"fmt"
	"strings"
)

type T struct{ n int }

// Over: two mutants change it.
func Over(n, limit int) bool {
	if n > limit {
		return true
	}
	return false
}

// Join: variadic, and a parameter without a use.
func Join(_ string, parts ...string) string {
	return strings.Join(parts, "+")
}

// Add: a method whose receiver has no name and a result with one.
func (*T) Add(a int, _ int) (sum int) {
	sum = a + 1
	return
}

// Say: no results.
func (t T) Say(out *[]string) {
	*out = append(*out, fmt.Sprint("n=", t.n))
}

// Max: type parameters.
func Max[E int | float64](a, b E) E {
	if a > b {
		return a
	}
	return b
}

func main() {
	var said []string
	T{n: 3}.Say(&said)
	fmt.Println(Over(5, 5), Join("x", "a", "b"), (&T{}).Add(1, 0), said, Max(2, 7))
}
`
	root := writeTree(t, map[string]string{"go.mod": "module example.com/m\n\ngo 1.26\n", "main.go": src})
	var ms []*Mutant
	for _, text := range []string{
		"# test: x\n@@ main.go func Over\n-\tif n > limit {\n+\tif n >= limit {\n",
		"# test: x\n@@ main.go func Over\n-\t\treturn true\n+\t\treturn n > 0\n \t}\n-\treturn false\n+\treturn true\n",
		"# test: x\n@@ main.go func Join\n-\treturn strings.Join(parts, \"+\")\n+\treturn strings.Join(parts, \"-\")\n",
		"# test: x\n@@ main.go func (*T).Add\n-\tsum = a + 1\n+\tsum = a + 2\n",
		"# test: x\n@@ main.go func (T).Say\n-\t*out = append(*out, fmt.Sprint(\"n=\", t.n))\n+\t*out = append(*out, fmt.Sprint(\"m=\", t.n))\n",
		"# test: x\n@@ main.go func Max\n-\tif a > b {\n+\tif a < b {\n",
		"# test: x\n@@ go.mod\n-go 1.26\n+go 1.25\n", // not Go: left out
	} {
		ms = append(ms, mustParse(t, filepath.Join("mutants", string(rune('1'+len(ms)))+"-m.mutant"), text))
	}
	nums, err := Schemata(root, ms)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(nums, []int{1, 2, 3, 4, 5, 6}) {
		t.Errorf("schemata holds %v, want 1-6 (7 changes go.mod)", nums)
	}
	exe := filepath.Join(t.TempDir(), "m")
	build := exec.Command(goBin, "build", "-o", exe, ".")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the schemata tree does not build: %v\n%s", err, out)
	}
	for mutant, want := range map[string]string{
		"":  "false a+b 2 [n=3] 7",
		"0": "false a+b 2 [n=3] 7",
		"1": "true a+b 2 [n=3] 7",
		"2": "true a+b 2 [n=3] 7",
		"3": "false a-b 2 [n=3] 7",
		"4": "false a+b 3 [n=3] 7",
		"5": "false a+b 2 [m=3] 7",
		"6": "false a+b 2 [n=3] 2",
		"7": "false a+b 2 [n=3] 7",
	} {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), EnvMutant+"="+mutant)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("%s=%q: %q, want %q", EnvMutant, mutant, got, want)
		}
	}
	// The original lines keep their numbers: the dispatch is on the
	// function's first line.
	out, err := os.ReadFile(filepath.Join(root, "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(out), "\n")
	for i, l := range strings.Split(src, "\n") {
		if !strings.HasPrefix(lines[i], strings.TrimRight(strings.SplitN(l, "(", 2)[0], " ")) {
			t.Errorf("line %d: %q, was %q", i+1, lines[i], l)
		}
	}
}

func TestBlameNamesTheMutantsWhoseCopiesFail(t *testing.T) {
	root := writeTree(t, map[string]string{".schemata": "store/a.go 100 120 12\nstore/a.go 122 130 13\n"})
	nums, ok, err := Blame(root, "# github.com/x/store\nstore/a.go:105:3: undefined: y\n./store/a.go:125:1: missing return\n")
	if err != nil || !ok || !slices.Equal(nums, []int{12, 13}) {
		t.Errorf("Blame = %v, %v, %v; want [12 13], true", nums, ok, err)
	}
	if _, ok, _ := Blame(root, "store/a.go:50:3: undefined: y\n"); ok {
		t.Error("an error outside every copy was blamed on a mutant")
	}
}

// TestTheProjectsMutantsApply: every mutant of the repository applies to
// it (make lint runs the same check).
func TestTheProjectsMutantsApply(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	paths, err := filepath.Glob(filepath.Join(root, "mutants", "*.mutant"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no mutants in %s/mutants: %v", root, err)
	}
	for _, p := range paths {
		m, err := ReadMutant(p)
		if err != nil {
			t.Error(err)
			continue
		}
		if _, err := Apply(root, m); err != nil {
			t.Error(err)
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// projectMutants reads every mutant of the repository.
func projectMutants(t *testing.T) (string, []*Mutant) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	paths, err := filepath.Glob(filepath.Join(root, "mutants", "*.*"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no mutants in %s/mutants: %v", root, err)
	}
	var ms []*Mutant
	for _, p := range paths {
		m, err := ReadMutant(p)
		if err != nil {
			t.Fatal(err)
		}
		m.Path = "mutants/" + filepath.Base(p)
		ms = append(ms, m)
	}
	return root, ms
}

// TestTheMutantsIndexIsCurrent: docs/mutants-index.md is what the
// mutants' headers say now.
func TestTheMutantsIndexIsCurrent(t *testing.T) {
	root, ms := projectMutants(t)
	got, err := os.ReadFile(filepath.Join(root, "docs", "mutants-index.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != Index(ms) {
		t.Error("docs/mutants-index.md is stale: run make mutants-index and commit it")
	}
}

// TestEveryMutantCitesWhereItsRuleIsWritten: each mutant's invariant
// header points at a page of the repository, and at a heading that is
// there.
func TestEveryMutantCitesWhereItsRuleIsWritten(t *testing.T) {
	root, ms := projectMutants(t)
	anchors := map[string]map[string]bool{}
	headingsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		a := map[string]bool{}
		raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(page)))
		if err == nil {
			fence := false
			for l := range strings.Lines(string(raw)) {
				if strings.HasPrefix(l, "```") {
					fence = !fence
				}
				if !fence && strings.HasPrefix(l, "#") {
					a[slug(strings.TrimLeft(strings.TrimSpace(l), "# "))] = true
				}
			}
		} else {
			a = nil
		}
		anchors[page] = a
		return a
	}
	cite := regexp.MustCompile(`((?:docs/)?[A-Za-z-]+\.md)(#[a-z0-9-]+)?`)
	for _, m := range ms {
		inv := strings.Join(m.HeaderValues("invariant"), " ")
		found := cite.FindAllStringSubmatch(inv, -1)
		if len(found) == 0 {
			t.Errorf("%s: its invariant (%q) cites no page of the repository (docs/ledger.md#iN-… for the ledger's rules)", m.Name, inv)
		}
		for _, c := range found {
			page := c[1]
			if strings.HasPrefix(page, "docs/") || page == "README.md" {
				heads := headingsOf(page)
				if heads == nil {
					t.Errorf("%s cites %s, which is not in the repository", m.Name, page)
				} else if c[2] != "" && !heads[c[2][1:]] {
					t.Errorf("%s cites %s%s: no such heading there", m.Name, page, c[2])
				}
			}
		}
	}
}

// slug is a heading's anchor as GitHub makes it.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
