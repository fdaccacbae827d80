package synth

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// TestGolden pins the output of synth-tiny. The same ids are produced on every machine and
// architecture (see the package doc); a change here breaks verification and resumption
// between nodes of different versions, so it must be deliberate.
func TestGolden(t *testing.T) {
	tests := []struct {
		temp float64
		seed int64
		want []int
	}{
		{0, 0, []int{331, 492, 77, 331, 492, 377, 380, 74, 83, 298, 335, 494, 499, 492, 377, 380, 53, 382, 269, 346, 270, 385, 509, 87}},
		{0.8, 7, []int{488, 396, 72, 42, 481, 443, 488, 505, 360, 434, 70, 501, 269, 511, 84, 107, 420, 93, 54, 450, 369, 435, 426, 461}},
	}
	b := newBackend(t, "synth-tiny")
	for _, tt := range tests {
		toks, res, err := run(t, b, request("The quick brown fox", 24, tt.temp, tt.seed))
		if err != nil {
			t.Fatalf("Generate: %v", err)
		}
		if got := ids(toks); !slices.Equal(got, tt.want) {
			t.Errorf("temp %g seed %d: ids\n%#v\nwant\n%#v", tt.temp, tt.seed, got, tt.want)
		}
		want := inference.Result{FinishReason: inference.FinishLength,
			Usage: inference.Usage{PromptTokens: 15, CompletionTokens: 24, TotalTokens: 39}}
		if res != want {
			t.Errorf("result %+v, want %+v", res, want)
		}
	}
}

// TestGoldenLogits pins the exact bits of synth-tiny's logits after a prompt: token ids
// survive a last-bit difference, this does not.
func TestGoldenLogits(t *testing.T) {
	const want uint64 = 0x8ab18470fe196c0e
	p, _ := LookupPreset("synth-tiny")
	w, err := materialize(context.Background(), p, whole(p))
	if err != nil {
		t.Fatalf("materialize: %v", err)
	}
	tok := newTokenizer(p.Vocab)
	prompt := tok.encodeChat([]inference.Message{{Role: inference.RoleUser, Content: "The quick brown fox"}}, p.Context)
	logits := logitsAfter(t, w, prompt, len(prompt))
	h := fnv.New64a()
	for _, l := range logits {
		h.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(l)))
	}
	if got := h.Sum64(); got != want {
		t.Errorf("logits hash %#x, want %#x", got, want)
	}
}

func TestDeterminism(t *testing.T) {
	b1, b2 := newBackend(t, "synth-tiny"), newBackend(t, "synth-tiny")
	sampled := func(seed int64) *inference.Request {
		r := request("Tell me a story about the sea.", 40, 0.9, seed)
		r.TopP = ptr(0.95)
		return r
	}
	t1, r1, err1 := run(t, b1, sampled(1))
	t2, r2, err2 := run(t, b2, sampled(1))
	if err1 != nil || err2 != nil {
		t.Fatalf("Generate: %v, %v", err1, err2)
	}
	if !slices.Equal(t1, t2) || r1 != r2 {
		t.Fatalf("two backends differ on the same request:\n%q %+v\n%q %+v", text(t1), r1, text(t2), r2)
	}

	t3, _, err := run(t, b1, sampled(2))
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	if slices.Equal(ids(t1), ids(t3)) {
		t.Errorf("seeds 1 and 2 gave the same output at temperature 0.9: %q", text(t1))
	}

	// At temperature 0 neither the seed nor top_p matters.
	g1, _, err1 := run(t, b1, request("Tell me a story about the sea.", 40, 0, 1))
	greedy := request("Tell me a story about the sea.", 40, 0, 99)
	greedy.TopP = ptr(0.1)
	g2, _, err2 := run(t, b2, greedy)
	if err1 != nil || err2 != nil {
		t.Fatalf("Generate: %v, %v", err1, err2)
	}
	if !slices.Equal(g1, g2) {
		t.Errorf("greedy output depends on seed or top_p:\n%q\n%q", text(g1), text(g2))
	}

	// A different prompt gives a different output.
	g3, _, err := run(t, b1, request("Tell me a story about the sky.", 40, 0, 1))
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	if slices.Equal(ids(g1), ids(g3)) {
		t.Errorf("different prompts gave the same greedy output %q", text(g1))
	}
}

// TestPrefix: a smaller max_tokens gives a prefix of a larger one, which resumption of a
// cut stream relies on.
func TestPrefix(t *testing.T) {
	b := newBackend(t, "synth-tiny")
	for _, temp := range []float64{0, 1.3} {
		long, _, err := run(t, b, request("resume me", 60, temp, 5))
		if err != nil {
			t.Fatalf("Generate: %v", err)
		}
		for _, n := range []int{1, 7, 33} {
			short, res, err := run(t, b, request("resume me", n, temp, 5))
			if err != nil {
				t.Fatalf("Generate: %v", err)
			}
			if !slices.Equal(short, long[:n]) || res.FinishReason != inference.FinishLength {
				t.Errorf("temp %g max_tokens %d: %q (%s) is not the prefix %q", temp, n, text(short), res.FinishReason, text(long[:n]))
			}
		}
	}
}

func TestMaxTokensAndDefaults(t *testing.T) {
	b := newBackend(t, "synth-tiny")
	toks, res, err := run(t, b, request("count", 5, 0, 0))
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	if len(toks) != 5 || res.FinishReason != inference.FinishLength || res.Usage.CompletionTokens != 5 {
		t.Errorf("max_tokens 5: %d tokens, %+v", len(toks), res)
	}
	// max_completion_tokens wins over max_tokens.
	req := request("count", 5, 0, 0)
	req.MaxCompletionTokens = ptr(3)
	if toks, _, _ := run(t, b, req); len(toks) != 3 {
		t.Errorf("max_completion_tokens 3: %d tokens", len(toks))
	}
	// No max_tokens: DefaultCompletionTokens (or the end of text, whichever is first).
	req = request("count", 1, 0, 0)
	req.MaxTokens = nil
	_, res, err = run(t, b, req)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	if res.Usage.CompletionTokens > inference.DefaultCompletionTokens ||
		(res.FinishReason == inference.FinishLength && res.Usage.CompletionTokens != inference.DefaultCompletionTokens) {
		t.Errorf("default budget: %+v", res)
	}
}

// TestContextWindow: generation stops with finish length at the end of the context window,
// and a prompt that fills it is a context_overflow error.
func TestContextWindow(t *testing.T) {
	b := newBackend(t, "synth-tiny")
	p, _ := LookupPreset("synth-tiny")
	tok := newTokenizer(p.Vocab)
	// '\x01' bytes are never part of a syllable: one token each.
	fill := func(n int) string { return strings.Repeat("\x01", n) }
	promptLen := func(s string) int {
		return len(tok.encodeChat([]inference.Message{{Role: inference.RoleUser, Content: s}}, p.Context))
	}
	if got := promptLen(fill(10)); got != 12 {
		t.Fatalf("prompt of 10 single-byte tokens is %d tokens, want 12 (two role markers)", got)
	}

	near := fill(p.Context - 2 - 3) // 3 free positions
	toks, res, err := run(t, b, request(near, 100, 0, 0))
	if err != nil {
		t.Fatalf("Generate near the window: %v", err)
	}
	if res.Usage.PromptTokens != p.Context-3 || res.Usage.CompletionTokens > 3 || len(toks) > 3 {
		t.Errorf("near the window: %d tokens, %+v", len(toks), res)
	}
	if res.Usage.CompletionTokens == 3 && res.FinishReason != inference.FinishLength {
		t.Errorf("stopped at the window with finish %q", res.FinishReason)
	}

	for _, n := range []int{p.Context - 2, p.Context, 10 * p.Context} {
		toks, _, err := run(t, b, request(fill(n), 1, 0, 0))
		if inference.CodeOf(err) != inference.CodeContextOverflow || len(toks) != 0 {
			t.Errorf("prompt of %d tokens: %d tokens, err %v; want context_overflow", n+2, len(toks), err)
		}
	}
	if infos, _ := b.Models(context.Background()); infos[0].Warm != true {
		t.Errorf("model should be warm after the near-window request")
	}
}

func TestErrors(t *testing.T) {
	b := newBackend(t, "synth-tiny")
	tests := []struct {
		name string
		req  *inference.Request
		want inference.Code
	}{
		{"unknown model", &inference.Request{Model: "gpt-4", Messages: []inference.Message{{Role: "user", Content: "x"}}}, inference.CodeModelNotFound},
		{"preset not served", &inference.Request{Model: "synth-base", Messages: []inference.Message{{Role: "user", Content: "x"}}}, inference.CodeModelNotFound},
		{"no messages", &inference.Request{Model: "synth-tiny"}, inference.CodeInvalidRequest},
		{"bad role", &inference.Request{Model: "synth-tiny", Messages: []inference.Message{{Role: "tool", Content: "x"}}}, inference.CodeInvalidRequest},
		{"max_tokens 0", request("x", 0, 0, 0), inference.CodeInvalidRequest},
		{"temperature 3", request("x", 1, 3, 0), inference.CodeInvalidRequest},
	}
	for _, tt := range tests {
		toks, _, err := run(t, b, tt.req)
		if got := inference.CodeOf(err); got != tt.want || len(toks) != 0 {
			t.Errorf("%s: %d tokens, err %v; want %s", tt.name, len(toks), err, tt.want)
		}
	}
	if infos, _ := b.Models(context.Background()); infos[0].Warm {
		t.Errorf("a rejected request loaded the model")
	}
	if err := b.Load(context.Background(), "nope"); inference.CodeOf(err) != inference.CodeModelNotFound {
		t.Errorf("Load(nope) = %v, want model_not_found", err)
	}
}

func TestNew(t *testing.T) {
	for _, models := range [][]string{nil, {"synth-huge"}, {"synth-tiny", "synth-tiny"}} {
		if _, err := New(models...); err == nil {
			t.Errorf("New(%v) succeeded", models)
		}
	}
	_, err := New("synth-huge")
	for _, name := range []string{"synth-tiny", "synth-small", "synth-base"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("New(synth-huge) error %v does not list %s", err, name)
		}
	}
	b := newBackend(t, "synth-small", "synth-tiny")
	infos, err := b.Models(context.Background())
	want := []inference.ModelInfo{{Name: "synth-small", Deterministic: true}, {Name: "synth-tiny", Deterministic: true}}
	if err != nil || !slices.Equal(infos, want) {
		t.Errorf("Models = %v, %v; want %v", infos, err, want)
	}
}

func TestWarmCold(t *testing.T) {
	b := newBackend(t, "synth-tiny", "synth-small")
	warm := func() []bool {
		infos, err := b.Models(context.Background())
		if err != nil {
			t.Fatalf("Models: %v", err)
		}
		return []bool{infos[0].Warm, infos[1].Warm}
	}
	if got := warm(); !slices.Equal(got, []bool{false, false}) {
		t.Fatalf("fresh backend warm = %v", got)
	}
	if _, _, err := run(t, b, request("hi", 2, 0, 0)); err != nil {
		t.Fatalf("Generate: %v", err)
	}
	if got := warm(); !slices.Equal(got, []bool{true, false}) {
		t.Fatalf("after a tiny request warm = %v", got)
	}
	// A load whose context ends first leaves the model cold; the next one loads it.
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Load(canceled, "synth-small"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Load(canceled) = %v", err)
	}
	if got := warm(); !slices.Equal(got, []bool{true, false}) {
		t.Fatalf("after a cancelled load warm = %v", got)
	}
	if err := b.Load(context.Background(), "synth-small"); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := warm(); !slices.Equal(got, []bool{true, true}) {
		t.Fatalf("after Load warm = %v", got)
	}
	if n := b.models["synth-small"].loads.Load(); n != 1 {
		t.Errorf("synth-small materialized %d times, want 1 (the cancelled load never began)", n)
	}
	if err := b.Load(context.Background(), "synth-small"); err != nil || b.models["synth-small"].loads.Load() != 1 {
		t.Errorf("Load of a warm model: %v, loads %d", err, b.models["synth-small"].loads.Load())
	}

	// A load abandoned midway (its context ends while it is held) leaves the model cold;
	// the next one loads it again.
	gate := make(chan struct{})
	g, err := NewWith([]string{"synth-small"}, []Option{WithLoadGate(gate)})
	if err != nil {
		t.Fatal(err)
	}
	m := g.models["synth-small"]
	ctx, cancelLoad := context.WithCancel(context.Background())
	loaded := make(chan error, 1)
	go func() { loaded <- g.Load(ctx, "synth-small") }() // ends at cancelLoad
	for deadline := time.Now().Add(10 * time.Second); m.loads.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the held load never began")
		}
	}
	cancelLoad()
	if err := <-loaded; !errors.Is(err, context.Canceled) {
		t.Fatalf("a load abandoned midway = %v, want context.Canceled", err)
	}
	if infos, _ := g.Models(context.Background()); infos[0].Warm {
		t.Fatalf("the model is warm after its only load was abandoned")
	}
	close(gate)
	if err := g.Load(context.Background(), "synth-small"); err != nil || m.loads.Load() != 2 {
		t.Errorf("Load after an abandoned one: %v, materialized %d times, want 2", err, m.loads.Load())
	}
}

func TestCancelMidGeneration(t *testing.T) {
	b := newBackend(t, "synth-tiny")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	res, err := b.Generate(ctx, request("go on", 200, 1, 3), func(tok inference.Token) error {
		n++
		if tok.Index == 3 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || res != (inference.Result{}) {
		t.Fatalf("Generate after cancel = %+v, %v; want context.Canceled", res, err)
	}
	if n != 4 {
		t.Errorf("%d tokens emitted, want 4: generation must stop at the next token", n)
	}

	// A deadline that has passed: a timeout, before any work.
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	toks, _, err := runCtx(t, past, b, request("go on", 10, 0, 0))
	if !errors.Is(err, context.DeadlineExceeded) || inference.CodeOf(err) != inference.CodeTimeout || len(toks) != 0 {
		t.Errorf("expired deadline: %d tokens, %v (code %s)", len(toks), err, inference.CodeOf(err))
	}
	// A cold model is not loaded for a request whose context is already done.
	cold := newBackend(t, "synth-tiny")
	if _, _, err := runCtx(t, past, cold, request("x", 1, 0, 0)); err == nil || cold.models["synth-tiny"].loads.Load() != 0 {
		t.Errorf("expired request on a cold model: %v, loads %d", err, cold.models["synth-tiny"].loads.Load())
	}
}

func TestEmitError(t *testing.T) {
	b := newBackend(t, "synth-tiny")
	stopErr := errors.New("client went away")
	n := 0
	res, err := b.Generate(context.Background(), request("go on", 50, 0, 0), func(tok inference.Token) error {
		n++
		if tok.Index == 2 {
			return stopErr
		}
		return nil
	})
	if err != stopErr || res != (inference.Result{}) {
		t.Fatalf("Generate = %+v, %v; want the emit error itself", res, err)
	}
	if n != 3 {
		t.Errorf("emit called %d times, want 3", n)
	}
}

// TestConcurrent: many first requests on one cold backend load the model once, and each
// gets exactly the output it gets alone. Run it with -race.
func TestConcurrent(t *testing.T) {
	const workers = 8
	ref := newBackend(t, "synth-tiny")
	reqs := make([]*inference.Request, workers)
	want := make([][]inference.Token, workers)
	for i := range reqs {
		reqs[i] = request(fmt.Sprintf("request %d", i%3), 20, float64(i%2), int64(i))
		reqs[i].Stop = []string{"zz"}
		var err error
		if want[i], _, err = run(t, ref, reqs[i]); err != nil {
			t.Fatalf("reference %d: %v", i, err)
		}
	}
	b := newBackend(t, "synth-tiny")
	got := make([][]inference.Token, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			var toks []inference.Token
			_, errs[i] = b.Generate(context.Background(), reqs[i], func(tok inference.Token) error {
				toks = append(toks, tok)
				return nil
			})
			got[i] = toks
		})
	}
	wg.Wait()
	for i := range workers {
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
		}
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d concurrent %q, alone %q", i, text(got[i]), text(want[i]))
		}
	}
	if n := b.models["synth-tiny"].loads.Load(); n != 1 {
		t.Errorf("model materialized %d times, want 1", n)
	}
}

// TestStop: with a stop string the output is the stop-free output cut before the stop
// string's first occurrence, with finish stop.
func TestStop(t *testing.T) {
	b := newBackend(t, "synth-tiny")
	for _, temp := range []float64{0, 1} {
		full, _, err := run(t, b, request("stop here", 60, temp, 11))
		if err != nil {
			t.Fatalf("Generate: %v", err)
		}
		all := text(full)
		checked := 0
		for start := 0; start+1 < len(all) && start < 60; start += 4 {
			for _, n := range []int{1, 4} {
				if start+n > len(all) {
					continue
				}
				stop := all[start : start+n]
				cut := all[:strings.Index(all, stop)]
				req := request("stop here", 60, temp, 11)
				req.Stop = []string{stop}
				toks, res, err := run(t, b, req)
				if err != nil {
					t.Fatalf("Generate: %v", err)
				}
				if got := text(toks); got != cut || res.FinishReason != inference.FinishStop {
					t.Fatalf("stop %q: got %q (%s), want %q", stop, got, res.FinishReason, cut)
				}
				for i, tok := range toks {
					if i < len(toks)-1 && tok != full[i] {
						t.Fatalf("stop %q: token %d is %+v, want %+v", stop, i, tok, full[i])
					}
				}
				checked++
			}
		}
		if checked < 20 {
			t.Fatalf("only %d stop strings checked", checked)
		}
		// Of several stop strings, the earliest occurrence wins; one that never occurs
		// changes nothing.
		req := request("stop here", 60, temp, 11)
		req.Stop = []string{all[20:23], "\x01never", all[10:12]}
		toks, _, _ := run(t, b, req)
		want := all[:min(strings.Index(all, all[20:23]), strings.Index(all, all[10:12]))]
		if text(toks) != want {
			t.Errorf("several stops: got %q, want %q", text(toks), want)
		}
		req.Stop = []string{"\x01never"}
		toks, res, _ := run(t, b, req)
		if !slices.Equal(toks, full) || res.FinishReason != inference.FinishLength {
			t.Errorf("absent stop string changed the output: %q %s", text(toks), res.FinishReason)
		}
	}
}

func TestLoadDelay(t *testing.T) {
	b, err := NewWith([]string{"synth-tiny"}, []Option{WithLoadDelay(300 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := b.Load(context.Background(), "synth-tiny"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("load took %v, want at least the 300ms delay", took)
	}
	// A load whose context ends during the delay leaves the model cold.
	b, _ = NewWith([]string{"synth-tiny"}, []Option{WithLoadDelay(time.Hour)})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := b.Load(ctx, "synth-tiny"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("load error %v, want deadline exceeded", err)
	}
	if infos, _ := b.Models(context.Background()); infos[0].Warm {
		t.Fatal("model warm after an abandoned load")
	}
}
