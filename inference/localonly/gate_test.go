package localonly

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
)

func ptr[T any](v T) *T { return &v }

func testRequest(model string) *inference.Request {
	return &inference.Request{
		Model:       model,
		Messages:    []inference.Message{{Role: inference.RoleUser, Content: "hello device"}},
		MaxTokens:   ptr(12),
		Temperature: ptr(0.8),
		Seed:        ptr[int64](3),
	}
}

// collect runs req on g and returns the streamed text.
func collect(ctx context.Context, g *Gate, req *inference.Request) (string, inference.Result, error) {
	var b strings.Builder
	res, err := g.Generate(ctx, req, func(t inference.Token) error {
		b.WriteString(t.Text)
		return nil
	})
	return b.String(), res, err
}

func newSynth(t *testing.T, models ...string) *synth.Backend {
	t.Helper()
	b, err := synth.New(models...)
	if err != nil {
		t.Fatalf("synth.New: %v", err)
	}
	return b
}

func wantCode(t *testing.T, err error, code inference.Code) {
	t.Helper()
	if got := inference.CodeOf(err); got != code {
		t.Fatalf("error %v has code %q, want %q", err, got, code)
	}
}

func TestServesOnLocalBackend(t *testing.T) {
	g := New(newSynth(t, "synth-tiny"))
	got, res, err := collect(context.Background(), g, testRequest("synth-tiny"))
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	var want strings.Builder
	wantRes, err := newSynth(t, "synth-tiny").Generate(context.Background(), testRequest("synth-tiny"), func(t inference.Token) error {
		want.WriteString(t.Text)
		return nil
	})
	if err != nil {
		t.Fatalf("reference Generate: %v", err)
	}
	if got != want.String() || res != wantRes {
		t.Errorf("got %q %+v\nwant %q %+v", got, res, want.String(), wantRes)
	}
	if s := g.Stats(); s != (Stats{Served: 1}) {
		t.Errorf("Stats = %+v, want one served", s)
	}
}

func TestNoBackend(t *testing.T) {
	g := New(nil)
	_, _, err := collect(context.Background(), g, testRequest("synth-tiny"))
	wantCode(t, err, inference.CodeLocalUnavailable)
	if !strings.Contains(err.Error(), "runs no local backend") {
		t.Errorf("message %q does not say there is no local backend", err)
	}
	if s := g.Stats(); s != (Stats{Refused: 1}) {
		t.Errorf("Stats = %+v, want one refused", s)
	}
}

func TestModelNotLocal(t *testing.T) {
	b := newSynth(t, "synth-tiny", "synth-small")
	g := New(b)
	for _, route := range []inference.RouteMode{"", inference.RouteExplicit} { // auto: see TestAutoModel
		req := testRequest("synth-base")
		req.Prefs.Route = route
		text, _, err := collect(context.Background(), g, req)
		wantCode(t, err, inference.CodeLocalUnavailable)
		if !strings.Contains(err.Error(), "synth-tiny, synth-small") || text != "" {
			t.Errorf("route %q: error %q streamed %q; want the local models named, nothing streamed", route, err, text)
		}
	}
	// Nothing was run: the models are still cold.
	infos, _ := b.Models(context.Background())
	for _, m := range infos {
		if m.Warm {
			t.Errorf("model %s was loaded for a refused request", m.Name)
		}
	}
	if s := g.Stats(); s != (Stats{Refused: 2}) {
		t.Errorf("Stats = %+v, want two refused", s)
	}
}

func TestAutoModel(t *testing.T) {
	tests := []struct {
		name   string
		models []inference.ModelInfo
		model  string
		route  inference.RouteMode
		want   string // the model run; "" for local_unavailable
	}{
		{"first warm", []inference.ModelInfo{{Name: "a"}, {Name: "b", Warm: true}, {Name: "c", Warm: true}}, "", inference.RouteAuto, "b"},
		{"auto name", []inference.ModelInfo{{Name: "a"}, {Name: "b", Warm: true}}, inference.AutoModel, inference.RouteAuto, "b"},
		{"none warm", []inference.ModelInfo{{Name: "a"}, {Name: "b"}}, "", inference.RouteAuto, "a"},
		{"named stays", []inference.ModelInfo{{Name: "a"}, {Name: "b", Warm: true}}, "a", inference.RouteAuto, "a"},
		{"named elsewhere: a local one", []inference.ModelInfo{{Name: "a"}, {Name: "b", Warm: true}}, "remote-model", inference.RouteAuto, "b"},
		{"explicit named elsewhere", []inference.ModelInfo{{Name: "a", Warm: true}}, "remote-model", inference.RouteExplicit, ""},
		{"no local model", nil, "", inference.RouteAuto, ""},
		{"explicit needs a model", []inference.ModelInfo{{Name: "a", Warm: true}}, "", inference.RouteExplicit, ""},
		{"explicit auto is a name", []inference.ModelInfo{{Name: "a", Warm: true}}, inference.AutoModel, inference.RouteExplicit, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBackend{models: tt.models}
			req := testRequest(tt.model)
			req.Prefs.Route = tt.route
			_, _, err := collect(context.Background(), New(b), req)
			if tt.want == "" {
				wantCode(t, err, inference.CodeLocalUnavailable)
				if b.ran != "" {
					t.Errorf("ran %q, want nothing run", b.ran)
				}
				return
			}
			if err != nil || b.ran != tt.want {
				t.Errorf("ran %q (%v), want %q", b.ran, err, tt.want)
			}
			if req.Model != tt.model {
				t.Errorf("caller's request model changed to %q", req.Model)
			}
		})
	}
}

func TestErrorMapping(t *testing.T) {
	typed := func(c inference.Code) error { return inference.Errorf(c, "backend says %s", c) }
	deadline := fmt.Errorf("load weights: %w", context.DeadlineExceeded)
	tests := []struct {
		name   string
		err    error
		after  int  // tokens emitted before the failure
		models bool // Models fails instead of Generate
		want   inference.Code
		same   bool // the backend's error is returned unchanged
	}{
		{name: "unavailable", err: typed(inference.CodeUnavailable), want: inference.CodeLocalUnavailable},
		{name: "untyped", err: errors.New("gpu fell off"), want: inference.CodeLocalUnavailable},
		{name: "model not found", err: typed(inference.CodeModelNotFound), want: inference.CodeLocalUnavailable},
		{name: "overloaded", err: typed(inference.CodeOverloaded), want: inference.CodeLocalUnavailable},
		{name: "timeout", err: typed(inference.CodeTimeout), want: inference.CodeLocalUnavailable},
		{name: "backend deadline", err: deadline, want: inference.CodeLocalUnavailable},
		{name: "policy paused", err: typed(inference.CodePolicyPaused), want: inference.CodeLocalUnavailable},
		{name: "peer lost", err: typed(inference.CodePeerLost), want: inference.CodeLocalUnavailable},
		{name: "models fails", err: typed(inference.CodeUnavailable), models: true, want: inference.CodeLocalUnavailable},
		{name: "invalid request", err: typed(inference.CodeInvalidRequest), want: inference.CodeInvalidRequest, same: true},
		{name: "context overflow", err: typed(inference.CodeContextOverflow), want: inference.CodeContextOverflow, same: true},
		{name: "shutting down", err: typed(inference.CodeShuttingDown), want: inference.CodeShuttingDown, same: true},
		{name: "unavailable after a token", err: typed(inference.CodeUnavailable), after: 1, want: inference.CodeUnavailable, same: true},
		{name: "overloaded after tokens", err: typed(inference.CodeOverloaded), after: 3, want: inference.CodeOverloaded, same: true},
		{name: "untyped after a token", err: errors.New("gpu fell off"), after: 2, want: inference.CodeUnavailable, same: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &fakeBackend{models: []inference.ModelInfo{{Name: "m", Warm: true}}, tokens: tt.after, err: tt.err}
			if tt.models {
				b.modelsErr, b.err = tt.err, nil
			}
			g := New(b)
			_, _, err := collect(context.Background(), g, testRequest("m"))
			wantCode(t, err, tt.want)
			if tt.same && err != tt.err {
				t.Errorf("error %v, want the backend's %v unchanged", err, tt.err)
			}
			if !tt.same && !errors.Is(err, tt.err) {
				t.Errorf("error %v does not wrap the backend's %v", err, tt.err)
			}
			if !tt.same && !strings.Contains(err.Error(), tt.err.Error()) {
				t.Errorf("message %q does not carry the backend's %q", err, tt.err)
			}
			s := g.Stats()
			if want := (tt.want == inference.CodeLocalUnavailable); (s.Refused == 1) != want || s.Refused+s.Failed != 1 || s.Served != 0 {
				t.Errorf("Stats = %+v", s)
			}
		})
	}
}

// TestCallerContext: the caller's cancellation and deadline pass through, before or after
// the first token, whatever code the backend gave them.
func TestCallerContext(t *testing.T) {
	for _, after := range []int{0, 2} {
		t.Run(fmt.Sprintf("after %d tokens", after), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			b := &fakeBackend{models: []inference.ModelInfo{{Name: "m"}}, tokens: after,
				hook: cancel, err: inference.Errorf(inference.CodeUnavailable, "stopped: %w", context.Canceled)}
			g := New(b)
			_, _, err := collect(ctx, g, testRequest("m"))
			if err != b.err {
				t.Errorf("error %v, want the backend's unchanged", err)
			}
			if g.Stats() != (Stats{Failed: 1}) {
				t.Errorf("Stats = %+v, want one failed", g.Stats())
			}
		})
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel()
	b := &fakeBackend{models: []inference.ModelInfo{{Name: "m"}}, err: fmt.Errorf("prefill: %w", context.DeadlineExceeded)}
	if _, _, err := collect(ctx, New(b), testRequest("m")); err != b.err {
		t.Errorf("caller's deadline: error %v, want the backend's unchanged", err)
	}
}

// TestSynthFailures runs the real backend into its own failures.
func TestSynthFailures(t *testing.T) {
	g := New(newSynth(t, "synth-tiny"))

	req := testRequest("synth-tiny")
	req.Messages[0].Content = strings.Repeat("lorem ipsum dolor sit amet ", 400)
	_, _, err := collect(context.Background(), g, req)
	wantCode(t, err, inference.CodeContextOverflow)

	// Cancelled mid-stream by the caller.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	_, err = g.Generate(ctx, testRequest("synth-tiny"), func(inference.Token) error {
		if n++; n == 2 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || inference.CodeOf(err) == inference.CodeLocalUnavailable {
		t.Errorf("cancelled mid-stream: %v, want the cancellation unchanged", err)
	}

	// The client gone: emit's error comes back unchanged.
	gone := errors.New("client gone")
	_, err = g.Generate(context.Background(), testRequest("synth-tiny"), func(inference.Token) error { return gone })
	if err != gone {
		t.Errorf("emit failing: %v, want emit's error unchanged", err)
	}
	if s := g.Stats(); s != (Stats{Failed: 3}) {
		t.Errorf("Stats = %+v, want three failed", s)
	}
}

// fakeBackend lists models and fails as told; it exists to drive the Gate's error mapping,
// which the synthetic backend cannot produce on demand.
type fakeBackend struct {
	models    []inference.ModelInfo
	modelsErr error
	tokens    int    // tokens to emit before returning err
	err       error  // Generate's outcome after the tokens; nil for success
	hook      func() // runs after the tokens, before returning
	ran       string // the model Generate was called with
}

func (f *fakeBackend) Models(context.Context) ([]inference.ModelInfo, error) {
	return f.models, f.modelsErr
}

func (f *fakeBackend) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	f.ran = req.Model
	for i := range f.tokens {
		if err := emit(inference.Token{Index: i, Text: "x", ID: i}); err != nil {
			return inference.Result{}, err
		}
	}
	if f.hook != nil {
		f.hook()
	}
	if f.err != nil {
		return inference.Result{}, f.err
	}
	return inference.Result{FinishReason: inference.FinishStop}, nil
}
