package route

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// prefillCurve is T(n) = c + a·n + b·n² with c, a per token and b per token².
func prefillCurve(c, a, b time.Duration) func(n int) time.Duration {
	return func(n int) time.Duration {
		x := float64(n)
		return c + time.Duration(float64(a)*x+float64(b)*x*x)
	}
}

func TestPrefillFit(t *testing.T) {
	// synth-small on 2 cores is close to this: 1.3 ms a token at 235 tokens, 2.3 at 690.
	attention := prefillCurve(2*time.Millisecond, 800*time.Microsecond, 2200*time.Nanosecond)
	for _, tc := range []struct {
		name    string
		samples []int // prompt lengths, in order
		curve   func(int) time.Duration
		at      []int // lengths at which At must be within 2 % of curve
	}{
		{"one length: its time per token", []int{400}, func(n int) time.Duration { return time.Duration(n) * time.Millisecond }, []int{16, 400, 4000}},
		{"four lengths of a quadratic curve: interpolated and extrapolated", []int{64, 256, 512, 900, 64, 256, 512, 900}, attention, []int{32, 235, 690, 900, 2000, 4096}},
		{"a cloud's round trip: the constant", []int{16, 120, 480, 16, 120, 480}, prefillCurve(50*time.Millisecond, 2*time.Millisecond, 0), []int{8, 100, 1000}},
		{"two lengths: per-token work and attention, not a constant", []int{200, 800, 200, 800}, prefillCurve(0, time.Millisecond, time.Microsecond), []int{100, 200, 800, 1600}},
		{"two lengths of a cloud: its round trip", []int{16, 480}, prefillCurve(50*time.Millisecond, 2*time.Millisecond, 0), []int{8, 240, 1000}},
		{"linear, long prompts", []int{1000, 8000, 32000, 1000, 8000, 32000}, prefillCurve(0, 100*time.Microsecond, 0), []int{500, 64000, 128000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f PrefillFit
			for _, n := range tc.samples {
				f.Add(n, tc.curve(n))
			}
			for _, n := range tc.at {
				want, got := tc.curve(n), f.At(n)
				if math.Abs(float64(got-want)) > 0.02*float64(want) {
					t.Errorf("At(%d) = %v, want %v (±2 %%); fit %v", n, got, want, fitOf(f))
				}
			}
		})
	}
}

func TestPrefillFitEdges(t *testing.T) {
	var f PrefillFit
	if got := f.At(100); got != 0 {
		t.Fatalf("no sample: At = %v, want 0", got)
	}
	for _, s := range []struct {
		n int
		t time.Duration
	}{{0, time.Second}, {-5, time.Second}, {100, 0}, {100, -time.Second}, {100, 25 * time.Hour}} {
		f.Add(s.n, s.t)
	}
	if f != (PrefillFit{}) {
		t.Fatalf("samples that are not positive (or over a day) were taken: %+v", f)
	}
	f.Add(100, time.Second)
	if got := f.At(0); got != 0 {
		t.Fatalf("At(0) = %v, want 0", got)
	}
	if got := f.At(math.MaxInt); got != maxEstimate {
		t.Fatalf("At(MaxInt) = %v, want the cap %v", got, maxEstimate)
	}

	// A node that becomes twice as slow: the fit follows within a few prefills.
	slow := prefillCurve(0, 2*time.Millisecond, 0)
	for i := range 8 {
		n := 100 + 300*(i%3)
		f.Add(n, slow(n))
	}
	if got, want := f.At(400), slow(400); math.Abs(float64(got-want)) > 0.25*float64(want) {
		t.Fatalf("after 8 prefills twice as slow: At(400) = %v, want %v ± 25 %%", got, want)
	}
}

// Whatever the samples, noisy or not, the fit is never negative and never shorter for a
// longer prompt: each coefficient is ≥ 0.
func TestPrefillFitNonDecreasing(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		var f PrefillFit
		for range 1 + rng.IntN(12) {
			f.Add(1+rng.IntN(5000), time.Duration(1+rng.Int64N(int64(10*time.Second))))
		}
		prev := time.Duration(0)
		for n := 1; n < 1<<20; n *= 2 {
			got := f.At(n)
			if got < prev {
				t.Fatalf("At(%d) = %v < At(%d) = %v; fit %v", n, got, n/2, prev, fitOf(f))
			}
			prev = got
		}
		if prev <= 0 {
			t.Fatalf("At is %v for a long prompt; fit %v", prev, fitOf(f))
		}
	}
}

// Prefills vary in proportion to their length's time (another process's time slice, a
// collection: several per cent of a long prefill is seconds). A fit that weighs the long
// samples' seconds lets their noise set the short prompts' estimates; the fit by time per
// token keeps every length within about the noise's share. The samples are M2's warm-up:
// five lengths, twice, each 15 % off in turn.
func TestPrefillFitNoiseInProportion(t *testing.T) {
	curve := prefillCurve(2*time.Millisecond, 800*time.Microsecond, 600*time.Nanosecond)
	for _, sign := range []float64{1, -1} {
		var f PrefillFit
		for i, n := range []int{64, 250, 1000, 2000, 3500, 64, 250, 1000, 2000, 3500} {
			off := 0.15 * sign
			if i%2 == 1 {
				off = -off
			}
			f.Add(n, time.Duration(float64(curve(n))*(1+off)))
		}
		for _, n := range []int{64, 171, 250, 1000, 1781, 3500} {
			want, got := curve(n), f.At(n)
			if math.Abs(float64(got-want)) > 0.2*float64(want) {
				t.Errorf("noise %+.0f %% first: At(%d) = %v, want %v ± 20 %%; fit %v", 15*sign, n, got, want, fitOf(f))
			}
		}
	}
}

// One prefill timed far too short (a peer that sends its first token at once and stalls
// after it) weighs as any sample of its length does: it moves the fit, by no more than
// the newest sample's quarter can. (With the residual in seconds, as before, such a
// sample set a 64-token prefill at a twelfth of its time.)
func TestPrefillFitShortOutlier(t *testing.T) {
	curve := prefillCurve(2*time.Millisecond, 800*time.Microsecond, 600*time.Nanosecond)
	var f PrefillFit
	for _, n := range []int{64, 250, 1000, 2000, 3500, 64, 250, 1000, 2000, 3500} {
		f.Add(n, curve(n))
	}
	f.Add(1000, time.Microsecond)
	for _, n := range []int{64, 250, 1000, 3500} {
		if want, got := curve(n), f.At(n); math.Abs(float64(got-want)) > 0.6*float64(want) {
			t.Errorf("At(%d) = %v after one 1 µs sample, want %v ± 60 %%; fit %v", n, got, want, fitOf(f))
		}
	}
}

// fitOf is f's coefficients for a test's message.
func fitOf(f PrefillFit) [3]float64 {
	c, _ := f.coefficients()
	return c
}

// Runs of prompts of one length (a batch job; M2's reruns of one case) leave the other
// lengths' buckets in the fit: its estimates elsewhere are not an extrapolation of one
// length's noise. The samples: a warm-up at five lengths, then M2's cases 95-102 (their
// lengths and how many replays each ran), the machine 10 % quicker than in the warm-up
// and each run within ±12 %. A single moving sum over all samples put a 63-token prefill
// at 2.4 times its time and a 4,000-token one at 1.4.
func TestPrefillFitRunsOfOneLength(t *testing.T) {
	curve := prefillCurve(2*time.Millisecond, 1560*time.Microsecond, 437*time.Nanosecond)
	var f PrefillFit
	for _, n := range []int{64, 250, 1000, 2000, 3500, 64, 250, 1000, 2000, 3500} {
		f.Add(n, curve(n))
	}
	i := 0
	for _, run := range []struct{ n, times int }{{291, 3}, {167, 1}, {955, 11}, {3103, 1}, {307, 11}, {755, 11}, {271, 1}, {441, 11}} {
		for range run.times {
			noise := 0.9 * (1 + 0.12*float64(i%3-1))
			i++
			f.Add(run.n, time.Duration(float64(curve(run.n))*noise))
		}
	}
	for _, n := range []int{63, 171, 1443, 4000} {
		if want, got := curve(n), f.At(n); math.Abs(float64(got-want)) > 0.2*float64(want) {
			t.Errorf("At(%d) = %v, want %v ± 20 %%; fit %v", n, got, want, fitOf(f))
		}
	}
}
