package route

import (
	"math"
	"math/bits"
	"time"
)

// PrefillFit is the time a model takes to its first token as a function of the prompt's
// length, fitted to measured first tokens, for the viability gate (GateInput.PrefillRate
// and GateInput.CloudTTFTPerToken are read from it at the session's length).
//
// A transformer's prefill of n tokens costs T(n) = c + a·n + b·n²: fixed costs (and, for a
// cloud, its round trip), the per-token work of the projections and MLP, and attention,
// in which each position reads every earlier one. One average of seconds per token, taken
// from prompts of every length, under-estimates a long prompt's prefill and over-estimates
// a short one's (synth-small on 2 cores: 1.3 ms a token at 235 tokens, 2.3 ms at 690),
// while the gate weighs prefills against transfers, which grow linearly. PrefillFit fits
// c, a and b, none negative, by least squares: of the fits of every subset of the three
// terms whose coefficients are all ≥ 0, the one with the least residual. With samples of
// one length only that is the line through the origin (their mean time per token); beyond
// the samples' lengths the curve is extrapolated.
//
// The samples are kept by length bucket (prompts of 2^k to 2^(k+1) tokens): each bucket's
// recent samples, each new one weighing 1/4 (as the executor's other moving averages do),
// so that a node that slows down is followed within a few prefills. A bucket's weight in
// the fit is 1 when it is sampled and fades by 1/16 with every sample of another length,
// so that lengths not seen for long stop counting. Without buckets, a run of prompts of
// one length (a batch job; M2's reruns of one case) would leave the fit those samples
// only, and its extrapolation to other lengths their noise: M2 had a replay of 1,443
// tokens at 4.0 s that measured 2.4.
//
// The residual is each sample's error in time per token, (t − T(n)) ÷ n: about its
// relative error, since T grows about as n does. A prefill's noise is in proportion to
// its time (another process's time slice, a collection: a few per cent of a long prefill
// is seconds), and a fit in seconds would let the long prompts' noise set the short ones'
// estimates (M2's warm-up put a 171-token prefill 60 % high that way); per token, short
// and long prompts count alike. The weight is by length, not by time, so that one prefill
// timed far too short (a peer's first token sent early) weighs no more than any other of
// its length.
//
// The zero value has no sample.
type PrefillFit struct {
	// buckets holds each length bucket's samples: buckets[k] for prompts of 2^k to
	// 2^(k+1) tokens (the last bucket, those longer too).
	buckets [prefillBuckets]prefillBucket
}

// prefillBucket is a length bucket's samples: their moving sums of x^(k−2) (k = 0…4), of
// t·x^(k−2) (k = 0…2) and of t²·x^−2, where x is the length in units of prefillUnit
// tokens and t the time in seconds (the sums of x^k, t·x^k and t² of least squares, each
// sample weighed 1/x², its error per token), and the bucket's weight w (0: no sample).
type prefillBucket struct {
	s [9]float64
	w float64
}

const (
	// prefillUnit scales prompt lengths (x = n / prefillUnit) so that the sums of x^−2 to
	// x² stay well conditioned for prompts of a token to millions.
	prefillUnit = 1024
	// prefillBuckets covers prompts up to 2^21 tokens a bucket each; longer ones share the
	// last.
	prefillBuckets = 22
	// prefillKeep is what a bucket's sums keep of themselves at a new sample (each new
	// one weighs 1/4), prefillFade what another bucket's weight keeps (it fades by 1/16).
	prefillKeep, prefillFade = 3.0 / 4, 15.0 / 16
	// prefillStale is the weight (after about 36 samples of other lengths) under which a
	// bucket's sums start again from its next sample.
	prefillStale = 0.1
)

// Add folds in a prefill of n tokens that took t. Samples that are not positive, or t
// over a day, are ignored.
func (f *PrefillFit) Add(n int, t time.Duration) {
	if n <= 0 || t <= 0 || t > maxEstimate {
		return
	}
	k := min(bits.Len(uint(n))-1, prefillBuckets-1)
	x, y := float64(n)/prefillUnit, t.Seconds()
	w := 1 / (x * x) // per token: see the type's comment
	sample := [9]float64{w, 1 / x, 1, x, x * x, w * y, y / x, y, w * y * y}
	for i := range f.buckets {
		f.buckets[i].w *= prefillFade
	}
	b := &f.buckets[k]
	if b.w < prefillStale { // new, or faded: its old samples say little of now
		b.s = sample
	} else {
		for i := range b.s {
			b.s[i] = prefillKeep*b.s[i] + (1-prefillKeep)*sample[i]
		}
	}
	b.w = 1
}

// longest is the upper bound (2^(k+1) tokens) of the longest length bucket not faded
// below prefillStale, 0 with none.
func (f *PrefillFit) longest() int {
	for k := len(f.buckets) - 1; k >= 0; k-- {
		if f.buckets[k].w >= prefillStale {
			return 1 << (k + 1)
		}
	}
	return 0
}

// At is the fitted prefill time of n tokens: 0 with no sample (or n ≤ 0), at most a day.
func (f PrefillFit) At(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	c, ok := f.coefficients()
	if !ok {
		return 0
	}
	x := float64(n) / prefillUnit
	sec := c[0] + c[1]*x + c[2]*x*x
	return time.Duration(min(sec, maxEstimate.Seconds()) * float64(time.Second))
}

// coefficients is the non-negative least-squares fit (c, a, b) of t = c + a·x + b·x² to
// the buckets' samples, false with none: the fit on the subset of the terms, all
// coefficients ≥ 0, with the least residual. The linear term alone (the mean time per
// token) always qualifies, its coefficient a ratio of positive sums, and stands unless
// another fits better by more than rounding (with samples of one length, all fit them
// exactly).
func (f PrefillFit) coefficients() ([3]float64, bool) {
	// s: the buckets' sums, each weighed by its w.
	var s [9]float64
	for _, b := range f.buckets {
		for i, v := range b.s {
			s[i] += b.w * v
		}
	}
	if s[0] <= 0 {
		return [3]float64{}, false
	}
	// The normal equations: G[i][j] = Σw·x^(i+j), h[i] = Σw·t·x^i.
	g := func(i, j int) float64 { return s[i+j] }
	h := func(i int) float64 { return s[5+i] }
	residual := func(c [3]float64) float64 { // Σw(t − Σ_i c_i x^i)², from the sums
		res := s[8]
		for i := range 3 {
			res -= 2 * c[i] * h(i)
			for j := range 3 {
				res += c[i] * c[j] * g(i, j)
			}
		}
		return res
	}
	best := [3]float64{0, h(1) / g(1, 1), 0}
	bestRes, tol := residual(best), 1e-9*s[8]
	// The subsets of the terms (bit i: term x^i), the linear term alone first (best
	// already), then those with it, then the rest: on a tie (two or three sample lengths
	// fit exactly by several) the earlier stands, and per-token work and attention are
	// what a prefill is mostly made of.
	for _, mask := range [...]int{6, 3, 7, 5, 4, 1} {
		var terms []int
		for i := range 3 {
			if mask&(1<<i) != 0 {
				terms = append(terms, i)
			}
		}
		coef, ok := solve(len(terms), func(r, q int) float64 { return g(terms[r], terms[q]) }, func(r int) float64 { return h(terms[r]) })
		if !ok {
			continue
		}
		var full [3]float64
		feasible := true
		for r, i := range terms {
			full[i] = coef[r]
			feasible = feasible && coef[r] >= 0
		}
		if !feasible {
			continue
		}
		if res := residual(full); res < bestRes-tol {
			best, bestRes = full, res
		}
	}
	return best, true
}

// solve solves the k×k system m·c = v (k ≤ 3) by Gaussian elimination with partial
// pivoting; false when it is singular or nearly so.
func solve(k int, m func(r, q int) float64, v func(r int) float64) ([3]float64, bool) {
	var a [3][4]float64
	scale := 0.0
	for r := range k {
		for q := range k {
			a[r][q] = m(r, q)
			scale = max(scale, math.Abs(a[r][q]))
		}
		a[r][k] = v(r)
	}
	for col := range k {
		p := col
		for r := col + 1; r < k; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[p][col]) {
				p = r
			}
		}
		if math.Abs(a[p][col]) <= 1e-12*scale {
			return [3]float64{}, false
		}
		a[col], a[p] = a[p], a[col]
		for r := col + 1; r < k; r++ {
			f := a[r][col] / a[col][col]
			for q := col; q <= k; q++ {
				a[r][q] -= f * a[col][q]
			}
		}
	}
	var c [3]float64
	for r := k - 1; r >= 0; r-- {
		sum := a[r][k]
		for q := r + 1; q < k; q++ {
			sum -= a[r][q] * c[q]
		}
		c[r] = sum / a[r][r]
	}
	return c, true
}
