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
	var toks []inference.Token
	returned := false
	res, err := b.Generate(ctx, req, func(tok inference.Token) error {
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
