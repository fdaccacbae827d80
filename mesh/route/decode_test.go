package route

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// stepAt is a decode step of a + b·x at context x, with b per position.
func stepAt(a, b time.Duration) func(x int) time.Duration {
	return func(x int) time.Duration { return a + time.Duration(float64(b)*float64(x)) }
}

// A stream's tokens come at the step of their context: the fit follows a step that grows
// with the context (synth-base's 1.9 times from 258 to 3,943 positions), from samples at
// a few contexts, with their noise; with one context it is that context's rate.
func TestDecodeFit(t *testing.T) {
	growing := stepAt(8*time.Millisecond, 2*time.Microsecond) // 8.5 ms at 258, 15.9 at 3,943
	for _, tc := range []struct {
		name    string
		samples []int // mean contexts, in order
		step    func(int) time.Duration
		noise   float64 // each sample's step off by up to ± this share
		at      [][2]int
		within  float64
	}{
		{"one context: its rate everywhere", []int{300}, stepAt(10*time.Millisecond, 0), 0, [][2]int{{100, 10}, {3000, 500}}, 0.01},
		{"growing: interpolated and extrapolated", []int{80, 300, 1200, 80, 300, 1200}, growing, 0, [][2]int{{258, 0}, {3943, 0}, {1000, 1000}, {4000, 64}}, 0.02},
		{"growing, samples ±10 %", []int{80, 300, 600, 1200, 2400, 80, 300, 600, 1200, 2400, 80, 300, 600, 1200, 2400}, growing, 0.1, [][2]int{{258, 8}, {3943, 64}}, 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			var f DecodeFit
			for _, x := range tc.samples {
				f.Add(x, time.Duration(float64(tc.step(x))*(1+tc.noise*(2*rng.Float64()-1))))
			}
			for _, a := range tc.at {
				ctx, n := a[0], a[1]
				want := 1 / tc.step(ctx+n/2).Seconds()
				if got := f.Rate(ctx, n); math.Abs(got/want-1) > tc.within {
					t.Errorf("Rate(%d, %d) = %.1f tokens/s, want %.1f (±%.0f %%)", ctx, n, got, want, 100*tc.within)
				}
			}
		})
	}
	// What one average rate would say of a long session's tokens, against the fit.
	var f DecodeFit
	sum, k := 0.0, 0
	for _, x := range []int{80, 300, 1200, 80, 300, 1200} {
		f.Add(x, growing(x))
		sum, k = sum+1/growing(x).Seconds(), k+1
	}
	if avg, fit, want := sum/float64(k), f.Rate(3900, 64), 1/growing(3932).Seconds(); avg < 1.3*want || math.Abs(fit/want-1) > 0.02 {
		t.Errorf("at 3,932 positions: the average rate %.1f, the fit %.1f, the true %.1f tokens/s: want the average well off and the fit on", avg, fit, want)
	}
}

func TestDecodeFitEdges(t *testing.T) {
	var f DecodeFit
	if r := f.Rate(100, 10); r != 0 {
		t.Fatalf("no sample: rate %v, want 0", r)
	}
	f.Add(0, time.Millisecond)
	f.Add(100, 0)
	f.Add(100, -time.Millisecond)
	f.Add(100, 2*time.Minute)
	if r := f.Rate(100, 10); r != 0 {
		t.Fatalf("only samples that say nothing: rate %v, want 0", r)
	}
	f.Add(1<<40, maxDecodeStep) // x·s far past a day, and past int64's nanoseconds: ignored
	f.Add(100, 10*time.Millisecond)
	if r := f.Rate(100, 0); math.Abs(r/100-1) > 1e-9 {
		t.Fatalf("one sample of 10 ms a step: rate %v, want 100 tokens/s", r)
	}
	if r := f.Rate(0, 0); r != 0 {
		t.Fatalf("no context and no tokens: rate %v, want 0", r)
	}
}

// Samples from short contexts only (100 and 300 positions, ±10 %) fit a slope of their
// noise: at 4,000 positions it put the step at 0.6 to 2 times the true one. Held past twice
// the longest bucket sampled, the rate there is between the true one and the mean step's
// (the one rate the gate had before), whatever the noise.
func TestDecodeFitShortContexts(t *testing.T) {
	step := stepAt(8*time.Millisecond, 2*time.Microsecond)
	truth := 1 / step(4000).Seconds()
	for seed := range uint64(32) {
		rng := rand.New(rand.NewPCG(seed, 9))
		var f DecodeFit
		var sum time.Duration
		for range 6 {
			for _, x := range []int{100, 300} {
				s := time.Duration(float64(step(x)) * (1 + 0.1*(2*rng.Float64()-1)))
				f.Add(x, s)
				sum += s
			}
		}
		mean := 12 / sum.Seconds()
		if got := f.Rate(4000, 0); got < 0.9*truth || got > 1.1*mean {
			t.Errorf("seed %d: rate at 4,000 positions %.1f tokens/s, want between the true %.1f and the mean step's %.1f", seed, got, truth, mean)
		}
	}
}
