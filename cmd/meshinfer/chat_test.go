package main

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/node"
)

// startCoordinator starts a coordinator node on loopback that serves synth-tiny, with an API
// key made by `meshinfer keys create`; it returns its API's URL and the key.
func startCoordinator(t *testing.T) (api, key string) {
	t.Helper()
	dir := t.TempDir()
	key, _ = createKeyCmd(t, dir, "laptop")
	id, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	consent := participation.Consent{Version: participation.ConsentVersion, RunLocal: true, Contribute: true}
	n, err := node.New(node.Config{Identity: id, DataDir: dir, Consent: &consent, Models: []string{"synth-tiny"},
		Roles: []node.Role{node.RoleCoordinator}, Loopback: true, ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"},
		ConsoleAddr: node.ConsoleOff, APIAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return "http://" + n.APIAddr(), key
}

// chatReference is what `meshinfer chat --max-tokens n --seed s PROMPT` must print: the
// synthetic backend's completion of the same request.
func chatReference(t *testing.T, prompt string, maxTokens int, seed int64) string {
	t.Helper()
	b, err := synth.New("synth-tiny")
	if err != nil {
		t.Fatal(err)
	}
	req := inference.Request{Model: "synth-tiny", Messages: []inference.Message{{Role: inference.RoleUser, Content: prompt}},
		MaxTokens: &maxTokens, Seed: &seed}
	var text strings.Builder
	if _, err := b.Generate(context.Background(), &req, func(tok inference.Token) error {
		text.WriteString(tok.Text)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return text.String()
}

// chat --gateway streams through a coordinator's gateway with the key from --key or
// $MESHINFER_API_KEY, and refuses to run without a key or with a bad one.
func TestChatThroughGateway(t *testing.T) {
	api, key := startCoordinator(t)
	want := chatReference(t, "hello mesh", 12, 3) + "\n"

	code, stdout, stderr := runCmd(t, "chat", "--gateway", api, "--key", key, "--device", "laptop-1",
		"--max-tokens", "12", "--seed", "3", "hello", "mesh")
	if code != 0 || stdout != want {
		t.Fatalf("chat --gateway --key: exit %d\nstdout %q, want %q\nstderr %q", code, stdout, want, stderr)
	}
	wantContains(t, "chat --gateway stderr", stderr, "served by local", "via the gateway (websocket)")

	t.Setenv(apiKeyEnv, key)
	if code, stdout, stderr = runCmd(t, "chat", "--gateway", api, "--max-tokens", "12", "--seed", "3", "hello mesh"); code != 0 || stdout != want {
		t.Fatalf("chat --gateway with $%s: exit %d\nstdout %q, want %q\nstderr %q", apiKeyEnv, code, stdout, want, stderr)
	}

	code, _, stderr = runCmd(t, "chat", "--gateway", api, "--key", "msk_live_nope", "hi")
	if code != 1 || !strings.Contains(stderr, "401") || !strings.Contains(stderr, "invalid_api_key") {
		t.Fatalf("chat with a bad key: exit %d, stderr %q", code, stderr)
	}
	// Without --gateway, chat talks to --api as before: a coordinator's API wants a key.
	if code, _, stderr = runCmd(t, "chat", "--api", api, "hi"); code != 1 || !strings.Contains(stderr, "invalid_api_key") {
		t.Fatalf("chat --api to a coordinator: exit %d, stderr %q", code, stderr)
	}

	t.Setenv(apiKeyEnv, "")
	if code, _, stderr = runCmd(t, "chat", "--gateway", api, "hi"); code != 2 || !strings.Contains(stderr, apiKeyEnv) {
		t.Fatalf("chat --gateway without a key: exit %d, stderr %q", code, stderr)
	}
	if code, _, _ = runCmd(t, "chat", "--key", key, "hi"); code != 2 {
		t.Fatalf("chat --key without --gateway: exit %d, want 2", code)
	}
}

// chat --gateway refuses to send a key over plain http:// to another machine, with and
// without --direct, and says how to proceed; nothing is dialed.
func TestChatRefusesPlainHTTPKey(t *testing.T) {
	for _, args := range [][]string{
		{"chat", "--gateway", "http://coordinator.invalid:9337", "--key", "msk_live_x", "hi"},
		{"chat", "--gateway", "http://coordinator.invalid:9337", "--key", "msk_live_x", "--direct", "hi"},
	} {
		code, _, stderr := runCmd(t, args...)
		if code != 1 {
			t.Errorf("%q: exit %d, want 1\nstderr %q", args, code, stderr)
		}
		wantContains(t, "stderr", stderr, "plain http://", "https://", "--allow-http")
	}
}
