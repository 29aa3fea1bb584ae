package fencekv

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
//     numbers back into a time (time.Unix*, t.Unix*()), which would drop
//     the monotonic reading and compare wall clocks, except where the
//     number is only shown or carried (allowed below, each with why).
//
// A time.Time from time.Now carries a monotonic reading, and Since, Until,
// Sub, Before and After between two such values use it.
func TestNoWallClock(t *testing.T) {
	deterministic := []string{"fence", "kv", "lease", "state", "wal"}
	server := []string{".", "cluster", "wire", "metrics", "auth"}
	// file: selector → why it may use wall-clock numbers.
	allowed := map[string]map[string]string{
		"wire/server_methods.go": {"UnixMilli": "the refusal log's time_ms is shown to the operator"},
		"wire/client_methods.go": {"UnixMilli": "the client decodes refusal log times for display"},
		"wire/link.go":           {"Unix": "a deadline in the past (1970) makes a blocked read return now"},
		"cluster/logstore.go": {"UnixNano": "raft's Log.AppendedAt is metadata raft carries, never compared here",
			"Unix": "raft's Log.AppendedAt is metadata raft carries, never compared here"},
	}
	clockReads := []string{"Now", "Since", "Until", "Tick", "After", "AfterFunc", "NewTimer", "NewTicker"}
	wallNumbers := []string{"Unix", "UnixNano", "UnixMilli", "UnixMicro"}

	check := func(dir string, forbidClock bool) {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no Go files in %s", dir)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			timeName := ""
			for _, imp := range f.Imports {
				if imp.Path.Value == `"time"` {
					timeName = "time"
					if imp.Name != nil {
						timeName = imp.Name.Name
					}
				}
			}
			rel := filepath.ToSlash(path)
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				name := sel.Sel.Name
				pkg, _ := sel.X.(*ast.Ident)
				fromTime := timeName != "" && pkg != nil && pkg.Name == timeName
				switch {
				case forbidClock && fromTime && slices.Contains(clockReads, name):
					t.Errorf("%s: time.%s in a deterministic package: its time must come in the command", fset.Position(sel.Pos()), name)
				case slices.Contains(wallNumbers, name):
					if _, ok := allowed[rel][name]; ok {
						return true
					}
					// Only calls on times (or time.Unix*) are wall-clock
					// numbers; a field or method of another type named
					// so would be caught too, and is better renamed.
					t.Errorf("%s: %s turns a time into wall-clock numbers (or back): compare monotonic readings instead", fset.Position(sel.Pos()), name)
				}
				return true
			})
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
}
