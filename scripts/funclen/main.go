// Command funclen lists the longest functions (declaration to closing
// brace, in lines) of the non-test, non-generated Go files in the given
// directories, longest first:
//
//	go run ./scripts/funclen 12 orchestrator subagent store cmd/fanout
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: funclen N DIR...")
		os.Exit(2)
	}
	top, err := strconv.Atoi(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "funclen: N:", err)
		os.Exit(2)
	}
	type fn struct {
		name  string
		lines int
	}
	var fns []fn
	fset := token.NewFileSet()
	for _, dir := range os.Args[2:] {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") || strings.HasSuffix(f, ".pb.go") {
				continue
			}
			af, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				fmt.Fprintln(os.Stderr, "funclen:", err)
				os.Exit(1)
			}
			for _, d := range af.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				fns = append(fns, fn{filepath.Join(dir, filepath.Base(f)) + ":" + funcName(fd),
					fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1})
			}
		}
	}
	sort.SliceStable(fns, func(i, j int) bool { return fns[i].lines > fns[j].lines })
	for i := 0; i < top && i < len(fns); i++ {
		fmt.Printf("%4d %s\n", fns[i].lines, fns[i].name)
	}
}

// funcName is a function's name, with its receiver's type for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
