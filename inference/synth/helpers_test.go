package synth

import (
	"context"
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

func ptr[T any](v T) *T { return &v }

// request builds a synth-tiny request for one user message.
func request(prompt string, maxTokens int, temp float64, seed int64) *inference.Request {
	return &inference.Request{
		Model:       "synth-tiny",
		Messages:    []inference.Message{{Role: inference.RoleUser, Content: prompt}},
		MaxTokens:   ptr(maxTokens),
		Temperature: ptr(temp),
		Seed:        ptr(seed),
	}
}

// run is one Generate, collecting what it emitted. It checks the parts of the Backend
// contract that hold for every call: contiguous indices, non-empty texts, and exactly one of
// a finish reason or an error.
func run(t *testing.T, b *Backend, req *inference.Request) ([]inference.Token, inference.Result, error) {
	t.Helper()
	return runCtx(t, context.Background(), b, req)
}

func runCtx(t *testing.T, ctx context.Context, b *Backend, req *inference.Request) ([]inference.Token, inference.Result, error) {
	t.Helper()
	return collect(t, func(emit func(inference.Token) error) (inference.Result, error) {
		return b.Generate(ctx, req, emit)
	})
}

// runWith is run with GenerateWith over layers.
func runWith(t *testing.T, b *Backend, req *inference.Request, layers inference.Layers) ([]inference.Token, inference.Result, error) {
	t.Helper()
	return collect(t, func(emit func(inference.Token) error) (inference.Result, error) {
		return b.GenerateWith(context.Background(), req, layers, emit)
	})
}

// collect runs generate, collecting what it emitted, and checks the Backend contract's
// parts that hold for every call (see run).
func collect(t *testing.T, generate func(emit func(inference.Token) error) (inference.Result, error)) ([]inference.Token, inference.Result, error) {
	t.Helper()
	var toks []inference.Token
	returned := false
	res, err := generate(func(tok inference.Token) error {
		if returned {
			t.Errorf("emit called after Generate returned")
		}
		if tok.Index != len(toks) {
			t.Errorf("token index %d, want %d", tok.Index, len(toks))
		}
		if tok.Text == "" {
			t.Errorf("token %d has empty text", tok.Index)
		}
		toks = append(toks, tok)
		return nil
	})
	returned = true
	switch {
	case err != nil && res != (inference.Result{}):
		t.Errorf("Generate returned both %v and %+v", err, res)
	case err == nil && res.FinishReason != inference.FinishStop && res.FinishReason != inference.FinishLength:
		t.Errorf("Generate succeeded with finish reason %q", res.FinishReason)
	case err == nil && res.Usage.TotalTokens != res.Usage.PromptTokens+res.Usage.CompletionTokens:
		t.Errorf("usage %+v does not add up", res.Usage)
	case err == nil && res.Usage.CompletionTokens < len(toks):
		t.Errorf("usage counts %d completion tokens, %d emitted", res.Usage.CompletionTokens, len(toks))
	}
	return toks, res, err
}

func newBackend(t testing.TB, models ...string) *Backend {
	t.Helper()
	b, err := New(models...)
	if err != nil {
		t.Fatalf("New(%v): %v", models, err)
	}
	return b
}

func ids(toks []inference.Token) []int {
	out := make([]int, len(toks))
	for i, tok := range toks {
		out[i] = tok.ID
	}
	return out
}

func text(toks []inference.Token) string {
	var b strings.Builder
	for _, tok := range toks {
		b.WriteString(tok.Text)
	}
	return b.String()
}

// logitsAfter runs tokens through w, a whole model, at positions 0…, in calls of at most
// split positions, and returns the logits after the last one.
func logitsAfter(t testing.TB, w *weights, tokens []int, split int) []float32 {
	t.Helper()
	d := w.p.Dim
	x := make([]float32, len(tokens)*d)
	w.embed(x, tokens, 0)
	st := newStack(w, 0, w.p.Layers, len(tokens))
	for done := 0; done < len(tokens); done += split {
		n := min(split, len(tokens)-done)
		if err := st.forward(context.Background(), x[done*d:(done+n)*d], n); err != nil {
			t.Fatalf("forward: %v", err)
		}
	}
	logits := make([]float32, w.p.Vocab)
	w.logits(logits, make([]float32, d), x[(len(tokens)-1)*d:])
	return logits
}

// pipeline opens one stage session of model per range [bounds[i], bounds[i+1]), each for
// maxPositions positions, and returns the Layers that runs them in order, as a head whose
// stages are in this process would, and a function that closes the sessions.
func pipeline(t testing.TB, b *Backend, model string, bounds []int, maxPositions int) (inference.Layers, func()) {
	t.Helper()
	var stages []inference.StageSession
	closeAll := func() {
		for _, s := range stages {
			s.Close()
		}
	}
	for i := range len(bounds) - 1 {
		s, err := b.OpenStage(context.Background(), model, bounds[i], bounds[i+1], maxPositions)
		if err != nil {
			closeAll()
			t.Fatalf("OpenStage(%s, %d, %d): %v", model, bounds[i], bounds[i+1], err)
		}
		stages = append(stages, s)
	}
	layers := func(ctx context.Context, hidden []float32, n int) ([]float32, error) {
		for _, s := range stages {
			var err error
			if hidden, err = s.Forward(ctx, hidden, n); err != nil {
				return nil, err
			}
		}
		return hidden, nil
	}
	return layers, closeAll
}
