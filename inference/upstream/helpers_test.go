package upstream_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/inference/upstream"
	"github.com/meshinfer/meshinfer/transport/openai"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testModel = "synth-tiny"

func ptr[T any](v T) *T { return &v }

// synthDispatcher is the real API's Dispatcher over the real synthetic backend, route
// "local". Its hooks only fail or hold a request: tokens always come from the backend.
type synthDispatcher struct {
	b *synth.Backend
	// before, if set, runs before generation; a non-nil error is Generate's outcome.
	before func(ctx context.Context) error
	// after, if set, runs after each token has been emitted; a non-nil error ends Generate
	// with it, as a backend failing mid-stream would.
	after func(ctx context.Context, t inference.Token) error
}

func newDispatcher(t testing.TB) *synthDispatcher {
	t.Helper()
	b, err := synth.New(testModel)
	if err != nil {
		t.Fatalf("synth.New: %v", err)
	}
	return &synthDispatcher{b: b}
}

func (d *synthDispatcher) Models(ctx context.Context) []openai.Model {
	infos, _ := d.b.Models(ctx) // never fails
	out := make([]openai.Model, 0, len(infos))
	for _, m := range infos {
		out = append(out, openai.Model{ID: m.Name, Warm: m.Warm, Routes: []string{"local"}, Deterministic: m.Deterministic})
	}
	return out
}

func (d *synthDispatcher) Generate(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	at := inference.Served{Tier: inference.TierLocal, Attempts: 1}
	if d.before != nil {
		if err := d.before(ctx); err != nil {
			return inference.Result{}, at, err
		}
	}
	res, err := d.b.Generate(ctx, req, func(t inference.Token) error {
		if err := emit(at, t); err != nil {
			return err
		}
		if d.after != nil {
			return d.after(ctx, t)
		}
		return nil
	})
	return res, at, err
}

// serve runs h on a loopback httptest server for the test's duration.
func serve(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// serveAPI runs our own OpenAI-compatible API over d: the real upstream server.
func serveAPI(t testing.TB, d openai.Dispatcher) *httptest.Server {
	t.Helper()
	return serve(t, openai.Handler(d))
}

// newBackend is upstream.New that fails the test on error and closes the backend at its end.
func newBackend(t testing.TB, base string, models []string, opts ...upstream.Option) *upstream.Backend {
	t.Helper()
	b, err := upstream.New(base, models, opts...)
	if err != nil {
		t.Fatalf("upstream.New(%q, %q): %v", base, models, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func testRequest() inference.Request {
	return inference.Request{
		Model:       testModel,
		Messages:    []inference.Message{{Role: inference.RoleSystem, Content: "be brief"}, {Role: inference.RoleUser, Content: "hello mesh"}},
		MaxTokens:   ptr(24),
		Temperature: ptr(0.8),
		Seed:        ptr[int64](7),
	}
}

// run is one Generate with its emitted tokens.
type run struct {
	tokens []inference.Token
	res    inference.Result
	err    error
}

func (r run) texts() []string {
	out := make([]string, len(r.tokens))
	for i, t := range r.tokens {
		out[i] = t.Text
	}
	return out
}

func generate(ctx context.Context, b inference.Backend, req inference.Request) run {
	var r run
	r.res, r.err = b.Generate(ctx, &req, func(t inference.Token) error {
		r.tokens = append(r.tokens, t)
		return nil
	})
	return r
}

// checkStream reports tokens whose indices are not 0, 1, … or whose text is empty.
func checkStream(t testing.TB, tokens []inference.Token) {
	t.Helper()
	for i, tok := range tokens {
		if tok.Index != i || tok.Text == "" || tok.ID != -1 {
			t.Fatalf("token %d = %+v, want index %d, non-empty text, id -1", i, tok, i)
		}
	}
}

// waitWarm waits until b lists its first model warm: its background listing has answered.
func waitWarm(t testing.TB, b *upstream.Backend) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if models, _ := b.Models(context.Background()); models[0].Warm {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the model never became warm: no listing reached the upstream")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
