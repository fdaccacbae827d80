package synth

import (
	"context"
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
