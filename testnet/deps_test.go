package testnet

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/meshinfer/meshinfer"

// TestDependencyDirection enforces docs/architecture.md's dependency rules from `go list -deps`.
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
	// ending in "/" name a whole tree outside the module. "@project" is every project package
	// outside a's own folder and internal/ (every package may use the internal leaves);
	// "@stdlib" is everything but the standard library.
	forbidden := map[string][]string{
		// internal/* are leaves that mesh and transport both use: the standard library only,
		// so not even another internal package (stricter than "@project").
		"internal":   {"@stdlib"},
		"reputation": {"@project", "github.com/libp2p/", "github.com/pion/"},
		"inference":  {"@project", "github.com/libp2p/", "github.com/pion/"},
		// mesh/route decides on an inference.Request: inference is a leaf of plain types
		// (no libp2p, no I/O), so sharing it keeps one definition of a request and its
		// preferences. mesh still never reaches transport.
		"mesh":      {"transport", "node", "testnet", "cmd"},
		"transport": {"mesh", "node", "testnet", "cmd"},
		"node":      {"testnet", "cmd"},
		"testnet":   {"cmd"},
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
				case rule == "@stdlib":
					if first, _, _ := strings.Cut(dep, "/"); strings.Contains(first, ".") {
						t.Errorf("%s depends on %s: %s must depend on the standard library only", pkg, dep, from)
					}
				case rule == "@project":
					if inProject && top(dep) != from && top(dep) != "internal" {
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

// TestLocalOnlyPathDependencies enforces the privacy gate by structure: no package a
// local-only request passes through can open a connection to a peer, because none of them
// links the code that could. transport/infer is the control: it must be found to depend on
// libp2p, so that a check that sees nothing cannot pass by accident.
func TestLocalOnlyPathDependencies(t *testing.T) {
	// The packages a local-only request passes through: the API, the domain types, the
	// privacy gate and the built-in backend.
	path := []string{
		module + "/transport/openai",
		module + "/inference",
		module + "/inference/localonly",
		module + "/inference/synth",
	}
	// What they must not depend on, even indirectly, each a package path and everything
	// under it: the network stacks and the packages of the mesh that reach peers.
	network := []string{
		"github.com/libp2p",
		"github.com/pion",
		"github.com/multiformats",
		module + "/mesh",
		module + "/node",
		module + "/transport/infer",
		module + "/internal/frame",
	}
	found := depsUnder(t, network, path...)
	for _, pkg := range path {
		for _, dep := range found[pkg] {
			t.Errorf("%s depends on %s: the local-only path must not link any network stack", pkg, dep)
		}
	}
	control := module + "/transport/infer"
	if deps := depsUnder(t, network, control)[control]; !slices.ContainsFunc(deps, func(d string) bool {
		return strings.HasPrefix(d, "github.com/libp2p/")
	}) {
		t.Errorf("control %s shows no libp2p dependency (found %v): the check sees nothing", control, deps)
	}
	t.Logf("figure F14: the local-only path (%d packages) links no network stack; the control does", len(path))
}

// depsUnder returns, for each of pkgs, its transitive dependencies that are or lie under one
// of roots. Every package asked for has an entry.
func depsUnder(t *testing.T, roots []string, pkgs ...string) map[string][]string {
	t.Helper()
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	args := append([]string{"list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`}, pkgs...)
	out, err := exec.Command(gobin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	found := make(map[string][]string, len(pkgs))
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := fields[0]
		found[pkg] = []string{}
		for _, dep := range fields[1:] {
			for _, root := range roots {
				if dep == root || strings.HasPrefix(dep, root+"/") {
					found[pkg] = append(found[pkg], dep)
				}
			}
		}
	}
	for _, pkg := range pkgs {
		if _, ok := found[pkg]; !ok {
			t.Fatalf("go list said nothing about %s:\n%s", pkg, out)
		}
	}
	return found
}

// TestExecutionLivesInTheExecutor: node assembles parts and holds no execution logic. The
// routing decision is called only from the executor (node/dispatch), so node itself does not
// import mesh/route; the executor holds no pointer back to the node, so it does not depend
// on node. The executor's own dependency on mesh/route is the control.
func TestExecutionLivesInTheExecutor(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	imports := func(pkg string) []string {
		out, err := exec.Command(gobin, "list", "-f", `{{join .Imports " "}}`, pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		return strings.Fields(string(out))
	}
	route, node, exec := module+"/mesh/route", module+"/node", module+"/node/dispatch"
	if slices.Contains(imports(node), route) {
		t.Errorf("%s imports %s: routing decisions belong to %s", node, route, exec)
	}
	if !slices.Contains(imports(exec), route) {
		t.Errorf("control: %s does not import %s; the check sees nothing", exec, route)
	}
	if deps := depsUnder(t, []string{node}, exec)[exec]; slices.Contains(deps, node) {
		t.Errorf("%s depends on %s: the executor must not reach back into the node", exec, node)
	}
}
