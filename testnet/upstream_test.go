package testnet

import (
	"crypto/rand"
	"net/http"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/meshinfer/meshinfer/node"
)

// A node whose backend is another node's OpenAI-compatible API (--backend openai) serves that
// model locally, with the answer the other node gives itself.
func TestUpstreamBackendServesAnotherNodesModel(t *testing.T) {
	tn := start(t, Options{Nodes: 1, NoConsole: true, ModelsFor: func(int) []string { return []string{"synth-tiny"} }})
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	front, err := node.New(node.Config{
		Identity:    key,
		ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"},
		ConsoleAddr: node.ConsoleOff,
		APIAddr:     "127.0.0.1:0",
		Loopback:    true,
		Backend:     node.BackendOpenAI,
		Upstream:    "http://" + tn.Node(0).APIAddr(),
		Models:      []string{"synth-tiny"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })

	body := chatBody("synth-tiny", 24, false)
	resp, got := post(t, front.APIAddr(), body)
	if resp.StatusCode != http.StatusOK || len(got.Choices) != 1 {
		t.Fatalf("through the upstream backend: status %d, %d choices, error %+v", resp.StatusCode, len(got.Choices), got.Error)
	}
	if route := resp.Header.Get("X-Meshinfer-Route"); route != "local" || got.Meshinfer.Route != "local" {
		t.Errorf("route header %q body %q, want local", route, got.Meshinfer.Route)
	}
	_, want := post(t, tn.Node(0).APIAddr(), body)
	if len(want.Choices) != 1 || want.Choices[0].Message.Content == "" {
		t.Fatalf("node 0's own answer: %+v", want)
	}
	if got.Choices[0] != want.Choices[0] {
		t.Errorf("through the upstream backend %+v, node 0 itself %+v", got.Choices[0], want.Choices[0])
	}
}
