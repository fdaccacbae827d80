package gateway

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestImports enforces the package's import rule: the standard library, package inference,
// the project's internal/ leaves (standard library only themselves) and
// github.com/coder/websocket (the WebSocket endpoint; it has no dependencies) only, so no
// libp2p, mesh or node code runs in front of the coordinator's keys.
func TestImports(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const self = "github.com/meshinfer/meshinfer/transport/gateway"
	allowed := map[string]bool{self: true, "github.com/meshinfer/meshinfer/inference": true}
	const websocket = "github.com/coder/websocket"
	var seen bool
	for _, pkg := range strings.Fields(string(out)) {
		seen = seen || pkg == self
		internal := strings.HasPrefix(pkg, "github.com/meshinfer/meshinfer/internal/")
		if !allowed[pkg] && !internal && pkg != websocket && !strings.HasPrefix(pkg, websocket+"/internal/") {
			t.Errorf("transport/gateway depends on %s: it may import the standard library, inference, internal/ and %s only", pkg, websocket)
		}
	}
	if !seen {
		t.Fatalf("go list did not list the package itself:\n%s", out)
	}
}
