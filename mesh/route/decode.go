package route

import "time"

// DecodeFit is a model's decode step as a function of the context it attends over, fitted
// to measured streams, for the viability gate (GateInput.DecodeRate and
// GateInput.CloudRate are read from it over the tokens a cut session still has to come).
//
// A decode step at context x costs s(x) = a + b·x: the per-token work of the projections
// and MLP, and attention over the x positions before it. A long session's tokens come
// slower than a short one's (synth-base on 2 cores: 1.9 times from 258 to 3,943
// positions), and the sessions the gate moves are cut mid-way, often long: one average
// rate, taken mostly from short chats, would promise their tokens too soon, for every
// way on that decodes them (a replay, a live transfer), and the more so the more tokens
// are still to come.
//
// DecodeFit fits s by PrefillFit's method, of which it is a view: a stream's mean step s
// at its mean context x is the sample (x, x·s), whose error per position is the step's
// own, so that PrefillFit's c + a·x + b·x², divided by x, is c/x + a + b·x, with c (a
// prefill's fixed costs) about 0 here. Samples are kept by context bucket and fade as
// PrefillFit's do; with samples of one context the fit is their mean step.
//
// Past twice the longest context bucket sampled (PrefillFit.longest), the step is held at
// its value there: a slope fitted from short contexts alone carries their noise, and
// extrapolated to ten times their length it put a step at 0.6 to 2 times the true one
// (TestDecodeFitShortContexts). Held, the rate of a session longer than any seen is
// between the true one and the mean step's, as it was before the fit.
//
// The zero value has no sample.
type DecodeFit struct {
	f PrefillFit
}

// maxDecodeStep is the longest step a sample may have (a minute): a stream that slow says
// nothing the gate can use.
const maxDecodeStep = time.Minute

// Add folds in a stream whose decode steps took step each on average, at a mean context
// of ctx positions. Samples that are not positive, a step over a minute, or x·s over a
// day (PrefillFit's bound, checked before it could overflow) are ignored.
func (d *DecodeFit) Add(ctx int, step time.Duration) {
	if ctx <= 0 || step <= 0 || step > maxDecodeStep || time.Duration(ctx) > maxEstimate/step {
		return
	}
	d.f.Add(ctx, time.Duration(ctx)*step)
}

// Rate is the fitted rate (tokens/s) of n tokens decoded from a context of ctx positions:
// the step at their mean context, ctx + n/2 (the step is linear in the context); 0 with no
// sample.
func (d *DecodeFit) Rate(ctx, n int) float64 {
	x := max(ctx, 0) + max(n, 0)/2
	if x <= 0 {
		return 0
	}
	x = min(x, 2*d.f.longest())
	t := d.f.At(x)
	if t <= 0 {
		return 0
	}
	return float64(x) / t.Seconds()
}
