package synth

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// BenchmarkTokensPerSecond measures decoding speed per preset, one op being one generated
// token (the short prompt's prefill included), at temperature 1. Its metrics:
//
//	tokens/s                generated tokens per second
//	ratio-to-weight-stream  time per token ÷ time to read every weight once (a plain
//	                        single-goroutine float32 sum over all parameters, measured in
//	                        the same run): how far decoding is from the machine's memory
//	                        and scalar-add speed; about 1 means as fast as touching each
//	                        weight once
//	load-ms                 cold start: materializing the weights, in milliseconds
func BenchmarkTokensPerSecond(b *testing.B) {
	for _, p := range Presets() {
		b.Run(p.Name, func(b *testing.B) {
			ctx := context.Background()
			be := newBackend(b, p.Name)
			start := time.Now()
			if err := be.Load(ctx, p.Name); err != nil {
				b.Fatalf("Load: %v", err)
			}
			load := time.Since(start)
			stream := weightStreamTime(be.models[p.Name].loaded(whole(p)))

			discard := func(inference.Token) error { return nil }
			b.ResetTimer()
			generated := 0
			for seed := int64(0); generated < b.N; seed++ {
				req := &inference.Request{
					Model:       p.Name,
					Messages:    []inference.Message{{Role: inference.RoleUser, Content: "benchmark"}},
					MaxTokens:   ptr(min(b.N-generated, p.Context/2)),
					Temperature: ptr(1.0),
					Seed:        ptr(seed),
				}
				res, err := be.Generate(ctx, req, discard)
				if err != nil {
					b.Fatalf("Generate: %v", err)
				}
				generated += res.Usage.CompletionTokens
			}
			b.StopTimer()
			perToken := b.Elapsed().Seconds() / float64(generated)
			b.ReportMetric(1/perToken, "tokens/s")
			b.ReportMetric(perToken/stream.Seconds(), "ratio-to-weight-stream")
			b.ReportMetric(float64(load.Microseconds())/1000, "load-ms")
		})
	}
}

// weightStreamTime is the fastest of several passes that read every weight once.
func weightStreamTime(w *weights) time.Duration {
	best := time.Duration(1<<63 - 1)
	var sink float32
	for range 5 {
		start := time.Now()
		sink += sumAll(w.all)
		best = min(best, time.Since(start))
	}
	if sink == 42 { // keep the sums observable
		best++
	}
	return best
}

func sumAll(v []float32) float32 {
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(v); i += 4 {
		vv := v[i : i+4 : i+4]
		s0 += vv[0]
		s1 += vv[1]
		s2 += vv[2]
		s3 += vv[3]
	}
	for ; i < len(v); i++ {
		s0 += v[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// BenchmarkShardedDecode compares decoding through a 2-stage in-process pipeline (stage
// sessions from OpenStage, chained, under GenerateWith) with Generate on the same model,
// in the same run. One op is one request of each, in alternating order: 32 tokens at
// temperature 1. Each side runs its own weights (the stages' ranges and the head are
// loaded before the whole model). Metrics:
//
//	split-ratio     time per token of the pipeline ÷ Generate's, decoding only (from the
//	                first token to the last), the median over the ops (each op's pair
//	                ran back to back, so a busy machine slows both); 1 means the split
//	                costs nothing
//	tokens/s        Generate's decoding speed
//	split-tokens/s  the pipeline's
func BenchmarkShardedDecode(b *testing.B) {
	for _, name := range []string{"synth-base", "synth-large"} {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			be := newBackend(b, name)
			p := be.models[name].preset
			bounds := []int{0, p.Layers / 2, p.Layers}
			req := func(seed int64) *inference.Request {
				return &inference.Request{
					Model:       name,
					Messages:    []inference.Message{{Role: inference.RoleUser, Content: "benchmark"}},
					MaxTokens:   ptr(32),
					Temperature: ptr(1.0),
					Seed:        ptr(seed),
				}
			}
			split := func(seed int64) (time.Duration, int) {
				layers, closeAll := pipeline(b, be, name, bounds, 64)
				defer closeAll()
				return decodeTime(b, func(emit func(inference.Token) error) (inference.Result, error) {
					return be.GenerateWith(ctx, req(seed), layers, emit)
				})
			}
			single := func(seed int64) (time.Duration, int) {
				return decodeTime(b, func(emit func(inference.Token) error) (inference.Result, error) {
					return be.Generate(ctx, req(seed), emit)
				})
			}
			split(-1)
			if err := be.Load(ctx, name); err != nil {
				b.Fatal(err)
			}
			single(-1)

			b.ResetTimer()
			var tSingle, tSplit time.Duration
			var nSingle, nSplit int
			var ratios []float64
			for i := range b.N {
				seed := int64(i)
				var t1, t2 time.Duration
				var n1, n2 int
				if i%2 == 0 {
					t1, n1 = single(seed)
					t2, n2 = split(seed)
				} else {
					t2, n2 = split(seed)
					t1, n1 = single(seed)
				}
				tSingle, nSingle, tSplit, nSplit = tSingle+t1, nSingle+n1, tSplit+t2, nSplit+n2
				ratios = append(ratios, t2.Seconds()/float64(n2)/(t1.Seconds()/float64(n1)))
			}
			b.ReportMetric(median(ratios), "split-ratio")
			b.ReportMetric(float64(nSingle)/tSingle.Seconds(), "tokens/s")
			b.ReportMetric(float64(nSplit)/tSplit.Seconds(), "split-tokens/s")
		})
	}
}

// decodeTime runs generate and returns the time from its first token to its return and
// the number of tokens generated in that time (all but the first).
func decodeTime(b *testing.B, generate func(emit func(inference.Token) error) (inference.Result, error)) (time.Duration, int) {
	b.Helper()
	var first time.Time
	res, err := generate(func(tok inference.Token) error {
		if tok.Index == 0 {
			first = time.Now()
		}
		return nil
	})
	if err != nil {
		b.Fatalf("generate: %v", err)
	}
	return time.Since(first), res.Usage.CompletionTokens - 1
}

// BenchmarkShardedPrefill compares the prefill of a 512-token prompt through a 3-stage
// in-process pipeline with Generate's on the same model, in the same run. One op is one
// request of each, in alternating order, with max_tokens 1: the prompt in one call to the
// layers, the logits, one sampled token. Metrics:
//
//	split-ratio      time of the pipeline ÷ Generate's, the median over the ops (the goal
//	                 is at most 1.1)
//	prompt-tokens/s  Generate's prefill speed
func BenchmarkShardedPrefill(b *testing.B) {
	for _, name := range []string{"synth-small", "synth-base"} {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			be := newBackend(b, name)
			p := be.models[name].preset
			bounds := []int{0, p.Layers * 3 / 8, p.Layers * 6 / 8, p.Layers}
			// '\x01' is one token; with the two role markers the prompt is 512 tokens.
			req := &inference.Request{
				Model:     name,
				Messages:  []inference.Message{{Role: inference.RoleUser, Content: strings.Repeat("\x01", 510)}},
				MaxTokens: ptr(1),
			}
			discard := func(inference.Token) error { return nil }
			split := func() time.Duration {
				layers, closeAll := pipeline(b, be, name, bounds, 512)
				defer closeAll()
				start := time.Now()
				res, err := be.GenerateWith(ctx, req, layers, discard)
				if err != nil || res.Usage.PromptTokens != 512 {
					b.Fatalf("GenerateWith: %+v, %v", res, err)
				}
				return time.Since(start)
			}
			single := func() time.Duration {
				start := time.Now()
				if _, err := be.Generate(ctx, req, discard); err != nil {
					b.Fatalf("Generate: %v", err)
				}
				return time.Since(start)
			}
			split()
			if err := be.Load(ctx, name); err != nil {
				b.Fatal(err)
			}
			single()

			b.ResetTimer()
			var tSingle time.Duration
			var ratios []float64
			for i := range b.N {
				var t1, t2 time.Duration
				if i%2 == 0 {
					t1, t2 = single(), split()
				} else {
					t2, t1 = split(), single()
				}
				tSingle += t1
				ratios = append(ratios, t2.Seconds()/t1.Seconds())
			}
			b.ReportMetric(median(ratios), "split-ratio")
			b.ReportMetric(512*float64(b.N)/tSingle.Seconds(), "prompt-tokens/s")
		})
	}
}

func median(v []float64) float64 {
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// BenchmarkLongAttention measures attention split by heads (attend) at a long context: one
// op is a pass of 16 positions of synth-base's layers at positions 4,080 to 4,095, the
// last block of a full-window prompt. The reference, run in the same benchmark, is the same
// pass with attention on one goroutine; the metric split-ratio is the split pass's time ÷
// the reference's (below 1 is faster; the matrix products are split in both).
func BenchmarkLongAttention(b *testing.B) {
	p, _ := LookupPreset("synth-base")
	w, err := materialize(context.Background(), p, whole(p))
	if err != nil {
		b.Fatal(err)
	}
	pass := func(workers int) time.Duration {
		st := newStack(w, 0, p.Layers, p.Context)
		st.scores = st.scores[:min(workers, len(st.scores))]
		st.pos = p.Context - blockSize // the cache's content does not change the work
		x := make([]float32, blockSize*p.Dim)
		w.embed(x, make([]int, blockSize), st.pos)
		start := time.Now()
		if err := st.forward(context.Background(), x, blockSize); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var split, one time.Duration
	for b.Loop() {
		split += pass(p.Heads)
		one += pass(1)
	}
	b.ReportMetric(float64(split)/float64(one), "split-ratio")
	b.ReportMetric(float64(split.Milliseconds())/float64(b.N), "split-ms/op")
}

// BenchmarkExp measures exp, which softmax calls once per attention score (a sixth of a
// long prefill's time), against the same polynomial scaled by math.Ldexp, measured in the
// same run: metric exp-ratio, exp's time ÷ the Ldexp form's, over softmax's arguments.
func BenchmarkExp(b *testing.B) {
	xs := make([]float64, 4096)
	for i := range xs {
		xs[i] = -float64(i) / 128 // 0 to −32: scores less the best
	}
	var sink float64
	var fast, ref time.Duration
	for b.Loop() {
		start := time.Now()
		for _, x := range xs {
			sink += exp(x)
		}
		fast += time.Since(start)
		start = time.Now()
		for _, x := range xs {
			sink += math.Ldexp(expParts(x))
		}
		ref += time.Since(start)
	}
	if sink == 0 {
		b.Fatal("no sum")
	}
	b.ReportMetric(float64(fast)/float64(ref), "exp-ratio")
}

// BenchmarkDecodeStepByContext measures one decode step of synth-base (one position
// through every layer, without the logits) at positions 258 and 3,943, M1's two contexts:
// metric "step-ratio", the long step ÷ the short one in the same run, which bounds how flat
// a live transfer's downtime can be (the replacement's first step is part of it); "ms@258"
// and "ms@3943" the steps themselves.
func BenchmarkDecodeStepByContext(b *testing.B) {
	p, _ := LookupPreset("synth-base")
	w, err := materialize(context.Background(), p, whole(p))
	if err != nil {
		b.Fatal(err)
	}
	st := newStack(w, 0, p.Layers, p.Context)
	x := make([]float32, p.Dim)
	step := func(pos int) time.Duration {
		st.pos = pos // the cache's content does not change the work
		w.embed(x, []int{1}, pos)
		start := time.Now()
		if err := st.forward(context.Background(), x, 1); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var short, long time.Duration
	for b.Loop() {
		short += step(257)
		long += step(3942)
	}
	b.ReportMetric(float64(long)/float64(short), "step-ratio")
	b.ReportMetric(float64(short.Microseconds())/1000/float64(b.N), "ms@258")
	b.ReportMetric(float64(long.Microseconds())/1000/float64(b.N), "ms@3943")
}
