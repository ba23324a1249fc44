package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// errNoDecl: the declaration a hunk names is not in the file.
var errNoDecl = errors.New("no such declaration")

// A declKey is a hunk's parsed Decl.
type declKey struct {
	kind string // "func", "type", "var", "const"
	recv string // a method's receiver type, without * or type parameters
	name string
}

func parseDecl(s string) (declKey, error) {
	kind, rest, ok := strings.Cut(s, " ")
	rest = strings.TrimSpace(rest)
	if !ok || rest == "" {
		return declKey{}, fmt.Errorf("declaration %q: want \"func F\", \"func (*T).M\", \"type T\", \"var V\" or \"const C\"", s)
	}
	switch kind {
	case "type", "var", "const":
		return declKey{kind: kind, name: rest}, nil
	case "func":
		if i := strings.LastIndex(rest, "."); i >= 0 {
			recv := strings.Trim(rest[:i], "()*")
			return declKey{kind: kind, recv: recv, name: rest[i+1:]}, nil
		}
		return declKey{kind: kind, name: rest}, nil
	}
	return declKey{}, fmt.Errorf("declaration %q: %q is not func, type, var or const", s, kind)
}

func (k declKey) String() string {
	if k.recv != "" {
		return fmt.Sprintf("func (%s).%s", k.recv, k.name)
	}
	return k.kind + " " + k.name
}

// recvType is the name of a method's receiver type.
func recvType(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	t := fd.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.ParenExpr:
			t = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// findDecl returns the node a key names in a parsed file: a *ast.FuncDecl,
// an *ast.GenDecl (unparenthesised) or an ast.Spec.
func findDecl(f *ast.File, k declKey) ast.Node {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if k.kind == "func" && d.Name.Name == k.name && recvType(d) == k.recv {
				return d
			}
		case *ast.GenDecl:
			if d.Tok.String() != k.kind {
				continue
			}
			for _, s := range d.Specs {
				var names []*ast.Ident
				switch s := s.(type) {
				case *ast.TypeSpec:
					names = []*ast.Ident{s.Name}
				case *ast.ValueSpec:
					names = s.Names
				}
				for _, n := range names {
					if n.Name == k.name {
						if !d.Lparen.IsValid() {
							return d
						}
						return s
					}
				}
			}
		}
	}
	return nil
}

// declLines returns the first and last line (0-based) of the declaration
// key names in a Go source, or errNoDecl.
func declLines(name, src string, k declKey) (int, int, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return 0, 0, fmt.Errorf("%s does not parse: %w", name, err)
	}
	n := findDecl(f, k)
	if n == nil {
		return 0, 0, errNoDecl
	}
	return fset.Position(n.Pos()).Line - 1, fset.Position(n.End()).Line - 1, nil
}

// snippet returns the hunk's snippet: its context and removed lines that
// are not blank, as norm compares them.
func snippet(h Hunk) []string {
	var want []string
	for _, l := range h.Lines {
		if l[0] != '+' && norm(l[1:]) != "" {
			want = append(want, norm(l[1:]))
		}
	}
	return want
}

// find returns the non-blank lines of lines[first..last] and each index
// into them where want begins.
func find(lines []string, first, last int, want []string) (cand, at []int) {
	for i := first; i <= last && i < len(lines); i++ {
		if norm(lines[i]) != "" {
			cand = append(cand, i)
		}
	}
	for p := 0; len(want) > 0 && p+len(want) <= len(cand); p++ {
		ok := true
		for k, w := range want {
			if norm(lines[cand[p+k]]) != w {
				ok = false
				break
			}
		}
		if ok {
			at = append(at, p)
		}
	}
	return cand, at
}

// applyHunk applies h to src, a file named name, whose hunk applies to
// lines first to last (0-based, inclusive). A Go file is formatted after.
func applyHunk(name, src string, h Hunk, first, last int) (string, error) {
	lines := strings.Split(src, "\n")
	want := snippet(h)
	cand, at := find(lines, first, last, want)
	where := name
	if h.Decl != "" {
		where += " " + h.Decl
	}
	switch len(at) {
	case 0:
		return "", fmt.Errorf("the snippet (%q…) is not in %s: the code changed; refresh the mutant", want[0], where)
	case 1:
	default:
		return "", fmt.Errorf("the snippet (%q…) is in %s %d times: give it more context", want[0], where, len(at))
	}
	p := at[0]
	var out []string
	k := 0
	for _, l := range h.Lines {
		blank := norm(l[1:]) == ""
		switch {
		case l[0] == '+':
			out = append(out, l[1:])
		case blank:
			if l[0] == ' ' {
				out = append(out, "")
			}
		case l[0] == ' ':
			out = append(out, lines[cand[p+k]])
			k++
		default: // '-'
			k++
		}
	}
	start, end := cand[p], cand[p+len(want)-1]
	res := strings.Join(append(append(append([]string{}, lines[:start]...), out...), lines[end+1:]...), "\n")
	if strings.HasSuffix(name, ".go") {
		b, err := format.Source([]byte(res))
		if err != nil {
			return "", fmt.Errorf("%s with the mutant does not parse: %w", where, err)
		}
		res = string(b)
	}
	return res, nil
}

// A tree reads a checkout's files and keeps the changes made to them.
type tree struct {
	root    string
	changed map[string]string // slash path -> new content
}

func (t *tree) read(p string) (string, error) {
	if s, ok := t.changed[p]; ok {
		return s, nil
	}
	b, err := os.ReadFile(filepath.Join(t.root, filepath.FromSlash(p)))
	return string(b), err
}

// locate finds the file and lines a hunk applies to: for a Go declaration
// its file and, when it has moved, another file of the same package.
func (t *tree) locate(h Hunk) (file, src string, first, last int, err error) {
	src, rerr := t.read(h.File)
	if h.Decl == "" {
		if rerr != nil {
			return "", "", 0, 0, rerr
		}
		return h.File, src, 0, strings.Count(src, "\n"), nil
	}
	if !strings.HasSuffix(h.File, ".go") {
		return "", "", 0, 0, fmt.Errorf("%s: only a Go file's hunk names a declaration", h.File)
	}
	k, err := parseDecl(h.Decl)
	if err != nil {
		return "", "", 0, 0, err
	}
	if rerr == nil {
		first, last, err = declLines(h.File, src, k)
		if err == nil {
			return h.File, src, first, last, nil
		}
		if !errors.Is(err, errNoDecl) {
			return "", "", 0, 0, err
		}
	}
	// Moved: the other files of the package.
	dir := path.Dir(h.File)
	ents, derr := os.ReadDir(filepath.Join(t.root, filepath.FromSlash(dir)))
	if derr != nil {
		return "", "", 0, 0, fmt.Errorf("%s %s: %w", h.File, h.Decl, derr)
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") && path.Join(dir, n) != h.File {
			names = append(names, path.Join(dir, n))
		}
	}
	sort.Strings(names)
	for _, n := range names {
		s, err := t.read(n)
		if err != nil {
			return "", "", 0, 0, err
		}
		first, last, err := declLines(n, s, k)
		if err == nil {
			return n, s, first, last, nil
		}
		if !errors.Is(err, errNoDecl) {
			return "", "", 0, 0, err
		}
	}
	return "", "", 0, 0, fmt.Errorf("%s is in no file of package %s: refresh the mutant", k, dir)
}

// Apply applies a .mutant's hunks to the tree at root, in memory: it
// returns the new content of each file it changes (slash paths).
func Apply(root string, m *Mutant) (map[string]string, error) {
	if len(m.Hunks) == 0 {
		return nil, fmt.Errorf("%s is a plain patch: apply it with git apply", m.Path)
	}
	t := &tree{root: root, changed: map[string]string{}}
	for i, h := range m.Hunks {
		file, src, first, last, err := t.locate(h)
		if err != nil {
			return nil, fmt.Errorf("%s: hunk %d: %w", m.Name, i+1, err)
		}
		out, err := applyHunk(file, src, h, first, last)
		if err != nil {
			return nil, fmt.Errorf("%s: hunk %d: %w", m.Name, i+1, err)
		}
		t.changed[file] = out
	}
	return t.changed, nil
}

// write writes changed files under root.
func write(root string, changed map[string]string) error {
	for p, s := range changed {
		if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(p)), []byte(s), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Refile names in each of m's hunks the file its declaration is in now,
// where a move put it; it reports whether any hunk changed.
func Refile(root string, m *Mutant) (bool, error) {
	t := &tree{root: root, changed: map[string]string{}}
	moved := false
	for i, h := range m.Hunks {
		if h.Decl == "" {
			continue
		}
		file, _, _, _, err := t.locate(h)
		if err != nil {
			return false, fmt.Errorf("%s: hunk %d: %w", m.Name, i+1, err)
		}
		if file != h.File {
			m.Hunks[i].File = file
			moved = true
		}
	}
	return moved, nil
}
