package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

const usage = `usage: mutate COMMAND [ARGS]  (docs/mutants.md)

  apply ROOT MUTANT            apply a .mutant to the tree at ROOT
  check ROOT MUTANT...         every mutant parses and applies to ROOT (a .patch: git apply --check)
  files MUTANT                 the files a mutant changes
  refile ROOT MUTANT...        name in each hunk the file its declaration is in now (after a move)
  convert ROOT PATCH...        write each .patch as a .mutant anchored to the tree at ROOT, and remove the .patch
  schemata ROOT MUTANT...      compile every eligible mutant into the tree at ROOT; print their numbers
  blame ROOT LOG               the mutants a failed schemata build's LOG names (exit 3: it names other code too)
  changed ROOT MUTANT...       the mutants a change touches (the file names on stdin, one a line)
  index MUTANT...              the mutants index of docs/mutants.md, generated
`

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		var ec exitCode
		if errors.As(err, &ec) {
			os.Exit(int(ec))
		}
		os.Exit(1)
	}
}

type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("mutate", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	if err := fs.Parse(args); err != nil {
		return err
	}
	args = fs.Args()
	if len(args) == 0 {
		fs.Usage()
		return exitCode(2)
	}
	cmd, args := args[0], args[1:]
	need := func(n int) error {
		if len(args) < n {
			fs.Usage()
			return exitCode(2)
		}
		return nil
	}
	switch cmd {
	case "apply":
		if err := need(2); err != nil {
			return err
		}
		m, err := ReadMutant(args[1])
		if err != nil {
			return err
		}
		changed, err := Apply(args[0], m)
		if err != nil {
			return err
		}
		return write(args[0], changed)
	case "check":
		if err := need(2); err != nil {
			return err
		}
		var bad []string
		for _, p := range args[1:] {
			if err := check(args[0], p); err != nil {
				bad = append(bad, err.Error())
			}
		}
		if len(bad) > 0 {
			return errors.New(strings.Join(bad, "\n") + "\n(refresh each against the source it breaks: docs/mutants.md)")
		}
		return nil
	case "refile":
		if err := need(2); err != nil {
			return err
		}
		for _, p := range args[1:] {
			m, err := ReadMutant(p)
			if err != nil {
				return err
			}
			moved, err := Refile(args[0], m)
			if err != nil {
				return err
			}
			if moved {
				if err := os.WriteFile(p, []byte(m.Format()), 0o644); err != nil {
					return err
				}
				fmt.Fprintln(stdout, p)
			}
		}
		return nil
	case "files":
		if err := need(1); err != nil {
			return err
		}
		m, err := ReadMutant(args[0])
		if err != nil {
			return err
		}
		for _, f := range m.Files() {
			fmt.Fprintln(stdout, f)
		}
		return nil
	case "convert":
		if err := need(2); err != nil {
			return err
		}
		for _, p := range args[1:] {
			m, err := ReadMutant(p)
			if err != nil {
				return err
			}
			if m.Patch == "" {
				continue
			}
			a, err := Convert(args[0], m)
			if err != nil {
				return err
			}
			out := strings.TrimSuffix(p, filepath.Ext(p)) + ".mutant"
			if err := os.WriteFile(out, []byte(a.Format()), 0o644); err != nil {
				return err
			}
			if err := os.Remove(p); err != nil {
				return err
			}
		}
		return nil
	case "schemata":
		if err := need(2); err != nil {
			return err
		}
		ms, err := readAll(args[1:])
		if err != nil {
			return err
		}
		nums, err := Schemata(args[0], ms)
		if err != nil {
			return err
		}
		for _, n := range nums {
			fmt.Fprintln(stdout, n)
		}
		return nil
	case "blame":
		if err := need(2); err != nil {
			return err
		}
		log, err := os.ReadFile(args[1])
		if err != nil {
			return err
		}
		nums, ok, err := Blame(args[0], string(log))
		if err != nil {
			return err
		}
		for _, n := range nums {
			fmt.Fprintln(stdout, n)
		}
		if !ok {
			return exitCode(3)
		}
		return nil
	case "changed":
		if err := need(2); err != nil {
			return err
		}
		ms, err := readAll(args[1:])
		if err != nil {
			return err
		}
		raw, err := io.ReadAll(stdin)
		if err != nil {
			return err
		}
		for _, m := range Changed(ms, strings.Fields(string(raw))) {
			fmt.Fprintln(stdout, m.Path)
		}
		return nil
	case "index":
		if err := need(1); err != nil {
			return err
		}
		ms, err := readAll(args)
		if err != nil {
			return err
		}
		_, err = io.WriteString(stdout, Index(ms))
		return err
	}
	fs.Usage()
	return exitCode(2)
}

func readAll(paths []string) ([]*Mutant, error) {
	var ms []*Mutant
	for _, p := range paths {
		m, err := ReadMutant(p)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, nil
}

func check(root, p string) error {
	m, err := ReadMutant(p)
	if err != nil {
		return err
	}
	if m.Patch != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return err
		}
		out, err := exec.Command("git", "-C", root, "apply", "--check", abs).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s no longer applies: %s", p, strings.TrimSpace(string(out)))
		}
		return nil
	}
	_, err = Apply(root, m)
	return err
}

// Changed returns the mutants a change of files touches: a file one of
// them changes (for a Go declaration, any file of its package, where it
// may have moved), or a file of a package one of its test lines names.
func Changed(ms []*Mutant, files []string) []*Mutant {
	touched := map[string]bool{}
	dirs := map[string]bool{}
	for _, f := range files {
		f = path.Clean(filepath.ToSlash(f))
		touched[f] = true
		dirs[path.Dir(f)] = true
	}
	var out []*Mutant
	for _, m := range ms {
		hit := touched[path.Clean(filepath.ToSlash(m.Path))]
		for _, h := range m.Hunks {
			hit = hit || touched[h.File] || (h.Decl != "" && dirs[path.Dir(h.File)])
		}
		for _, f := range m.Files() {
			hit = hit || touched[f]
		}
		for _, t := range m.HeaderValues("test") {
			pkg := path.Clean(strings.TrimPrefix(strings.Fields(t + " ")[0], "./"))
			hit = hit || dirs[pkg]
		}
		if hit {
			out = append(out, m)
		}
	}
	return out
}

// Index is the table of every mutant: what it breaks, where, and the
// tests that must catch it.
func Index(ms []*Mutant) string {
	sorted := append([]*Mutant{}, ms...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Num < sorted[j].Num })
	var b strings.Builder
	b.WriteString("# Mutants: the index\n\n" +
		"Generated from the headers of mutants/ by `make mutants-index` (scripts/mutate): do not edit.\n" +
		"docs/mutants.md says how the mutants run and groups them by rule.\n\n")
	b.WriteString("| mutant | breaks | where | rule | tests |\n|---|---|---|---|---|\n")
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for _, m := range sorted {
		var where []string
		for _, h := range m.Hunks {
			w := "`" + h.File + "`"
			if h.Decl != "" {
				w = "`" + h.File + "` " + strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(h.Decl, "func "), "type "), "var "), "const ")
			}
			if len(where) == 0 || where[len(where)-1] != w {
				where = append(where, w)
			}
		}
		if len(m.Hunks) == 0 {
			for _, f := range m.Files() {
				where = append(where, "`"+f+"`")
			}
		}
		var tests []string
		for _, t := range m.HeaderValues("test") {
			f := strings.Fields(t)
			if len(f) == 2 {
				tests = append(tests, strings.Trim(f[1], "^$")+" ("+strings.Trim(f[0], "./")+")")
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", m.Name, cell(first(m.HeaderValues("mutation"))),
			cell(strings.Join(where, ", ")), cell(first(m.HeaderValues("invariant"))), cell(strings.Join(tests, ", ")))
	}
	return b.String()
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}
