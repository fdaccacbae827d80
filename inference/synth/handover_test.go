package synth

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

// moveAt runs req on b with a Move started once k tokens are out, and returns the tokens
// emitted, the rows sent (copies) and the *Moved the generation ended with. preCopy is the
// move's PreCopyBytes.
func moveAt(t *testing.T, b *Backend, req *inference.Request, k, preCopy int) ([]inference.Token, []inference.KVRows, *inference.Moved) {
	t.Helper()
	var rows []inference.KVRows
	r := *req
	r.Move = &inference.Move{PreCopyBytes: preCopy, Send: func(kv inference.KVRows) error {
		kv.Data = slices.Clone(kv.Data)
		rows = append(rows, kv)
		return nil
	}}
	toks, _, err := collect(t, func(emit func(inference.Token) error) (inference.Result, error) {
		return b.Generate(context.Background(), &r, func(tok inference.Token) error {
			if tok.Index == k-1 {
				r.Move.Start()
			}
			return emit(tok)
		})
	})
	var moved *inference.Moved
	if !errors.As(err, &moved) {
		t.Fatalf("Generate with its move started after %d tokens: %v, want *Moved", k, err)
	}
	return toks, rows, moved
}

// resume runs req on b from rows, with the tokens the client has as replay.
func resume(t *testing.T, b *Backend, req *inference.Request, rows []inference.KVRows, have []inference.Token) ([]inference.Token, inference.Result) {
	t.Helper()
	res, err := b.Resume(context.Background(), req)
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	defer res.Close()
	for _, r := range rows {
		if err := res.Load(r); err != nil {
			t.Fatalf("Load(%d+%d): %v", r.Pos, r.N, err)
		}
	}
	toks, result, err := collect(t, func(emit func(inference.Token) error) (inference.Result, error) {
		return res.Generate(context.Background(), ids(have), emit)
	})
	if err != nil {
		t.Fatalf("resumed Generate: %v", err)
	}
	return toks, result
}

// TestResumeIdentical: a generation handed over after k tokens, with all of its rows or
// only some (a transfer cut halfway), goes on elsewhere with the uninterrupted run's tokens
// and result, for greedy, sampled and nucleus requests and stop strings. The rows are
// contiguous from 0, each run within the bound, and cover every position the generation
// ran: the prompt's and the tokens' but the last one's.
func TestResumeIdentical(t *testing.T) {
	src, dst := newBackend(t, "synth-tiny"), newBackend(t, "synth-tiny")
	reqs := map[string]*inference.Request{
		"greedy":  request("the mesh moves a generation from one node to another one", 40, 0, 1),
		"sampled": request("the mesh moves a generation", 40, 0.9, 7),
		"nucleus": func() *inference.Request {
			r := request("a nucleus of tokens", 40, 1.2, 3)
			r.TopP = ptr(0.8)
			return r
		}(),
	}
	want, _, err := run(t, src, reqs["sampled"])
	if err != nil {
		t.Fatal(err)
	}
	stop := request("the mesh moves a generation", 40, 0.9, 7)
	stop.Stop = inference.StopList{text(want[20:22])} // a stop string the run meets
	reqs["stop"] = stop

	for name, req := range reqs {
		want, wantRes, err := run(t, src, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// Three positions of synth-tiny per token early on: the cache moves over several
		// tokens; the default late: it moves at once.
		for _, c := range []struct{ k, preCopy int }{{1, 3 * 2 * 2 * 64 * 4}, {5, 3 * 2 * 2 * 64 * 4}, {len(want) - 2, 0}} {
			k := c.k
			if k < 1 || k >= len(want)-1 {
				continue
			}
			have, rows, moved := moveAt(t, src, req, k, c.preCopy)
			if !slices.Equal(have, want[:len(have)]) || len(have) < k {
				t.Fatalf("%s: the moving run emitted %q, want a prefix of %q of %d or more", name, text(have), text(want), k)
			}
			if k < moved.Positions/2 && len(have) == k {
				t.Errorf("%s: no token came while %d positions moved, 3 a token", name, moved.Positions)
			}
			if moved.Tokens != len(have) {
				t.Fatalf("%s: moved after %d tokens, %d emitted", name, moved.Tokens, len(have))
			}
			pos := 0
			for _, r := range rows {
				if r.Pos != pos || r.Check(src.models[req.Model].preset.Shape()) != nil || len(r.Data)*4 > inference.MaxKVRowsBytes {
					t.Fatalf("%s: rows at %d+%d (%d values), want contiguous from 0 and within the bound", name, r.Pos, r.N, len(r.Data))
				}
				pos += r.N
			}
			// A stop string may hold tokens back: the run fed more than the client has.
			if pos != moved.Positions || pos < wantRes.Usage.PromptTokens+len(have)-1 {
				t.Fatalf("%s: %d positions sent, moved says %d, the run had at least %d", name, pos, moved.Positions, wantRes.Usage.PromptTokens+len(have)-1)
			}
			for _, part := range [][]inference.KVRows{rows, rows[:len(rows)/2], nil} {
				got, res := resume(t, dst, req, part, have)
				// With no row loaded the resumption is a replay, and says so.
				resWant := wantRes
				if len(part) == 0 {
					resWant.Replayed = len(have)
				}
				if !slices.Equal(got, want) || res != resWant {
					t.Fatalf("%s: moved after %d, resumed from %d runs of rows:\n%q %+v\nwant\n%q %+v",
						name, k, len(part), text(got), res, text(want), resWant)
				}
			}
		}
	}
}

// TestMigratedCacheLogits: the next token's logits computed from a cache that was copied
// out and loaded into another stack are the very bits of those computed by the original
// stack.
func TestMigratedCacheLogits(t *testing.T) {
	b := newBackend(t, "synth-small")
	m := b.models["synth-small"]
	w, err := m.load(context.Background(), whole(m.preset))
	if err != nil {
		t.Fatal(err)
	}
	d := w.p.Dim
	tokens := []int{5, 9, 14, 200, 33, 47, 81, 1000, 12, 7, 66, 300, 301, 302, 18, 19, 20, 21, 22}
	orig, moved := newStack(w, 0, w.p.Layers, 64), newStack(w, 0, w.p.Layers, 64)
	x := make([]float32, len(tokens)*d)
	w.embed(x, tokens, 0)
	if err := orig.forward(context.Background(), x, len(tokens)); err != nil {
		t.Fatal(err)
	}
	moved.load(inference.KVRows{Pos: 0, N: len(tokens), Data: orig.rows(nil, 0, len(tokens))})
	next := func(st *stack) []float32 {
		h := make([]float32, d)
		w.embed(h, []int{99}, len(tokens))
		if err := st.forward(context.Background(), h, 1); err != nil {
			t.Fatal(err)
		}
		logits := make([]float32, w.p.Vocab)
		w.logits(logits, make([]float32, d), h)
		return logits
	}
	if a, b := next(orig), next(moved); !slices.Equal(a, b) {
		t.Fatalf("logits after a migrated cache differ from the original's")
	}
}

// TestResumeRefuses: rows that are not the next positions, have the wrong shape or go past
// the generation's positions, and a bad replay, are refused with invalid_request and change
// nothing: the right rows load after them.
func TestResumeRefuses(t *testing.T) {
	b := newBackend(t, "synth-tiny")
	req := request("refuse what does not fit", 8, 0, 1)
	res, err := b.Resume(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	s := res.Shape()
	rows := func(pos, n int) inference.KVRows {
		return inference.KVRows{Pos: pos, N: n, Data: make([]float32, inference.KVValues(s, n))}
	}
	for name, r := range map[string]inference.KVRows{
		"not at 0":      rows(1, 1),
		"short values":  {Pos: 0, N: 2, Data: make([]float32, inference.KVValues(s, 2)-1)},
		"no positions":  {Pos: 0, N: 0},
		"past the room": rows(0, 100),
	} {
		if err := res.Load(r); inference.CodeOf(err) != inference.CodeInvalidRequest {
			t.Errorf("%s: Load = %v, want invalid_request", name, err)
		}
	}
	if err := res.Load(rows(0, 2)); err != nil {
		t.Fatalf("the right rows after refused ones: %v", err)
	}
	if _, err := res.Generate(context.Background(), []int{-1}, func(inference.Token) error { return nil }); inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Errorf("Generate with a bad replay = %v, want invalid_request", err)
	}
	withReplay := *req
	withReplay.Replay = []int{5}
	if _, err := b.Resume(context.Background(), &withReplay); inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Errorf("Resume with a replay in the request = %v, want invalid_request", err)
	}
}
