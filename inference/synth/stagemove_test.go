package synth

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

// TestStageMoveIdentical: a stage session's KV cache, read after k positions (in runs of
// any size) and loaded into a fresh session of the same layers, gives bit for bit the
// outputs the original would have given for the next positions; the positions loaded must
// follow on, and rows of another shape change nothing.
func TestStageMoveIdentical(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, "synth-small")
	const d, lo, hi, k = 256, 1, 3, blockSize + 5
	rng := rand.New(rand.NewPCG(3, 4))
	input := func(n int) []float32 {
		x := make([]float32, n*d)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	open := func() inference.StageMover {
		s, err := b.OpenStage(ctx, "synth-small", lo, hi, 64)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s.(inference.StageMover)
	}
	forward := func(s inference.StageSession, x []float32) []float32 {
		t.Helper()
		out, err := s.Forward(ctx, x, len(x)/d)
		if err != nil {
			t.Fatalf("Forward: %v", err)
		}
		return out
	}
	prompt := input(k)
	next := [][]float32{input(1), input(1), input(3), input(1)}

	src := open()
	forward(src, prompt)
	if src.Positions() != k {
		t.Fatalf("Positions %d after %d, want %d", src.Positions(), k, k)
	}
	dst := open()
	for _, run := range [][2]int{{0, 1}, {1, 7}, {8, k - 8}} {
		r, err := src.Rows(nil, run[0], run[1])
		if err != nil {
			t.Fatalf("Rows(%d, %d): %v", run[0], run[1], err)
		}
		if want := (hi - lo) * 2 * run[1] * d; len(r.Data) != want {
			t.Fatalf("Rows(%d, %d): %d values, want %d (the session's layers only)", run[0], run[1], len(r.Data), want)
		}
		if err := dst.Load(r); err != nil {
			t.Fatalf("Load(%d+%d): %v", r.Pos, r.N, err)
		}
	}
	if dst.Positions() != k {
		t.Fatalf("loaded session holds %d positions, want %d", dst.Positions(), k)
	}
	for i, x := range next {
		want, got := forward(src, x), forward(dst, x)
		if !bitsEqual(got, want) {
			t.Fatalf("step %d after the move: the loaded session's output differs from the original's", i)
		}
	}

	// Refusals: rows that do not follow on, of another layer count, past the capacity, or
	// not held; none changes the session.
	fresh := open()
	r, err := src.Rows(nil, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	bad := []inference.KVRows{
		{Pos: 1, N: 4, Data: r.Data},                     // not at 0
		{Pos: 0, N: 4, Data: r.Data[:len(r.Data)/2]},     // one layer's worth
		{Pos: 0, N: 3, Data: r.Data},                     // count and values disagree
		{Pos: 0, N: 65, Data: make([]float32, 2*2*65*d)}, // past maxPositions
		{Pos: 0, N: 0, Data: nil},                        // empty
	}
	for i, rows := range bad {
		if err := fresh.Load(rows); inference.CodeOf(err) != inference.CodeInvalidRequest {
			t.Errorf("bad rows %d: %v, want invalid_request", i, err)
		}
		if fresh.Positions() != 0 {
			t.Fatalf("bad rows %d changed the session: %d positions", i, fresh.Positions())
		}
	}
	for _, run := range [][2]int{{-1, 2}, {0, 0}, {src.Positions() - 1, 2}} {
		if _, err := src.Rows(nil, run[0], run[1]); inference.CodeOf(err) != inference.CodeInvalidRequest {
			t.Errorf("Rows(%d, %d): %v, want invalid_request", run[0], run[1], err)
		}
	}
	src.Close()
	if _, err := src.Rows(nil, 0, 1); inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Errorf("Rows of a closed session: %v, want invalid_request", err)
	}
}
