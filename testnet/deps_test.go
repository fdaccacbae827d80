package testnet

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const module = "github.com/meshinfer/meshinfer"

// TestDependencyDirection enforces ARCHITECTURE.md's dependency rules from `go list -deps`.
func TestDependencyDirection(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(gobin, "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, module+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	top := func(pkg string) string { // "mesh" for .../mesh/caps
		rest := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		first, _, _ := strings.Cut(rest, "/")
		return first
	}
	// forbidden[a] lists what packages under top-level folder a must not depend on. Prefixes
	// ending in "/" name a whole tree outside the module.
	forbidden := map[string][]string{
		"reputation": {"@project", "github.com/libp2p/", "github.com/pion/"},
		"inference":  {"@project", "github.com/libp2p/", "github.com/pion/"},
		"mesh":       {"transport", "node", "testnet", "cmd", "inference"},
		"transport":  {"mesh", "node", "testnet", "cmd"},
		"node":       {"testnet", "cmd"},
		"testnet":    {"cmd"},
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, deps := fields[0], fields[1:]
		if !strings.HasPrefix(pkg, module+"/") {
			continue
		}
		from := top(pkg)
		checked++
		for _, dep := range deps {
			inProject := strings.HasPrefix(dep, module+"/")
			for _, rule := range forbidden[from] {
				switch {
				case rule == "@project":
					if inProject && top(dep) != from {
						t.Errorf("%s imports %s: %s must not import other project packages", pkg, dep, from)
					}
				case strings.HasSuffix(rule, "/"):
					if strings.HasPrefix(dep, rule) {
						t.Errorf("%s depends on %s: %s must not depend on %s", pkg, dep, from, rule)
					}
				default:
					if inProject && top(dep) == rule {
						t.Errorf("%s imports %s: %s must not import %s", pkg, dep, from, rule)
					}
				}
			}
		}
	}
	if checked < 8 {
		t.Fatalf("checked only %d packages: go list output unexpected:\n%s", checked, out)
	}
}
