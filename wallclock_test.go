package fencekv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// No wall-clock time reaches the state machine or a lease decision
// (G7): a lease is a duration measured on a monotonic clock, so stepping a
// node's wall clock (NTP, date -s, a VM resumed) changes nothing. Stepping
// the machine's clock in a test would disturb every other process on it,
// so the rule is checked on the source instead, where it can be kept:
//
//   - The deterministic packages (the state machine and what it is made
//     of) read no clock at all: their time comes in the commands, from the
//     driver's Clock.
//   - No package of the server turns a time into wall-clock numbers, or
//     numbers back into a time (time.Unix*, Time.Unix*()), which would drop
//     the monotonic reading and compare wall clocks, except where the
//     number is only shown or carried (allowed below, each with why).
//
// A time.Time from time.Now carries a monotonic reading, and Since, Until,
// Sub, Before and After between two such values use it. The packages are
// type-checked, so only the time package's own functions and methods
// count, however they are named or reached.
func TestNoWallClock(t *testing.T) {
	deterministic := []string{"fence", "kv", "lease", "state", "wal"}
	server := []string{".", "cluster", "wire", "metrics", "auth"}
	// package-relative function → why it may use wall-clock numbers.
	allowed := map[string]string{
		"wire.refusals":           "the refusal log's time_ms is shown to the operator",
		"wire.(*Client).Refusals": "the client decodes refusal log times for display",
		"wire.(*link).interrupt":  "a deadline in the past (1970) makes a blocked read return now",
		"cluster.encodeEntry":     "raft's Log.AppendedAt is metadata raft carries, never compared here",
		"cluster.decodeEntry":     "raft's Log.AppendedAt is metadata raft carries, never compared here",
	}
	used := map[string]bool{}
	clockReads := []string{"Now", "Since", "Until", "Tick", "After", "AfterFunc", "NewTimer", "NewTicker", "Sleep"}
	wallNumbers := []string{"Unix", "UnixNano", "UnixMilli", "UnixMicro"}

	fset := token.NewFileSet()
	imp, goFiles := exportImporter(t, fset, append(append([]string{}, deterministic...), server...))
	check := func(dir string, forbidClock bool) {
		var parsed []*ast.File
		for _, name := range goFiles[dir] {
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			parsed = append(parsed, f)
		}
		if len(parsed) == 0 {
			t.Fatalf("no Go files in %s", dir)
		}
		info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
		conf := types.Config{Importer: imp}
		pkg, err := conf.Check(dir, fset, parsed, info)
		if err != nil {
			t.Fatalf("type-check %s: %v", dir, err)
		}
		for _, f := range parsed {
			for _, decl := range f.Decls {
				fn, _ := decl.(*ast.FuncDecl)
				where := pkg.Name() + "." + funcName(fn)
				ast.Inspect(decl, func(n ast.Node) bool {
					id, ok := n.(*ast.Ident)
					if !ok {
						return true
					}
					obj, ok := info.Uses[id].(*types.Func)
					if !ok || obj.Pkg() == nil || obj.Pkg().Path() != "time" {
						return true
					}
					name := obj.Name()
					isMethod := obj.Signature().Recv() != nil
					switch {
					case forbidClock && !isMethod && slices.Contains(clockReads, name):
						t.Errorf("%s: time.%s in a deterministic package: its time must come in the command", fset.Position(id.Pos()), name)
					case slices.Contains(wallNumbers, name):
						if _, ok := allowed[where]; ok {
							used[where] = true
							return true
						}
						t.Errorf("%s (%s): %s turns a time into wall-clock numbers (or back): compare monotonic readings instead", fset.Position(id.Pos()), where, name)
					}
					return true
				})
			}
		}
	}
	for _, dir := range deterministic {
		check(dir, true)
	}
	for _, dir := range server {
		if _, err := os.Stat(dir); err != nil {
			t.Fatal(err)
		}
		check(dir, false)
	}
	for where := range allowed {
		if !used[where] {
			t.Errorf("allowed %s uses no wall-clock numbers any more (or was renamed): remove it from the list", where)
		}
	}
}

// funcName names a declaration as the allow-list does: f, or (*T).m.
func funcName(fn *ast.FuncDecl) string {
	if fn == nil {
		return "(top level)"
	}
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	recv := fn.Recv.List[0].Type
	if ix, ok := recv.(*ast.IndexExpr); ok {
		recv = ix.X
	}
	switch r := recv.(type) {
	case *ast.StarExpr:
		x := r.X
		if ix, ok := x.(*ast.IndexExpr); ok {
			x = ix.X
		}
		return fmt.Sprintf("(*%s).%s", x.(*ast.Ident).Name, fn.Name.Name)
	case *ast.Ident:
		return fmt.Sprintf("(%s).%s", r.Name, fn.Name.Name)
	}
	return fn.Name.Name
}

// exportImporter lists the packages in dirs with go list, which also
// builds the export data of everything they import (from the build cache:
// the test binary was just built from it). It returns an importer reading
// that data and, per dir, the non-test files this machine builds.
func exportImporter(t *testing.T, fset *token.FileSet, dirs []string) (types.Importer, map[string][]string) {
	t.Helper()
	args := []string{"list", "-export", "-deps", "-json=Dir,ImportPath,Export,GoFiles"}
	for _, d := range dirs {
		args = append(args, "./"+d)
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	exports := map[string]string{}
	goFiles := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			Dir, ImportPath, Export string
			GoFiles                 []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
		if rel, err := filepath.Rel(wd, p.Dir); err == nil && slices.Contains(dirs, filepath.ToSlash(rel)) {
			goFiles[filepath.ToSlash(rel)] = p.GoFiles
		}
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	return imp, goFiles
}
