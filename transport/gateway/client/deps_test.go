package client_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestImports enforces the package's import rule: a thin client links no libp2p, only the
// standard library, github.com/coder/websocket, inference, gateway and the project's
// internal/ leaves (standard library only themselves).
func TestImports(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const module = "github.com/meshinfer/meshinfer/"
	allowed := map[string]bool{
		module + "transport/gateway/client": true,
		module + "transport/gateway":        true,
		module + "inference":                true,
	}
	var seen bool
	for _, pkg := range strings.Fields(string(out)) {
		seen = seen || pkg == module+"transport/gateway/client"
		internal := strings.HasPrefix(pkg, module+"internal/")
		if !allowed[pkg] && !internal && pkg != "github.com/coder/websocket" && !strings.HasPrefix(pkg, "github.com/coder/websocket/internal/") {
			t.Errorf("transport/gateway/client depends on %s: a thin client may import the standard library, coder/websocket, inference, gateway and internal/ only", pkg)
		}
	}
	if !seen {
		t.Fatalf("go list did not list the package itself:\n%s", out)
	}
}
