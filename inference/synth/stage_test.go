package synth

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// TestShape: the shapes add up, synth-small's and synth-large's figures are the documented
// ones, and an unknown model is model_not_found.
func TestShape(t *testing.T) {
	for _, p := range Presets() {
		s := p.Shape()
		if s.WeightBytes != 4*s.Params || s.WeightBytes != int64(s.Layers)*s.LayerBytes+s.HeadBytes {
			t.Errorf("%s: %+v does not add up", p.Name, s)
		}
	}
	b := newBackend(t, "synth-small", "synth-large")
	tests := []struct {
		model string
		want  inference.ModelShape
	}{
		{"synth-small", inference.ModelShape{Layers: 4, Width: 256, Params: 5_245_184, WeightBytes: 20_980_736,
			LayerBytes: 3_147_776, HeadBytes: 8_389_632, KVBytesPerToken: 8192, Context: 4096}},
		{"synth-large", inference.ModelShape{Layers: 16, Width: 768, Params: 120_349_440, WeightBytes: 481_397_760,
			LayerBytes: 28_317_696, HeadBytes: 28_314_624, KVBytesPerToken: 98_304, Context: 1024}},
	}
	for _, tt := range tests {
		if got, err := b.Shape(tt.model); err != nil || got != tt.want {
			t.Errorf("Shape(%s) = %+v, %v; want %+v", tt.model, got, err, tt.want)
		}
	}
	if _, err := b.Shape("synth-tiny"); inference.CodeOf(err) != inference.CodeModelNotFound {
		t.Errorf("Shape of a model not served: %v, want model_not_found", err)
	}
}

// TestPartTensors: a part lays out exactly its own tensors, with the values the whole model
// has for them.
func TestPartTensors(t *testing.T) {
	p, _ := LookupPreset("synth-tiny")
	names := func(pt part) []string {
		w := &weights{p: p, part: pt}
		var out []string
		for _, ts := range w.tensors() {
			out = append(out, ts.name)
		}
		return out
	}
	if got := names(headOnly()); !slices.Equal(got, []string{"tok_emb", "pos_emb", "final_norm", "out"}) {
		t.Errorf("head tensors %v", got)
	}
	got := names(layerRange(1, 2))
	if len(got) != 8 {
		t.Errorf("layer 1 has %d tensors, want 8: %v", len(got), got)
	}
	for _, name := range got {
		if !strings.HasPrefix(name, "layer1.") {
			t.Errorf("layers [1, 2) lay out %q", name)
		}
	}

	ctx := context.Background()
	all, err := materialize(ctx, p, whole(p))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := materialize(ctx, p, layerRange(1, 2))
	if err != nil {
		t.Fatal(err)
	}
	head, err := materialize(ctx, p, headOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(all.all) != p.Params() || len(layer.all) != p.LayerParams() || len(head.all) != p.HeadParams() {
		t.Errorf("parts of %d, %d, %d values; want %d, %d, %d",
			len(all.all), len(layer.all), len(head.all), p.Params(), p.LayerParams(), p.HeadParams())
	}
	same := func(what string, a, b []float32) {
		if !slices.Equal(a, b) {
			t.Errorf("%s differs between the part and the whole model", what)
		}
	}
	same("layer 1's q", layer.layers[0].wq, all.layers[1].wq)
	same("layer 1's down", layer.layers[0].down, all.layers[1].down)
	same("the token embedding", head.tokEmb, all.tokEmb)
	same("the output projection", head.out, all.out)
	if len(head.layers) != 0 {
		t.Errorf("the head holds %d layers", len(head.layers))
	}
}

// TestShardedIdentical: GenerateWith over 2- and 3-stage pipelines of in-process stage
// sessions gives, for each request, exactly what Generate gives: every token, text, finish
// reason and usage. The prompt goes to the stages in one call, then one position per call.
// The pipeline's backend never loads a whole model: its stages and head run the parts
// they loaded alone.
func TestShardedIdentical(t *testing.T) {
	type split struct {
		model  string
		bounds []int
	}
	tiny := []split{{"synth-tiny", []int{0, 1, 2}}}
	small := []split{{"synth-small", []int{0, 2, 4}}, {"synth-small", []int{0, 1, 3, 4}}}
	b := newBackend(t, "synth-tiny", "synth-small")
	sharded := newBackend(t, "synth-tiny", "synth-small")
	defer func() {
		for name, m := range sharded.models {
			if m.loaded(whole(m.preset)) != nil {
				t.Errorf("the pipeline's backend loaded the whole of %s", name)
			}
		}
	}()

	// check compares Generate with GenerateWith over each split, and returns the result.
	check := func(name string, splits []split, req *inference.Request) inference.Result {
		t.Helper()
		want, wantRes, err := run(t, b, req)
		if err != nil {
			t.Fatalf("%s: Generate: %v", name, err)
		}
		for _, sp := range splits {
			layers, closeAll := pipeline(t, sharded, sp.model, sp.bounds, b.models[sp.model].preset.Context)
			var calls []int
			counted := func(ctx context.Context, hidden []float32, n int) ([]float32, error) {
				calls = append(calls, n)
				return layers(ctx, hidden, n)
			}
			got, res, err := runWith(t, sharded, req, counted)
			closeAll()
			if err != nil {
				t.Fatalf("%s over %v: GenerateWith: %v", name, sp.bounds, err)
			}
			if !slices.Equal(got, want) || res != wantRes {
				t.Fatalf("%s over %v:\n%q %+v\nGenerate:\n%q %+v", name, sp.bounds, text(got), res, text(want), wantRes)
			}
			if len(calls) == 0 || calls[0] != res.Usage.PromptTokens || slices.ContainsFunc(calls[1:], func(n int) bool { return n != 1 }) {
				t.Fatalf("%s over %v: calls of %v positions, want the prompt's %d then 1 each", name, sp.bounds, calls, res.Usage.PromptTokens)
			}
			// Cut after k tokens, the generation replayed on a fresh pipeline gives the
			// same output, the prompt and the k tokens going through in one call.
			for _, k := range []int{1, len(want) / 2, len(want) - 1} {
				if k < 1 || k >= len(want) || want[k-1].Index != k-1 {
					continue
				}
				layers, closeAll = pipeline(t, sharded, sp.model, sp.bounds, b.models[sp.model].preset.Context)
				calls = calls[:0]
				replay := *req
				replay.Replay = ids(want[:k])
				got, res, err := runWith(t, sharded, &replay, counted)
				closeAll()
				if err != nil {
					t.Fatalf("%s over %v replaying %d tokens: %v", name, sp.bounds, k, err)
				}
				// The same result, saying it replayed the k tokens.
				replayed := wantRes
				replayed.Replayed = k
				if !slices.Equal(got, want) || res != replayed {
					t.Fatalf("%s over %v replaying %d tokens:\n%q %+v\nGenerate:\n%q %+v", name, sp.bounds, k, text(got), res, text(want), replayed)
				}
				if len(calls) == 0 || calls[0] != res.Usage.PromptTokens+k || slices.ContainsFunc(calls[1:], func(n int) bool { return n != 1 }) {
					t.Fatalf("%s over %v replaying %d tokens: calls of %v positions, want %d then 1 each", name, sp.bounds, k, calls, res.Usage.PromptTokens+k)
				}
				// The whole model replays the same way.
				if got, res, err := run(t, b, &replay); err != nil || !slices.Equal(got, want) || res != replayed {
					t.Fatalf("%s: Generate replaying %d tokens: %v\n%q %+v", name, k, err, text(got), res)
				}
			}
		}
		return wantRes
	}

	prompts := []string{"The quick brown fox", "Tell me a story about the sea.", "x", "zz top, 1 2 3"}
	temps := []float64{0, 0.7, 1.3, 2}
	topPs := []float64{1, 0.9, 0.5}
	maxTokens := []int{1, 6, 30}
	finishes := map[inference.FinishReason]int{}
	for i := range 18 {
		req := request(prompts[i%len(prompts)], maxTokens[i%len(maxTokens)], temps[i%len(temps)], int64(i))
		req.TopP = ptr(topPs[i/4%len(topPs)])
		// Every third request stops at a string the unstopped output contains, if any.
		if i%3 == 2 {
			full, _, err := run(t, b, req)
			if err != nil {
				t.Fatal(err)
			}
			if all := text(full); len(all) > 6 {
				req.Stop = []string{"\x01never", all[len(all)/2 : len(all)/2+2]}
			}
		}
		name := fmt.Sprintf("request %d (temp %g top_p %g max %d stop %q)", i, *req.Temperature, *req.TopP, *req.MaxTokens, req.Stop)
		finishes[check(name, tiny, req).FinishReason]++
	}
	// synth-small, under -race 50 times slower than synth-tiny: a short prompt, few tokens.
	req := request("hi", 4, 1.1, 1)
	req.Model = "synth-small"
	check("synth-small", small, req)
	if finishes[inference.FinishStop] == 0 || finishes[inference.FinishLength] == 0 {
		t.Errorf("finish reasons %v: both stop and length should be covered", finishes)
	}
	// At the end of the context window.
	p, _ := LookupPreset("synth-tiny")
	if res := check("near the window", tiny, request(strings.Repeat("\x01", p.Context-2-3), 100, 1, 3)); res.Usage.TotalTokens != p.Context {
		t.Errorf("near the window: %+v, want to fill the window", res)
	}
}

// TestGenerateWithHead: GenerateWith loads only the head (or uses the whole model's), and
// checks the request before loading or calling layers.
func TestGenerateWithHead(t *testing.T) {
	b := newBackend(t, "synth-tiny")
	m := b.models["synth-tiny"]
	p := m.preset
	never := func(context.Context, []float32, int) ([]float32, error) {
		t.Errorf("layers called for a request that must fail first")
		return nil, errors.New("never")
	}
	for _, tt := range []struct {
		req  *inference.Request
		want inference.Code
	}{
		{&inference.Request{Model: "synth-base", Messages: []inference.Message{{Role: "user", Content: "x"}}}, inference.CodeModelNotFound},
		{request("x", 0, 0, 0), inference.CodeInvalidRequest},
		{request(strings.Repeat("\x01", p.Context), 1, 0, 0), inference.CodeContextOverflow},
	} {
		if toks, _, err := runWith(t, b, tt.req, never); inference.CodeOf(err) != tt.want || len(toks) != 0 {
			t.Errorf("%d tokens, err %v; want %s", len(toks), err, tt.want)
		}
	}
	// Tokens to replay that no run could have sampled: the end of text, ids out of the
	// vocabulary, or as many as the completion's budget.
	for _, replay := range [][]int{{idEOT}, {p.Vocab}, {-1}, {idByteBase + 'a', idByteBase + 'b', idByteBase + 'c'}} {
		req := request("x", 3, 0, 0)
		req.Replay = replay
		if _, _, err := runWith(t, b, req, never); inference.CodeOf(err) != inference.CodeInvalidRequest {
			t.Errorf("replaying %v: %v, want invalid_request", replay, err)
		}
	}
	if m.loads.Load() != 0 {
		t.Fatalf("a rejected request loaded %d parts", m.loads.Load())
	}

	layers, closeAll := pipeline(t, b, "synth-tiny", []int{0, 2}, p.Context)
	defer closeAll()
	if _, _, err := runWith(t, b, request("hi", 3, 0, 0), layers); err != nil {
		t.Fatalf("GenerateWith: %v", err)
	}
	w := m.loaded(headOnly())
	if w == nil || len(w.all) != p.HeadParams() || len(w.layers) != 0 {
		t.Fatalf("the head part is not loaded as the head alone")
	}
	if m.loaded(whole(p)) != nil {
		t.Errorf("GenerateWith loaded the whole model")
	}
}

// TestGenerateWithLayersFail: an error of layers ends the generation with that error (its
// code survives), and a result of the wrong size is unavailable.
func TestGenerateWithLayersFail(t *testing.T) {
	b := newBackend(t, "synth-tiny")
	lost := inference.Errorf(inference.CodePeerLost, "stage 2 went away")
	local, closeAll := pipeline(t, b, "synth-tiny", []int{0, 2}, 512)
	defer closeAll()
	calls := 0
	failThird := func(ctx context.Context, hidden []float32, n int) ([]float32, error) {
		if calls++; calls == 3 {
			return nil, lost
		}
		return local(ctx, hidden, n)
	}
	toks, _, err := runWith(t, b, request("go on", 20, 1, 1), failThird)
	if !errors.Is(err, lost) || inference.CodeOf(err) != inference.CodePeerLost || len(toks) != 2 {
		t.Errorf("layers failing at the third call: %d tokens, err %v; want 2 and peer_lost", len(toks), err)
	}
	short := func(context.Context, []float32, int) ([]float32, error) { return make([]float32, 3), nil }
	if toks, _, err := runWith(t, b, request("go on", 20, 1, 1), short); inference.CodeOf(err) != inference.CodeUnavailable || len(toks) != 0 {
		t.Errorf("layers returning 3 values: %d tokens, err %v; want unavailable", len(toks), err)
	}

	// Cancelled between tokens: layers are not called again.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fresh, closeFresh := pipeline(t, b, "synth-tiny", []int{0, 2}, 512)
	defer closeFresh()
	calls = 0
	counted := func(ctx context.Context, hidden []float32, n int) ([]float32, error) {
		calls++
		return fresh(ctx, hidden, n)
	}
	_, err = b.GenerateWith(ctx, request("go on", 20, 1, 1), counted, func(tok inference.Token) error {
		if tok.Index == 3 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || calls != 4 {
		t.Errorf("cancelled at token 3: err %v after %d calls; want context.Canceled after 4", err, calls)
	}
}

// TestOpenStageErrors: the checks of OpenStage and of a session's Forward.
func TestOpenStageErrors(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, "synth-tiny")
	for _, tt := range []struct {
		model       string
		lo, hi, max int
		want        inference.Code
		what        string
	}{
		{"synth-small", 0, 1, 8, inference.CodeModelNotFound, "model not served"},
		{"synth-tiny", -1, 1, 8, inference.CodeInvalidRequest, "lo < 0"},
		{"synth-tiny", 1, 1, 8, inference.CodeInvalidRequest, "empty range"},
		{"synth-tiny", 1, 0, 8, inference.CodeInvalidRequest, "reversed range"},
		{"synth-tiny", 0, 3, 8, inference.CodeInvalidRequest, "past the last layer"},
		{"synth-tiny", 0, 1, 0, inference.CodeInvalidRequest, "no positions"},
		{"synth-tiny", 0, 1, 513, inference.CodeInvalidRequest, "past the context"},
	} {
		s, err := b.OpenStage(ctx, tt.model, tt.lo, tt.hi, tt.max)
		var e *inference.Error
		if s != nil || !errors.As(err, &e) || e.Code != tt.want {
			t.Errorf("%s: OpenStage = %v, %v; want a %s *inference.Error", tt.what, s, err, tt.want)
		}
	}
	if n := b.models["synth-tiny"].loads.Load(); n != 0 {
		t.Errorf("refused stages loaded %d parts", n)
	}

	s, err := b.OpenStage(ctx, "synth-tiny", 0, 1, 4)
	if err != nil {
		t.Fatal(err)
	}
	d := 64
	code := func(_ []float32, err error) inference.Code { return inference.CodeOf(err) }
	if c := code(s.Forward(ctx, make([]float32, 2*d), 3)); c != inference.CodeInvalidRequest {
		t.Errorf("Forward of 2 positions' values as 3: %s", c)
	}
	if c := code(s.Forward(ctx, nil, 0)); c != inference.CodeInvalidRequest {
		t.Errorf("Forward of 0 positions: %s", c)
	}
	if c := code(s.Forward(ctx, make([]float32, 3*d), 3)); c != "" {
		t.Errorf("Forward of 3 positions of 4: %s", c)
	}
	if c := code(s.Forward(ctx, make([]float32, 2*d), 2)); c != inference.CodeContextOverflow {
		t.Errorf("Forward past maxPositions: %s, want context_overflow", c)
	}
	if c := code(s.Forward(ctx, make([]float32, d), 1)); c != "" {
		t.Errorf("Forward of the 4th position after an overflow: %s", c)
	}
	if c := code(s.Forward(ctx, make([]float32, d), 1)); c != inference.CodeContextOverflow {
		t.Errorf("Forward of a 5th position: %s, want context_overflow", c)
	}
	if s.Close() != nil || s.Close() != nil {
		t.Errorf("Close failed")
	}
	if c := code(s.Forward(ctx, make([]float32, d), 1)); c != inference.CodeInvalidRequest {
		t.Errorf("Forward after Close: %s", c)
	}
}

// TestStageLoads: a range loads once (cold, then warm), and only what it needs; a cancelled
// open leaves it cold; concurrent opens share one load; a loaded whole model serves every
// range and the head.
func TestStageLoads(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, "synth-small")
	m := b.models["synth-small"]
	p := m.preset
	open := func(lo, hi int, wantLoads int64) {
		t.Helper()
		s, err := b.OpenStage(ctx, "synth-small", lo, hi, 8)
		if err != nil {
			t.Fatalf("OpenStage(%d, %d): %v", lo, hi, err)
		}
		s.Close()
		if n := m.loads.Load(); n != wantLoads {
			t.Fatalf("after OpenStage(%d, %d): %d loads, want %d", lo, hi, n, wantLoads)
		}
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.OpenStage(canceled, "synth-small", 0, 2, 8); !errors.Is(err, context.Canceled) || m.loaded(layerRange(0, 2)) != nil {
		t.Fatalf("OpenStage with a cancelled context: %v", err)
	}
	open(0, 2, 0+1)
	open(0, 2, 1) // warm
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if s, err := b.OpenStage(ctx, "synth-small", 2, 4, 8); err == nil {
				s.Close()
			} else {
				t.Errorf("concurrent OpenStage: %v", err)
			}
		})
	}
	wg.Wait()
	if n := m.loads.Load(); n != 2 {
		t.Fatalf("four concurrent opens of a cold range: %d loads in all, want 2", n)
	}
	if w := m.loaded(layerRange(2, 4)); w == nil || len(w.all) != 2*p.LayerParams() || w.tokEmb != nil {
		t.Fatalf("layers [2, 4) are not loaded alone")
	}
	if infos, _ := b.Models(ctx); infos[0].Warm {
		t.Errorf("stages made the whole model warm")
	}
	if err := b.Load(ctx, "synth-small"); err != nil || m.loads.Load() != 3 {
		t.Fatalf("Load: %v, %d loads", err, m.loads.Load())
	}
	open(1, 3, 3) // from the whole model
	layers, closeAll := pipeline(t, b, "synth-small", []int{0, 4}, 64)
	defer closeAll()
	req := request("hi", 2, 0, 0)
	req.Model = "synth-small"
	if _, _, err := runWith(t, b, req, layers); err != nil || m.loads.Load() != 3 {
		t.Errorf("GenerateWith with the whole model loaded: %v, %d loads, want 3", err, m.loads.Load())
	}
}

// TestStageSessionsIndependent: each session has its own KV cache: two sessions of the same
// layers, interleaved call by call, give bit for bit what each gives alone.
func TestStageSessionsIndependent(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, "synth-tiny")
	const d, lo, hi = 64, 1, 2
	rng := rand.New(rand.NewPCG(1, 2))
	input := func(n int) []float32 {
		x := make([]float32, n*d)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	// Each sequence: a prompt of two passes (16 and 2 positions), then single positions.
	seqs := make([][][]float32, 2)
	for i := range seqs {
		seqs[i] = append(seqs[i], input(blockSize+2))
		for range 3 {
			seqs[i] = append(seqs[i], input(1))
		}
	}
	forward := func(s inference.StageSession, x []float32) []float32 {
		t.Helper()
		out, err := s.Forward(ctx, x, len(x)/d)
		if err != nil {
			t.Fatalf("Forward: %v", err)
		}
		return out
	}
	open := func() inference.StageSession {
		s, err := b.OpenStage(ctx, "synth-tiny", lo, hi, 32)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	alone := make([][][]float32, 2)
	for i, seq := range seqs {
		s := open()
		for _, x := range seq {
			alone[i] = append(alone[i], forward(s, x))
		}
	}
	s0, s1 := open(), open()
	for j := range seqs[0] {
		for i, s := range []inference.StageSession{s0, s1} {
			if got := forward(s, seqs[i][j]); !bitsEqual(got, alone[i][j]) {
				t.Fatalf("sequence %d, call %d: interleaved output differs from alone", i, j)
			}
		}
	}
	// A Forward cancelled after its first pass leaves the cache as it was: running the call
	// again gives what a fresh session gives.
	s2 := open()
	if _, err := s2.Forward(&cancelAfter{Context: ctx, n: 1}, seqs[0][0], blockSize+2); !errors.Is(err, context.Canceled) {
		t.Fatalf("Forward cancelled after one pass: %v", err)
	}
	for j, x := range seqs[0] {
		if got := forward(s2, x); !bitsEqual(got, alone[0][j]) {
			t.Fatalf("after a cancelled Forward, call %d differs", j)
		}
	}
	// The input is not modified.
	x := input(2)
	kept := slices.Clone(x)
	forward(open(), x)
	if !bitsEqual(x, kept) {
		t.Errorf("Forward modified its input")
	}
}

// cancelAfter is a context whose Err is nil for its first n calls and context.Canceled
// after: a Forward, which looks at Err before each pass, ends after exactly n passes.
type cancelAfter struct {
	context.Context
	n int
}

func (c *cancelAfter) Err() error {
	if c.n > 0 {
		c.n--
		return nil
	}
	return context.Canceled
}

func bitsEqual(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// stageSlack is the heap a stage may take beyond its layers' weights in TestStageMemory:
// its session's KV cache (16 positions: 64 KiB for two synth-small layers, 256 KiB for
// four synth-base ones), its scratch (16 positions: 128 KiB for synth-small, 256 KiB for
// synth-base), and the bookkeeping of the backend and the cache.
const stageSlack = 1 << 20

// TestStageMemory: opening a stage grows the heap by its layers' weights alone, within 10%
// and stageSlack: the rest of the model (the other layers, the head) is not materialized.
// For synth-small layers [1, 3) the bound is 7.97 MB, against 11.5 MB had the head been
// loaded too and 9.4 MB with one more layer.
func TestStageMemory(t *testing.T) {
	tests := []struct {
		model  string
		lo, hi int
	}{
		{"synth-small", 1, 3},
		{"synth-base", 2, 6},
	}
	for _, tt := range tests {
		if testing.Short() && tt.model == "synth-base" {
			continue
		}
		b := newBackend(t, tt.model)
		shape, _ := b.Shape(tt.model)
		layers := int64(tt.hi-tt.lo) * shape.LayerBytes
		before := heapAlloc()
		s, err := b.OpenStage(context.Background(), tt.model, tt.lo, tt.hi, 16)
		if err != nil {
			t.Fatal(err)
		}
		grown := heapAlloc() - before
		limit := layers + layers/10 + stageSlack
		t.Logf("%s layers [%d, %d): heap grew %d bytes for %d of weights (limit %d)", tt.model, tt.lo, tt.hi, grown, layers, limit)
		if grown > limit || grown < layers {
			t.Errorf("%s layers [%d, %d): heap grew %d bytes, want %d to %d", tt.model, tt.lo, tt.hi, grown, layers, limit)
		}
		s.Close()
		runtime.KeepAlive(b)
	}
}

// heapAlloc is the live heap after a full collection.
func heapAlloc() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestRanges: a stage's layer range is listed as loading from the moment its load starts
// (held here by a gate) and as loaded once it is; the hook hears of both at once. A load
// abandoned by its context leaves the list; whole models and the head are never listed,
// nor reported.
func TestRanges(t *testing.T) {
	ctx := context.Background()
	gate := make(chan struct{})
	changes := make(chan struct{}, 16)
	b, err := NewWith([]string{"synth-tiny", "synth-small"}, []Option{
		WithLoadGate(gate), WithOnRangeChange(func() { changes <- struct{}{} }),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := func(what string, rs ...RangeState) {
		t.Helper()
		if got := b.Ranges(); !slices.Equal(got, rs) {
			t.Fatalf("%s: Ranges() = %+v, want %+v", what, got, rs)
		}
	}
	heard := func(what string) {
		t.Helper()
		select {
		case <-changes:
		default:
			t.Fatalf("%s: the hook was not called", what)
		}
	}
	// wait is for a hook call that must come (a load started on another goroutine); the
	// bound only turns a missing call into a failure instead of a hang.
	wait := func(what string) {
		t.Helper()
		select {
		case <-changes:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the hook was not called", what)
		}
	}
	want("before any load")

	opened := make(chan error, 1)
	go func() {
		s, err := b.OpenStage(ctx, "synth-small", 2, 4, 8)
		if err == nil {
			s.Close()
		}
		opened <- err
	}()
	wait("the load started") // and waits for the gate
	want("while layers 2-3 load", RangeState{Model: "synth-small", Lo: 2, Hi: 4})
	close(gate)
	if err := <-opened; err != nil {
		t.Fatal(err)
	}
	heard("the load ended")
	want("once loaded", RangeState{Model: "synth-small", Lo: 2, Hi: 4, Loaded: true})

	// Ranges of two models, in New's order and by layers.
	for _, r := range [][3]any{{"synth-small", 0, 2}, {"synth-tiny", 1, 2}, {"synth-small", 0, 1}} {
		s, err := b.OpenStage(ctx, r[0].(string), r[1].(int), r[2].(int), 8)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		heard("a load started")
		heard("a load ended")
	}
	all := []RangeState{
		{Model: "synth-tiny", Lo: 1, Hi: 2, Loaded: true},
		{Model: "synth-small", Lo: 0, Hi: 1, Loaded: true}, {Model: "synth-small", Lo: 0, Hi: 2, Loaded: true},
		{Model: "synth-small", Lo: 2, Hi: 4, Loaded: true},
	}
	want("four ranges", all...)

	// The head and the whole model: loaded, not listed, not reported.
	req := request("hi", 2, 0, 0)
	req.Model = "synth-small"
	layers, closeAll := pipeline(t, b, "synth-small", []int{0, 2, 4}, 64)
	defer closeAll()
	if _, _, err := runWith(t, b, req, layers); err != nil {
		t.Fatal(err)
	}
	if err := b.Load(ctx, "synth-tiny"); err != nil {
		t.Fatal(err)
	}
	want("after the head and a whole model loaded", all...)
	select {
	case <-changes:
		t.Fatal("the hook was called for the head or a whole model")
	default:
	}

	// An abandoned load: listed while it waits, gone once its context ends.
	held, err := NewWith([]string{"synth-tiny"}, []Option{
		WithLoadGate(make(chan struct{})), WithOnRangeChange(func() { changes <- struct{}{} }),
	})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		_, err := held.OpenStage(cctx, "synth-tiny", 0, 1, 8)
		opened <- err
	}()
	wait("the held load started")
	if got := held.Ranges(); !slices.Equal(got, []RangeState{{Model: "synth-tiny", Lo: 0, Hi: 1}}) {
		t.Fatalf("while held: %+v", got)
	}
	cancel()
	if err := <-opened; !errors.Is(err, context.Canceled) {
		t.Fatalf("OpenStage of an abandoned load: %v", err)
	}
	heard("the abandoned load ended")
	if got := held.Ranges(); len(got) != 0 {
		t.Fatalf("after the load was abandoned: %+v", got)
	}
}
