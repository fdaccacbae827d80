package reputation

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLeafPackage guards the package doc's promises: standard library only, no clock, no
// goroutines.
func TestLeafPackage(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatalf("glob: %v", err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		for _, imp := range f.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s: the package must use the standard library only", name, path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" && (n.Sel.Name == "Now" || n.Sel.Name == "Since" || n.Sel.Name == "Until") {
					t.Errorf("%s: time.%s: time must be passed in", fset.Position(n.Pos()), n.Sel.Name)
				}
			case *ast.GoStmt:
				t.Errorf("%s: go statement: the package starts no goroutines", fset.Position(n.Pos()))
			case *ast.FuncDecl:
				if n.Recv == nil && n.Name.Name == "init" {
					t.Errorf("%s: init function", fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
}

func TestStatsJSONNames(t *testing.T) {
	s := newStore(t)
	s.Record(Target{"m", "a"}, Timeout, t0)
	s.Order("m", []string{"b", "a"}, Auto, t0.Add(5*time.Second))
	s.Order("m", []string{"a", "b"}, Auto, t0.Add(5*time.Second))
	s.CountPenalizedRoute()
	b, err := json.Marshal(s.Stats(t0.Add(5 * time.Second)))
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	if got["penalized_targets"] != 1.0 || got["routes_penalized"] != 1.0 {
		t.Fatalf("stats JSON = %s, want penalized_targets 1 and routes_penalized 1", b)
	}
}
