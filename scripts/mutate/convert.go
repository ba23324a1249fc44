package main

import (
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
)

// A diffHunk is one hunk of a unified diff.
type diffHunk struct {
	file     string
	oldStart int      // 1-based line of its first old line (or the line before, when it has none)
	lines    []string // ' ', '-', '+'
}

// parseDiff reads a git diff's hunks.
func parseDiff(patch string) ([]diffHunk, error) {
	var out []diffHunk
	file := ""
	for line := range strings.Lines(patch) {
		line = strings.TrimSuffix(line, "\n")
		switch {
		case strings.HasPrefix(line, "diff --git a/"):
			file = strings.Fields(strings.TrimPrefix(line, "diff --git a/"))[0]
		case strings.HasPrefix(line, "--- "), strings.HasPrefix(line, "+++ "), strings.HasPrefix(line, "index "):
		case strings.HasPrefix(line, "@@ -"):
			spec := strings.Fields(line)[1] // -l,n
			l, _, _ := strings.Cut(strings.TrimPrefix(spec, "-"), ",")
			n, err := strconv.Atoi(l)
			if err != nil {
				return nil, fmt.Errorf("hunk header %q", line)
			}
			out = append(out, diffHunk{file: file, oldStart: n})
		case strings.HasPrefix(line, `\`): // \ No newline at end of file
		case len(out) > 0 && line == "":
			out[len(out)-1].lines = append(out[len(out)-1].lines, " ")
		case len(out) > 0 && (line[0] == ' ' || line[0] == '-' || line[0] == '+'):
			out[len(out)-1].lines = append(out[len(out)-1].lines, line)
		default:
			return nil, fmt.Errorf("unexpected diff line %q", line)
		}
	}
	return out, nil
}

// applyDiff applies a unified diff exactly (by its line numbers) to the
// files of t: what git apply would make, to check a conversion against.
func applyDiff(t *tree, hunks []diffHunk) (map[string]string, error) {
	byFile := map[string][]diffHunk{}
	var order []string
	for _, h := range hunks {
		if _, ok := byFile[h.file]; !ok {
			order = append(order, h.file)
		}
		byFile[h.file] = append(byFile[h.file], h)
	}
	out := map[string]string{}
	for _, f := range order {
		src, err := t.read(f)
		if err != nil {
			return nil, err
		}
		lines := strings.Split(src, "\n")
		var res []string
		next := 0 // the next old line (0-based) to copy
		for _, h := range byFile[f] {
			start, err := place(lines, h)
			if err != nil {
				return nil, err
			}
			res = append(res, lines[next:start]...)
			i := start
			for _, l := range h.lines {
				switch l[0] {
				case ' ':
					if norm(lines[i]) != norm(l[1:]) {
						return nil, fmt.Errorf("%s:%d: the diff's context %q is %q in the tree", f, i+1, l[1:], lines[i])
					}
					res = append(res, lines[i])
					i++
				case '-':
					i++
				case '+':
					res = append(res, l[1:])
				}
			}
			next = i
		}
		res = append(res, lines[next:]...)
		out[f] = strings.Join(res, "\n")
	}
	return out, nil
}

// place returns the 0-based line where a diff hunk's old lines begin in
// lines: where they all are, nearest the line the hunk names (git apply
// finds a hunk that moved the same way).
func place(lines []string, dh diffHunk) (int, error) {
	var old []string
	for _, l := range dh.lines {
		if l[0] != '+' {
			old = append(old, norm(l[1:]))
		}
	}
	want := dh.oldStart - 1
	if len(old) == 0 {
		return dh.oldStart, nil
	}
	best := -1
	for at := 0; at+len(old) <= len(lines); at++ {
		ok := true
		for k, o := range old {
			if norm(lines[at+k]) != o {
				ok = false
				break
			}
		}
		if ok && (best < 0 || abs(at-want) < abs(best-want)) {
			best = at
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("%s: the hunk at line %d does not apply", dh.file, dh.oldStart)
	}
	return best, nil
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// Convert turns a .patch into anchored hunks against the tree at root,
// where the patch applies: each diff hunk keeps its changed lines and only
// as much context, from inside the declaration they change, as makes its
// snippet occur once there. It checks that the anchored mutant makes what
// the patch makes.
func Convert(root string, m *Mutant) (*Mutant, error) {
	hunks, err := parseDiff(m.Patch)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.Path, err)
	}
	t := &tree{root: root, changed: map[string]string{}}
	out := &Mutant{Path: m.Path, Num: m.Num, Name: m.Name, Header: m.Header}
	// Last hunk first: each is anchored in the file as the ones below it
	// left it, and the line numbers of those above still hold. (A mutant
	// that moves a line up finds the place it leaves before the place it
	// goes.)
	for i := len(hunks) - 1; i >= 0; i-- {
		dh := hunks[i]
		h, err := anchor(t, dh)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", m.Name, dh.file, err)
		}
		file, src, first, last, err := t.locate(h)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.Name, err)
		}
		if t.changed[file], err = applyHunk(file, src, h, first, last); err != nil {
			return nil, fmt.Errorf("%s: %w", m.Name, err)
		}
		out.Hunks = append(out.Hunks, h)
	}
	want, err := applyDiff(&tree{root: root}, hunks)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.Name, err)
	}
	got, err := Apply(root, out)
	if err != nil {
		return nil, err
	}
	for f, w := range want {
		if same(f, got[f], w) {
			continue
		}
		return nil, fmt.Errorf("%s: %s: the anchored mutant does not make what the patch makes", m.Name, f)
	}
	return out, nil
}

// same compares two versions of a file as a build sees them: Go formatted,
// anything else by its non-blank lines.
func same(name, a, b string) bool {
	if strings.HasSuffix(name, ".go") {
		fa, ea := format.Source([]byte(a))
		fb, eb := format.Source([]byte(b))
		return ea == nil && eb == nil && string(fa) == string(fb)
	}
	return strings.Join(nonBlank(a), "\n") == strings.Join(nonBlank(b), "\n")
}

func nonBlank(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		if n := norm(l); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// anchor makes one diff hunk an anchored one.
func anchor(t *tree, dh diffHunk) (Hunk, error) {
	src, err := t.read(dh.file)
	if err != nil {
		return Hunk{}, err
	}
	lines := strings.Split(src, "\n")
	// The changed lines, without the diff's outer context.
	i0, i1 := -1, -1
	for i, l := range dh.lines {
		if l[0] != ' ' {
			if i0 < 0 {
				i0 = i
			}
			i1 = i
		}
	}
	if i0 < 0 {
		return Hunk{}, fmt.Errorf("a hunk that changes nothing")
	}
	// The old lines (0-based) the changed part spans: [lo, hi]; for
	// additions only, lo = the line after them, hi = lo-1.
	old, err := place(lines, dh)
	if err != nil {
		return Hunk{}, err
	}
	lo := -1
	for i, l := range dh.lines {
		if i == i0 {
			lo = old
		}
		if l[0] != '+' {
			old++
		}
		if i == i1 {
			break
		}
	}
	hi := old - 1
	body := append([]string{}, dh.lines[i0:i1+1]...)

	h := Hunk{File: dh.file}
	first, last := 0, len(lines)-1
	if strings.HasSuffix(dh.file, ".go") {
		decl, f, l, err := enclosing(dh.file, src, min(lo, hi), max(lo, hi))
		if err != nil {
			return Hunk{}, err
		}
		if decl != "" {
			h.Decl, first, last = decl, f, l
		}
	}
	// Context from the file, inside [first, last], until the snippet is
	// found once: above first, then below, in turn.
	above, below := lo-1, hi+1
	for turn := 0; ; turn++ {
		h.Lines = body
		want := snippet(h)
		if len(want) > 0 {
			if _, at := find(lines, first, last, want); len(at) == 1 {
				return h, nil
			}
		}
		canAbove, canBelow := above >= first, below <= last
		if !canAbove && !canBelow {
			return Hunk{}, fmt.Errorf("lines %d-%d: no context makes the snippet unique in %s %s", lo+1, hi+1, dh.file, h.Decl)
		}
		if canAbove && (turn%2 == 0 || !canBelow) {
			body = append([]string{" " + lines[above]}, body...)
			above--
		} else {
			body = append(body, " "+lines[below])
			below++
		}
	}
}

// enclosing names the top-level declaration of a Go file that holds lines
// lo to hi (0-based), with its first and last line; "" if none holds them.
func enclosing(name, src string, lo, hi int) (string, int, int, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return "", 0, 0, err
	}
	lineOf := func(p token.Pos) int { return fset.Position(p).Line - 1 }
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if lineOf(d.Pos()) <= lo && hi <= lineOf(d.End()) {
				key := "func " + d.Name.Name
				if r := recvType(d); r != "" {
					star := ""
					if _, ok := d.Recv.List[0].Type.(*ast.StarExpr); ok {
						star = "*"
					}
					key = fmt.Sprintf("func (%s%s).%s", star, r, d.Name.Name)
				}
				return key, lineOf(d.Pos()), lineOf(d.End()), nil
			}
		case *ast.GenDecl:
			if d.Tok == token.IMPORT || lineOf(d.Pos()) > lo || hi > lineOf(d.End()) {
				continue
			}
			var n ast.Node = d
			var name string
			for _, s := range d.Specs {
				if d.Lparen.IsValid() && (lineOf(s.Pos()) > lo || hi > lineOf(s.End())) {
					continue
				}
				switch s := s.(type) {
				case *ast.TypeSpec:
					name = s.Name.Name
				case *ast.ValueSpec:
					name = s.Names[0].Name
				}
				if d.Lparen.IsValid() {
					n = s
				}
				break
			}
			if name == "" {
				return "", 0, 0, nil
			}
			return d.Tok.String() + " " + name, lineOf(n.Pos()), lineOf(n.End()), nil
		}
	}
	return "", 0, 0, nil
}
