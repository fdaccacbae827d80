package testnet

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

type completion struct {
	Choices []struct {
		Message      struct{ Content string } `json:"message"`
		FinishReason string                   `json:"finish_reason"`
	} `json:"choices"`
	Meshinfer struct{ Route string } `json:"meshinfer"`
	Error     *struct{ Code string } `json:"error"`
}

func post(t *testing.T, api, body string) (*http.Response, completion) {
	t.Helper()
	resp, err := http.Post("http://"+api+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c completion
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		t.Fatal(err)
	}
	return resp, c
}

func chatBody(model string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": maxTokens, "seed": 3, "temperature": 0.7, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": "what is a mesh?"}},
	})
	return string(b)
}

// A request to node 0 for a model only node 1 serves is served by node 1, with the same
// text node 1 gives locally; a model nobody serves is model_not_found.
func TestRequestCrossesTheMesh(t *testing.T) {
	tn := start(t, Options{Nodes: 2, NoConsole: true, Heartbeat: 15 * time.Second})
	within(t, 10*time.Second, "converge", tn.Converged)
	n0, n1 := tn.Node(0), tn.Node(1)
	resp, remote := post(t, n0.APIAddr(), chatBody("synth-small", 24, false))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	want := "peer:" + n1.ID().String()
	if got := resp.Header.Get("X-Meshinfer-Route"); got != want || remote.Meshinfer.Route != want {
		t.Fatalf("route header %q body %q, want %q", got, remote.Meshinfer.Route, want)
	}
	_, local := post(t, n1.APIAddr(), chatBody("synth-small", 24, false))
	if remote.Choices[0].Message.Content == "" || remote.Choices[0].Message.Content != local.Choices[0].Message.Content {
		t.Fatalf("served across the mesh %q, locally %q", remote.Choices[0].Message.Content, local.Choices[0].Message.Content)
	}
	resp, missing := post(t, n0.APIAddr(), chatBody("synth-nobody", 8, false))
	if resp.StatusCode != http.StatusNotFound || missing.Error == nil || missing.Error.Code != "model_not_found" {
		t.Fatalf("unknown model: status %d error %+v", resp.StatusCode, missing.Error)
	}
}

// A serving peer killed mid-stream ends the client's stream with a typed error event, not a
// hang and not a silent truncation.
func TestPeerKilledMidStreamEndsWithTypedError(t *testing.T) {
	gate := newTokenGate()
	tn := start(t, Options{Nodes: 2, NoConsole: true, Heartbeat: 15 * time.Second, Configure: gate.configure})
	within(t, 10*time.Second, "converge", tn.Converged)
	// Node 1 stops after 3 tokens (each token is one event) until it is killed.
	open := gate.Hold(t, 3)
	resp, err := http.Post("http://"+tn.Node(0).APIAddr()+"/v1/chat/completions", "application/json",
		bytes.NewReader([]byte(chatBody("synth-small", 48, true))))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	events, killed := 0, false
	var last string
	deadline := time.AfterFunc(20*time.Second, func() { resp.Body.Close() })
	defer deadline.Stop()
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		last = line
		events++
		if events == 3 && !killed {
			killed = true
			if err := tn.Kill(1); err != nil {
				t.Fatal(err)
			}
			open()
		}
	}
	if !killed {
		t.Fatalf("stream ended after %d events, before the kill", events)
	}
	if !strings.Contains(last, `"error"`) || !strings.Contains(last, "peer_lost") {
		t.Fatalf("last event %q: want an error event with code peer_lost", last)
	}
}
