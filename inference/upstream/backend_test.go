package upstream_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/inference/upstream"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// Through a real meshinfer API, the upstream backend streams exactly what synth produces
// locally: the same tokens in the same order, the same finish reason and usage.
func TestTokensEqualSynth(t *testing.T) {
	srv := serveAPI(t, newDispatcher(t))
	b := newBackend(t, srv.URL, []string{testModel})
	local, err := synth.New(testModel)
	if err != nil {
		t.Fatalf("synth.New: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*inference.Request)
	}{
		{"sampled", func(r *inference.Request) {}},
		{"greedy", func(r *inference.Request) { r.Temperature = ptr(0.0) }},
		{"top_p", func(r *inference.Request) { r.TopP = ptr(0.5); r.Seed = ptr[int64](-3) }},
		{"default budget", func(r *inference.Request) { r.MaxTokens = nil; r.Seed = nil; r.Temperature = nil }},
		{"max_completion_tokens", func(r *inference.Request) { r.MaxCompletionTokens = ptr(5) }},
		{"one token", func(r *inference.Request) { r.MaxTokens = ptr(1) }},
	}
	for _, tt := range tests {
		req := testRequest()
		tt.mutate(&req)
		want := generate(context.Background(), local, req)
		if want.err != nil {
			t.Fatalf("%s: synth: %v", tt.name, want.err)
		}
		got := generate(context.Background(), b, req)
		if got.err != nil {
			t.Fatalf("%s: upstream: %v", tt.name, got.err)
		}
		checkStream(t, got.tokens)
		if !slices.Equal(got.texts(), want.texts()) {
			t.Errorf("%s: upstream tokens %q\nsynth tokens    %q", tt.name, got.texts(), want.texts())
		}
		if got.res != want.res {
			t.Errorf("%s: upstream result %+v, synth %+v", tt.name, got.res, want.res)
		}
	}
}

// A stop string ends the completion where synth ends it, with the same text.
func TestStopStringEqualsSynth(t *testing.T) {
	srv := serveAPI(t, newDispatcher(t))
	b := newBackend(t, srv.URL, []string{testModel})
	local, err := synth.New(testModel)
	if err != nil {
		t.Fatalf("synth.New: %v", err)
	}
	full := generate(context.Background(), local, testRequest())
	if full.err != nil || len(full.tokens) < 10 {
		t.Fatalf("reference run: %d tokens, err %v", len(full.tokens), full.err)
	}
	// A stop string taken from the middle of the reference output.
	text := strings.Join(full.texts(), "")
	req := testRequest()
	req.Stop = inference.StopList{text[len(text)/2 : len(text)/2+2]}
	want := generate(context.Background(), local, req)
	got := generate(context.Background(), b, req)
	if want.err != nil || got.err != nil {
		t.Fatalf("synth err %v, upstream err %v", want.err, got.err)
	}
	checkStream(t, got.tokens)
	if g, w := strings.Join(got.texts(), ""), strings.Join(want.texts(), ""); g != w {
		t.Errorf("upstream text %q, synth %q", g, w)
	}
	if got.res != want.res || got.res.FinishReason != inference.FinishStop {
		t.Errorf("upstream result %+v, synth %+v (want stop)", got.res, want.res)
	}
}

func TestModels(t *testing.T) {
	srv := serveAPI(t, newDispatcher(t))
	b := newBackend(t, srv.URL+"/v1/", []string{testModel, "llama-3-8b"})
	got, err := b.Models(context.Background()) // before any listing: all cold, at once
	if err != nil || len(got) != 2 || got[0].Warm || got[1].Warm {
		t.Errorf("Models before the first listing = %+v, %v; want both cold", got, err)
	}
	waitWarm(t, b)
	got, err = b.Models(context.Background())
	// The upstream, a meshinfer API, says its built-in model is deterministic.
	want := []inference.ModelInfo{{Name: testModel, Warm: true, Deterministic: true}, {Name: "llama-3-8b", Warm: false}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("Models = %+v, %v; want %+v", got, err, want)
	}

	// An upstream that does not answer leaves the configured models cold, not absent.
	down := newBackend(t, closedURL(t), []string{testModel})
	got, err = down.Models(context.Background())
	want = []inference.ModelInfo{{Name: testModel, Warm: false}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("Models of a closed port = %+v, %v; want %+v", got, err, want)
	}
}

// Models answers at once while the upstream's /v1/models hangs, and requests are served
// meanwhile; once the listing comes, the model is warm. A caller's context never cuts the
// listing short.
func TestModelsNeverWaitsForTheUpstream(t *testing.T) {
	api := openai.Handler(newDispatcher(t))
	release := make(chan struct{})
	var listings atomic.Int64
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			listings.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		api.ServeHTTP(w, r)
	}))
	b := newBackend(t, srv.URL, []string{testModel})
	gone, cancel := context.WithCancel(context.Background())
	cancel() // a client that already hung up
	for range 100 {
		if got, err := b.Models(gone); err != nil || got[0].Warm {
			t.Fatalf("Models while the listing hangs = %+v, %v; want cold, at once", got, err)
		}
	}
	if r := generate(context.Background(), b, testRequest()); r.err != nil {
		t.Fatalf("Generate while the listing hangs: %v", r.err)
	}
	if n := listings.Load(); n != 1 {
		t.Fatalf("%d listing requests, want one at a time", n)
	}
	close(release)
	waitWarm(t, b)
}

// The API key goes out as a bearer token on every request, and no header goes out without one.
func TestAPIKeyHeader(t *testing.T) {
	for _, key := range []string{"sk-test-123", ""} {
		want := ""
		if key != "" {
			want = "Bearer " + key
		}
		api := openai.Handler(newDispatcher(t))
		var seen atomic.Int64
		srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen.Add(1)
			if got := r.Header.Get("Authorization"); got != want {
				t.Errorf("%s %s: Authorization %q, want %q", r.Method, r.URL.Path, got, want)
			}
			api.ServeHTTP(w, r)
		}))
		b := newBackend(t, srv.URL, []string{testModel}, upstream.WithAPIKey(key))
		if r := generate(context.Background(), b, testRequest()); r.err != nil {
			t.Fatalf("key %q: Generate: %v", key, r.err)
		}
		waitWarm(t, b) // the models request reached the server
		if seen.Load() != 2 {
			t.Errorf("key %q: server saw %d requests, want 2", key, seen.Load())
		}
	}
}

// emit's error stops Generate and comes back unchanged.
func TestEmitErrorReturnedUnchanged(t *testing.T) {
	srv := serveAPI(t, newDispatcher(t))
	b := newBackend(t, srv.URL, []string{testModel})
	stop := errors.New("client went away")
	n := 0
	req := testRequest()
	res, err := b.Generate(context.Background(), &req, func(tok inference.Token) error {
		n++
		if tok.Index == 2 {
			return stop
		}
		return nil
	})
	if err != stop || res != (inference.Result{}) || n != 3 {
		t.Errorf("Generate = %+v, %v after %d tokens; want the emit error itself after 3", res, err, n)
	}
}

func TestNewRefuses(t *testing.T) {
	tests := []struct {
		base   string
		models []string
	}{
		{"", []string{"m"}},
		{"127.0.0.1:8080", []string{"m"}},
		{"ftp://host/", []string{"m"}},
		{"http://", []string{"m"}},
		{"http://host:1/?q=1", []string{"m"}},
		{"http://host:1", nil},
		{"http://host:1", []string{""}},
		{"http://host:1", []string{"m", "n", "m"}},
	}
	for _, tt := range tests {
		if b, err := upstream.New(tt.base, tt.models); err == nil {
			b.Close()
			t.Errorf("New(%q, %q) = nil error, want one", tt.base, tt.models)
		}
	}
	if _, err := upstream.New("http://h:1", []string{"m"}, upstream.WithHTTPClient(nil)); err == nil {
		t.Errorf("New with a nil client = nil error, want one")
	}
}
