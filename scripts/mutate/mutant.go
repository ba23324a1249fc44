// Command mutate reads, applies and converts the project's mutants
// (docs/mutants.md): each mutants/NNN-name.mutant breaks one claimed rule
// on purpose, anchored to a declaration and a snippet of source rather than
// to line numbers, so that moving or reformatting the code around it never
// stales it. Plain patches (mutants/NNN-name.patch, a `git diff` after the
// same header lines) still run; scripts/mutants.sh applies those with git.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A Mutant is one mutants/ file: its header lines and either anchored
// hunks (a .mutant) or a git diff (a .patch).
type Mutant struct {
	Path   string   // as given
	Num    int      // the number its name starts with
	Name   string   // the file name without its extension
	Header []string // "# key: value" lines, as written
	Hunks  []Hunk   // a .mutant's changes, applied in order
	Patch  string   // a .patch's diff
}

// A Hunk changes one snippet inside one declaration of one file:
//
//	@@ store/runs.go func (*Runs).OpenRun
//	 	if n > limit {          (context: kept)
//	-		return errFull          (removed)
//	+		return nil              (added)
//
// The snippet is the hunk's context and removed lines; it must occur once
// in the declaration (lines compared with their runs of white space
// collapsed, blank lines skipped). A Go declaration is looked up by name in
// the file and, when it has moved, in the other files of its package.
type Hunk struct {
	File  string   // slash path from the repository's root
	Decl  string   // "" (the whole file), "func F", "func (*T).M", "type T", "var V", "const C"
	Lines []string // each begins with ' ', '-' or '+'
}

// HeaderValues returns the values of the "# key:" lines.
func (m *Mutant) HeaderValues(key string) []string {
	var out []string
	for _, h := range m.Header {
		if v, ok := strings.CutPrefix(h, "# "+key+":"); ok {
			out = append(out, strings.TrimSpace(v))
		}
	}
	return out
}

// Files returns the paths the mutant changes, from the repository's root.
func (m *Mutant) Files() []string {
	var out []string
	seen := map[string]bool{}
	add := func(f string) {
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	for _, h := range m.Hunks {
		add(h.File)
	}
	for line := range strings.Lines(m.Patch) {
		if rest, ok := strings.CutPrefix(line, "diff --git a/"); ok {
			add(strings.Fields(rest)[0])
		}
	}
	return out
}

// ReadMutant reads and parses a mutant file.
func ReadMutant(path string) (*Mutant, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseMutant(path, string(raw))
}

// ParseMutant parses a mutant's text; path names it (its number and name).
func ParseMutant(path, text string) (*Mutant, error) {
	base := filepath.Base(path)
	m := &Mutant{Path: path, Name: strings.TrimSuffix(base, filepath.Ext(base))}
	numText, _, _ := strings.Cut(m.Name, "-")
	n, err := strconv.Atoi(numText)
	if err != nil {
		return nil, fmt.Errorf("%s: the name must start with the mutant's number and a dash (NNN-name)", path)
	}
	m.Num = n
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	lineNo := 0
	var body strings.Builder
	inBody, inPatch := false, false
	for sc.Scan() {
		line := sc.Text()
		lineNo++
		switch {
		case inPatch:
			body.WriteString(line + "\n")
		case !inBody && strings.HasPrefix(line, "diff --git "):
			inPatch = true
			body.WriteString(line + "\n")
		case strings.HasPrefix(line, "@@ ") && !strings.HasPrefix(line, "@@ -"):
			inBody = true
			fields := strings.Fields(strings.TrimPrefix(line, "@@ "))
			if len(fields) == 0 {
				return nil, fmt.Errorf("%s:%d: a hunk's header is \"@@ FILE [DECLARATION]\"", path, lineNo)
			}
			m.Hunks = append(m.Hunks, Hunk{File: fields[0], Decl: strings.Join(fields[1:], " ")})
		case inBody:
			if len(m.Hunks) == 0 {
				return nil, fmt.Errorf("%s:%d: a line before the first \"@@ FILE\"", path, lineNo)
			}
			h := &m.Hunks[len(m.Hunks)-1]
			switch {
			case line == "":
				h.Lines = append(h.Lines, " ")
			case line[0] == ' ' || line[0] == '-' || line[0] == '+':
				h.Lines = append(h.Lines, line)
			default:
				return nil, fmt.Errorf("%s:%d: a hunk's line begins with ' ', '-' or '+'", path, lineNo)
			}
		case strings.HasPrefix(line, "# "):
			m.Header = append(m.Header, line)
		case strings.TrimSpace(line) == "":
		default:
			return nil, fmt.Errorf("%s:%d: expected a \"# key: value\" header line, \"@@ FILE\" or \"diff --git\"", path, lineNo)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	m.Patch = body.String()
	if m.Patch == "" && len(m.Hunks) == 0 {
		return nil, fmt.Errorf("%s: no change: neither \"@@ FILE\" hunks nor a \"diff --git\"", path)
	}
	if m.Patch != "" && len(m.Hunks) > 0 {
		return nil, errors.New(path + ": both anchored hunks and a git diff")
	}
	for i, h := range m.Hunks {
		if err := h.check(); err != nil {
			return nil, fmt.Errorf("%s: hunk %d (%s %s): %w", path, i+1, h.File, h.Decl, err)
		}
	}
	return m, nil
}

func (h *Hunk) check() error {
	var old, changed int
	for _, l := range h.Lines {
		if l[0] != '+' && norm(l[1:]) != "" {
			old++
		}
		if l[0] != ' ' {
			changed++
		}
	}
	if changed == 0 {
		return errors.New("changes nothing (no '-' or '+' line)")
	}
	if old == 0 {
		return errors.New("has no snippet to find: give a context line (' ') or a removed one ('-') that is not blank")
	}
	return nil
}

// Format writes the mutant back in the anchored format.
func (m *Mutant) Format() string {
	var b strings.Builder
	for _, h := range m.Header {
		b.WriteString(h + "\n")
	}
	for _, h := range m.Hunks {
		b.WriteString("@@ " + h.File)
		if h.Decl != "" {
			b.WriteString(" " + h.Decl)
		}
		b.WriteString("\n")
		for _, l := range h.Lines {
			b.WriteString(strings.TrimRight(l, " \t") + "\n")
		}
	}
	if m.Patch != "" {
		b.WriteString(m.Patch)
	}
	return b.String()
}

// norm is a line as the snippet matcher compares it: its runs of white
// space collapsed to one space, none at either end.
func norm(s string) string { return strings.Join(strings.Fields(s), " ") }
