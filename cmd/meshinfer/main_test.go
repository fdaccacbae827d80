package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/testnet"
)

// runTimeout bounds one run() call in these tests: a command that should fail fast but
// blocks instead fails the test rather than hanging it.
const runTimeout = 60 * time.Second

// runCmd calls run(args) and returns its exit code, stdout and stderr.
func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- run(args, &stdout, &stderr) }()
	select {
	case code := <-done:
		return code, stdout.String(), stderr.String()
	case <-time.After(runTimeout):
		// The buffers are still being written; do not read them.
		t.Fatalf("meshinfer %s did not return within %v", strings.Join(args, " "), runTimeout)
		return 0, "", ""
	}
}

func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout []string // substrings
		wantStderr []string // substrings
	}{
		{name: "no args", args: nil, wantCode: 2, wantStderr: []string{"Usage:", "meshinfer <command>"}},
		{name: "help", args: []string{"help"}, wantCode: 0, wantStdout: []string{"Usage:", "node", "testnet", "status", "id"}},
		{name: "--help", args: []string{"--help"}, wantCode: 0, wantStdout: []string{"Usage:", "node", "testnet", "status", "id"}},
		{name: "-h", args: []string{"-h"}, wantCode: 0, wantStdout: []string{"Usage:"}},
		{name: "version", args: []string{"version"}, wantCode: 0, wantStdout: []string{"meshinfer " + version}},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2, wantStderr: []string{`unknown command "frobnicate"`, "Usage:"}},
		{name: "node --bogus", args: []string{"node", "--bogus"}, wantCode: 2, wantStderr: []string{"bogus"}},
		{name: "node stray argument", args: []string{"node", "extra"}, wantCode: 2, wantStderr: []string{`unexpected argument "extra"`}},
		{name: "node --heartbeat not a duration", args: []string{"node", "--heartbeat", "soon"}, wantCode: 2, wantStderr: []string{"heartbeat"}},
		{name: "node --role coordinator public without TLS", args: []string{"node", "--role", "coordinator", "--api", "0.0.0.0:9999"},
			wantCode: 1, wantStderr: []string{"clear text", "--tls-cert", "--insecure-gateway"}},
		{name: "node --role unknown", args: []string{"node", "--role", "oracle"}, wantCode: 1, wantStderr: []string{"oracle", "contributor", "bootstrap"}},
		{name: "node --bootstrap not a multiaddr", args: []string{"node", "--bootstrap", "not-a-multiaddr"}, wantCode: 1, wantStderr: []string{"not-a-multiaddr", "/p2p/"}},
		{name: "node --bootstrap without /p2p", args: []string{"node", "--bootstrap", "/ip4/127.0.0.1/tcp/4001"}, wantCode: 1, wantStderr: []string{"/p2p/"}},
		{name: "id --bogus", args: []string{"id", "--bogus"}, wantCode: 2},
		{name: "status --bogus", args: []string{"status", "--bogus"}, wantCode: 2},
		{name: "status without a node", args: []string{"status", "--console", "127.0.0.1:1"}, wantCode: 1, wantStderr: []string{"cannot reach the console", "meshinfer node"}},
		{name: "testnet --nodes 0", args: []string{"testnet", "--nodes", "0"}, wantCode: 2, wantStderr: []string{"--nodes"}},
		{name: "testnet --nodes -1", args: []string{"testnet", "--nodes", "-1"}, wantCode: 2, wantStderr: []string{"--nodes"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, tc.args...)
			if code != tc.wantCode {
				t.Errorf("exit code = %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.wantCode, stdout, stderr)
			}
			for _, s := range tc.wantStdout {
				if !strings.Contains(stdout, s) {
					t.Errorf("stdout does not contain %q:\n%s", s, stdout)
				}
			}
			for _, s := range tc.wantStderr {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr does not contain %q:\n%s", s, stderr)
				}
			}
		})
	}
}

// subcommands is every command run knows, with a flag each of them refuses.
var subcommands = [][]string{
	{"node"}, {"testnet"}, {"status"}, {"chat"}, {"id"}, {"consent"}, {"receipts"},
	{"keys", "create"}, {"keys", "list"}, {"keys", "revoke"}, {"usage"},
}

// The top-level usage names every command the dispatcher runs, and the help tests below
// cover every one of them; "meshinfer help CMD" is "meshinfer CMD --help".
func TestHelpListsEveryCommand(t *testing.T) {
	code, stdout, stderr := runCmd(t, "--help")
	if code != 0 || stderr != "" {
		t.Fatalf("--help: exit code %d, stderr %q", code, stderr)
	}
	for _, c := range commands {
		if !strings.Contains(stdout, "\n  "+c.name+" ") {
			t.Errorf("--help does not list %q:\n%s", c.name, stdout)
		}
		tested := c.name == "help" || c.name == "version" ||
			slices.ContainsFunc(subcommands, func(sub []string) bool { return sub[0] == c.name })
		if !tested {
			t.Errorf("command %q has no help test: add it to subcommands", c.name)
		}
	}
	for _, c := range []string{"node", "keys", "usage"} {
		code, stdout, stderr := runCmd(t, "help", c)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "Usage: meshinfer "+c) {
			t.Errorf("help %s: exit code %d\nstdout:\n%s\nstderr:\n%s", c, code, stdout, stderr)
		}
	}
	if code, _, stderr := runCmd(t, "help", "bogus"); code != 2 || !strings.Contains(stderr, `unknown command "bogus"`) {
		t.Errorf("help bogus: exit code %d, stderr %q", code, stderr)
	}
}

// Asked for, a command's usage goes to stdout with exit code 0; after a wrong flag the
// error and the usage go to stderr with exit code 2.
func TestSubcommandHelpGoesToStdout(t *testing.T) {
	for _, cmd := range append(subcommands, []string{"keys"}) {
		for _, help := range []string{"-h", "--help"} {
			args := append(append([]string{}, cmd...), help)
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, stdout, stderr := runCmd(t, args...)
				if code != 0 || stderr != "" || !strings.Contains(stdout, "Usage: meshinfer "+cmd[0]) {
					t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
				}
			})
		}
	}
	for _, cmd := range subcommands {
		args := append(append([]string{}, cmd...), "--no-such-flag")
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(t, args...)
			if code != 2 || stdout != "" || !strings.Contains(stderr, "no-such-flag") || !strings.Contains(stderr, "Usage: meshinfer "+cmd[0]) {
				t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
		})
	}
}

// flagHelp splits flag.PrintDefaults output into one block of text per flag name.
func flagHelp(out string) map[string]string {
	blocks := map[string]string{}
	var name string
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "  -"); ok {
			name, _, _ = strings.Cut(rest, " ")
			blocks[name] = rest
			continue
		}
		if name != "" && strings.HasPrefix(line, "    \t") {
			blocks[name] += "\n" + line
		}
	}
	return blocks
}

func TestNodeHelpListsEveryFlagWithItsDefault(t *testing.T) {
	code, stdout, stderr := runCmd(t, "node", "--help")
	if code != 0 {
		t.Fatalf("node --help exit code = %d, want 0\nstderr:\n%s", code, stderr)
	}
	if stderr != "" {
		t.Errorf("node --help wrote to stderr: %q", stderr)
	}
	help := flagHelp(stdout)
	// want is a substring of the flag's help stating its default; "" where the default is
	// the zero value (false, none), which flag does not print.
	tests := []struct {
		flag, want string
	}{
		{"data-dir", "$XDG_DATA_HOME/meshinfer, else ~/.local/share/meshinfer"},
		{"mesh", `(default "default")`},
		{"role", `(default "contributor")`},
		{"listen", "default TCP and QUIC on port 4001"},
		{"bootstrap", "/p2p/"},
		{"no-mdns", ""},
		{"loopback", ""},
		{"console", `(default "127.0.0.1:3131")`},
		{"console-public", ""},
		{"heartbeat", "(default 15s)"},
		{"drain-timeout", "(default 10s)"},
		{"memory-budget", "default half the memory available at start"},
		{"conns-low", "(default 64)"},
		{"conns-high", "(default 128)"},
		{"probe-root", `(default "/")`},
		{"model", "default synth-tiny"},
		{"api", `(default "127.0.0.1:9337")`},
		{"api-public", ""},
		{"backend", `(default "synth")`},
		{"upstream", ""},
		{"upstream-key-env", `(default "MESHINFER_UPSTREAM_KEY")`},
		{"privacy", `(default "mesh")`},
		{"priority", `(default "balanced")`},
		{"cloud-url", ""},
		{"cloud-key-env", `(default "MESHINFER_CLOUD_KEY")`},
		{"cloud-model", "required with --cloud-url"},
		{"cloud-cost", "(default 1)"},
		{"profile", "default standard"},
		{"tls-cert", "HTTPS"},
		{"tls-key", ""},
		{"insecure-gateway", ""},
		{"config", "max_bytes_per_hour"},
		{"consent-text", "64 KiB"},
		{"webrtc", "falls back to libp2p"},
		{"webrtc-accept", "registers no WebRTC signaling"},
		{"ice-server", "stun:host:port"},
		{"gateway-origin", "repeatable"},
	}
	for _, tc := range tests {
		block, ok := help[tc.flag]
		if !ok {
			t.Errorf("node --help does not list --%s:\n%s", tc.flag, stdout)
			continue
		}
		if !strings.Contains(block, tc.want) {
			t.Errorf("node --help for --%s = %q, want it to contain %q", tc.flag, block, tc.want)
		}
	}
	if len(help) != len(tests) {
		t.Errorf("node --help lists %d flags, want %d: update this test with the new flag and its default\n%s", len(help), len(tests), stdout)
	}
}

func TestNodeRefusesPublicConsoleBeforeBlocking(t *testing.T) {
	code, stdout, stderr := runCmd(t, "node",
		"--console", "0.0.0.0:3131",
		"--data-dir", t.TempDir(),
		"--listen", "/ip4/127.0.0.1/tcp/0",
		"--no-mdns",
	)
	if code != 1 {
		t.Fatalf("exit code = %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, s := range []string{"not loopback", "0.0.0.0:3131", "--console-public"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("stderr does not contain %q:\n%s", s, stderr)
		}
	}
}

func TestIDIsStable(t *testing.T) {
	dir := t.TempDir()
	var ids []string
	for i := range 2 {
		code, stdout, stderr := runCmd(t, "id", "--data-dir", dir)
		if code != 0 {
			t.Fatalf("id call %d: exit code = %d, want 0\nstderr:\n%s", i, code, stderr)
		}
		id := strings.TrimSpace(stdout)
		if !strings.HasPrefix(id, "12D3KooW") {
			t.Fatalf("id call %d printed %q, want a peer ID starting with 12D3KooW", i, stdout)
		}
		if _, err := peer.Decode(id); err != nil {
			t.Errorf("id call %d printed %q: not a peer ID: %v", i, id, err)
		}
		if created := strings.Contains(stderr, "created a new identity"); created != (i == 0) {
			t.Errorf("id call %d: stderr %q, want the creation notice only on the first call", i, stderr)
		}
		ids = append(ids, id)
	}
	if ids[0] != ids[1] {
		t.Errorf("id printed %s, then %s: want the same peer ID", ids[0], ids[1])
	}
}

func TestTestnetCommand(t *testing.T) {
	code, stdout, stderr := runCmd(t, "testnet", "--nodes", "3", "--duration", "1s", "--console-base", "0", "--api-base", "0", "--watch", "0")
	if code != 0 {
		t.Fatalf("exit code = %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, s := range []string{"starting 3 nodes", "PEER ID", "LISTEN", "CONSOLE", "12D3KooW", "converged",
		"its own model:", "served by itself    (local)",
		"a model only peers serve:", "served by node 1    (mesh)",
		"a model no node serves, privacy any:", "served by the cloud (cloud)",
		"(local_unavailable)", "stopped."} {
		if !strings.Contains(stdout, s) {
			t.Errorf("stdout does not contain %q:\n%s", s, stdout)
		}
	}
}

func TestStatusAgainstTestnet(t *testing.T) {
	tn, err := testnet.New(testnet.Options{Nodes: 2, ConsoleBase: 0})
	if err != nil {
		t.Fatalf("testnet.New: %v", err)
	}
	defer tn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tn.WaitConverged(ctx); err != nil {
		t.Fatalf("WaitConverged: %v", err)
	}
	n0, n1 := tn.Node(0), tn.Node(1)
	addr := n0.ConsoleAddr()
	if addr == "" {
		t.Fatalf("node 0 has no console")
	}

	code, stdout, stderr := runCmd(t, "status", "--console", addr, "--json")
	if code != 0 {
		t.Fatalf("status --json exit code = %d, want 0\nstderr:\n%s", code, stderr)
	}
	var out struct {
		Status map[string]any   `json:"status"`
		Peers  []map[string]any `json:"peers"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("status --json output does not decode: %v\n%s", err, stdout)
	}
	if got := out.Status["node_id"]; got != n0.ID().String() {
		t.Errorf("status.node_id = %v, want %s", got, n0.ID())
	}
	if len(out.Peers) != 1 {
		t.Fatalf("status --json lists %d peers, want 1:\n%s", len(out.Peers), stdout)
	}
	if got := out.Peers[0]["peer_id"]; got != n1.ID().String() {
		t.Errorf("peers[0].peer_id = %v, want %s", got, n1.ID())
	}
	if mesh, ok := out.Status["mesh"].(map[string]any); !ok || mesh["peers_known"] != float64(1) {
		t.Errorf("status.mesh = %v, want peers_known 1", out.Status["mesh"])
	}

	code, stdout, stderr = runCmd(t, "status", "--console", addr)
	if code != 0 {
		t.Fatalf("status exit code = %d, want 0\nstderr:\n%s", code, stderr)
	}
	// Two nodes on loopback connect over TCP (node's dial ranking), multiplexed by yamux.
	for _, s := range []string{n0.ID().String(), "PEER", shortID(n1.ID().String()), "connected (tcp+yamux"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("status output does not contain %q:\n%s", s, stdout)
		}
	}

	// chat through node 0 for the model only node 1 serves.
	api := "http://" + n0.APIAddr()
	code, stdout, stderr = runCmd(t, "chat", "--api", api, "--model", "synth-small", "--max-tokens", "8", "hello", "mesh")
	if code != 0 || strings.TrimSpace(stdout) == "" || !strings.Contains(stderr, "served by peer:"+n1.ID().String()+" (mesh tier over libp2p") {
		t.Fatalf("chat: exit %d\nstdout %q\nstderr %q", code, stdout, stderr)
	}
	code, _, stderr = runCmd(t, "chat", "--api", api, "--model", "synth-nobody", "hi")
	if code != 1 || !strings.Contains(stderr, "model_not_found") {
		t.Fatalf("chat with an unknown model: exit %d, stderr %q", code, stderr)
	}
	if code, _, _ := runCmd(t, "chat", "--api", api); code != 2 {
		t.Fatalf("chat without a prompt: exit %d, want 2", code)
	}
}

func TestMemoryBudgetSizes(t *testing.T) {
	for in, want := range map[string]int64{
		"512": 512 << 20, "512MiB": 512 << 20, "4GiB": 4 << 30, "2GB": 2e9, "1.5GiB": 3 << 29, "300 MB": 300e6, "64k": 64 << 10,
	} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, int64(b), err, want)
		}
	}
	for _, in := range []string{"", "0", "-1GiB", "12XB", "GiB", "1e30TB"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) = %d, want an error", in, int64(b))
		}
	}
}
