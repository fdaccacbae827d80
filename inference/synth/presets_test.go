package synth

import (
	"context"
	"math"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

// TestPresets checks the table in the package doc: parameter counts, the documented size
// classes, and shapes the model and tokenizer can run.
func TestPresets(t *testing.T) {
	tests := []struct {
		name     string
		params   int
		min, max int // the size class the issue asks for
	}{
		{"synth-tiny", 196_928, 0, 1_000_000},
		{"synth-small", 5_245_184, 1_000_000, 10_000_000},
		{"synth-base", 31_465_984, 10_000_000, 100_000_000},
		{"synth-large", 120_349_440, 100_000_000, 1_000_000_000},
	}
	ps := Presets()
	if len(ps) != len(tests) {
		t.Fatalf("%d presets, want %d", len(ps), len(tests))
	}
	for i, tt := range tests {
		p := ps[i]
		if p.Name != tt.name {
			t.Errorf("preset %d is %q, want %q", i, p.Name, tt.name)
		}
		if got := p.Params(); got != tt.params || got < tt.min || got >= tt.max {
			t.Errorf("%s: %d parameters, want %d in [%d, %d)", p.Name, got, tt.params, tt.min, tt.max)
		}
		if p.Dim%p.Heads != 0 || p.Vocab <= idSyllableBase || p.Vocab > idSyllableBase+syllableCapacity {
			t.Errorf("%s: unusable shape %+v", p.Name, p)
		}
		if q, ok := LookupPreset(p.Name); !ok || q != p {
			t.Errorf("LookupPreset(%q) = %+v, %v", p.Name, q, ok)
		}
	}
	if _, ok := LookupPreset("synth-huge"); ok {
		t.Errorf("LookupPreset(synth-huge) succeeded")
	}
}

// TestActivationsFinite materializes the smaller presets, checks every tensor was laid out
// and filled, and runs a prompt: logits stay finite and of order 1.
func TestActivationsFinite(t *testing.T) {
	for _, name := range []string{"synth-tiny", "synth-small"} {
		p, _ := LookupPreset(name)
		w, err := materialize(context.Background(), p, whole(p))
		if err != nil {
			t.Fatalf("materialize %s: %v", name, err)
		}
		if len(w.all) != p.Params() {
			t.Errorf("%s: %d values materialized, want %d", name, len(w.all), p.Params())
		}
		var sum, sumSq float64
		for _, v := range w.tokEmb {
			sum += float64(v)
			sumSq += float64(v) * float64(v)
		}
		n := float64(len(w.tokEmb))
		if mean, std := sum/n, math.Sqrt(sumSq/n); math.Abs(mean) > 0.01 || math.Abs(std-1) > 0.01 {
			t.Errorf("%s: token embedding mean %g std %g, want 0 and 1", name, mean, std)
		}
		tok := newTokenizer(p.Vocab)
		prompt := tok.encodeChat([]inference.Message{{Role: "user", Content: "The quick brown fox jumps over the lazy dog. 0123456789 !?"}}, p.Context)
		logits := logitsAfter(t, w, prompt, len(prompt))
		var ss float64
		for _, l := range logits {
			if math.IsNaN(float64(l)) || math.IsInf(float64(l), 0) {
				t.Fatalf("%s: non-finite logit %g", name, l)
			}
			ss += float64(l) * float64(l)
		}
		if rms := math.Sqrt(ss / float64(len(logits))); rms < 0.5 || rms > 8 {
			t.Errorf("%s: logit rms %g, want of order 2", name, rms)
		}
	}
}

// TestFeedSplitInvariant: the logits do not depend on how the prompt is split into calls,
// which makes prefill and decode interchangeable (and output independent of blockSize and
// of how a head batches the prompt to its stages).
func TestFeedSplitInvariant(t *testing.T) {
	p, _ := LookupPreset("synth-tiny")
	w, err := materialize(context.Background(), p, whole(p))
	if err != nil {
		t.Fatalf("materialize: %v", err)
	}
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = idSyllableBase + i*7%200
	}
	want := logitsAfter(t, w, prompt, len(prompt))
	for _, split := range []int{1, 3, blockSize + 1} {
		got := logitsAfter(t, w, prompt, split)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("logit %d: %g in calls of %d positions, %g in one call", i, got[i], split, want[i])
			}
		}
	}
}

// TestAttentionSplitInvariant: attention split by heads over goroutines (a long prompt's
// blocks) gives the same bits as one goroutine, for 2 and 3 goroutines (3 does not divide
// the 4 heads). The model is one narrow layer, so that blocks from position 496 on are past
// parallelMinWork at little cost.
func TestAttentionSplitInvariant(t *testing.T) {
	p := Preset{Name: "attention-split", Dim: 64, Layers: 1, Heads: 4, FFN: 64, Vocab: 300, Context: 1024}
	w, err := materialize(context.Background(), p, whole(p))
	if err != nil {
		t.Fatalf("materialize: %v", err)
	}
	tokens := make([]int, 560)
	for i := range tokens {
		tokens[i] = i * 13 % p.Vocab
	}
	run := func(workers int) []float32 {
		d := p.Dim
		x := make([]float32, len(tokens)*d)
		w.embed(x, tokens, 0)
		st := newStack(w, 0, p.Layers, len(tokens))
		st.scores = make([][]float64, workers)
		for i := range st.scores {
			st.scores[i] = make([]float64, len(tokens))
		}
		if err := st.forward(context.Background(), x, len(tokens)); err != nil {
			t.Fatalf("forward: %v", err)
		}
		return x
	}
	want := run(1)
	for _, workers := range []int{2, 3} {
		got := run(workers)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%d goroutines: value %d is %g, one goroutine gives %g", workers, i, got[i], want[i])
			}
		}
	}
}
