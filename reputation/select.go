package reputation

import (
	"math"
	"math/rand/v2"
	"time"
)

// maxPerformanceFactor bounds a candidate's performance factor (dimensionless). The store
// never produces more than 2^16; the bound keeps a caller's Inf from swallowing every other
// weight.
const maxPerformanceFactor = 1 << 16

// Candidate is one eligible-or-not target as Select sees it.
type Candidate struct {
	// Score is the node score (points, [0, 100]); below ExcludeBelow, or NaN, the candidate is
	// never picked.
	Score float64
	// Performance is the relative speed factor (dimensionless, 1 = par, larger is faster);
	// Store.Performance provides it. Non-positive or NaN gives no weighted share (exploration
	// can still pick it).
	Performance float64
	// Spare is the spare capacity (fraction, (0, 1]; larger values count as 1). Zero,
	// negative or NaN means full: the candidate is not eligible. Pass 1 when unknown.
	Spare float64
	// Penalty and Cooling are what placed the candidate in Rank's order; Select ignores
	// them. Penalty is the (model, target) residual penalty (points, 0 = clean); Cooling is
	// set only when every candidate was cooling (Explicit mode then returns them all, in
	// their given order).
	Penalty float64
	Cooling bool
	// LastFailure is when the (model, target)'s latest retryable failure was recorded
	// (zero: none): how stale its penalty is. Select ignores it; the router's stale-peer
	// boost reads it (mesh/route).
	LastFailure time.Time
	// Latency and Confidence are what this node measured of the peer's latency: the
	// geometric moving average of the latencies RecordPerformance was given (the router's
	// time to first token), 0 when none; and how much that average counts, in [0, 1] (full
	// after PerformanceSamples recent samples, fading with PerformanceHalfLife when they
	// stop). Select ignores them; the router's latency rule reads them (mesh/route).
	Latency    time.Duration
	Confidence float64
}

// eligible reports whether c may be picked at all.
func (c Candidate) eligible() bool {
	return c.Score >= ExcludeBelow && c.Spare > 0 // false for NaN
}

// weight is c's share in the weighted part of the draw: reputation × performance × spare.
func (c Candidate) weight() float64 {
	perf := c.Performance
	if !(perf > 0) {
		return 0
	}
	perf = min(perf, maxPerformanceFactor)
	return Weight(c.Score) * perf * min(c.Spare, 1)
}

// Select picks one candidate and returns its index, or false when none is eligible
// (score >= ExcludeBelow and spare capacity > 0). With probability p.Exploration the pick is
// uniform over the eligible candidates; otherwise it is weighted by reputation weight ×
// performance × spare capacity. If every eligible weight is zero, the pick is uniform.
//
// Select is pure: the same candidates, exploration share and rng state give the same pick.
// It draws exactly one number from rng per call with an eligible candidate. A nil rng uses
// math/rand/v2's process-wide source (not reproducible). It runs in O(len(cands)) without
// allocating.
func Select(cands []Candidate, p Params, rng *rand.Rand) (index int, ok bool) {
	eps := p.Exploration
	if !(eps >= 0 && eps < 1) {
		eps = DefaultExploration // Params not validated: fall back rather than misbehave
	}
	n := 0
	var total float64
	for _, c := range cands {
		if c.eligible() {
			n++
			total += c.weight()
		}
	}
	if n == 0 {
		return -1, false
	}
	var u float64
	if rng != nil {
		u = rng.Float64()
	} else {
		u = rand.Float64()
	}
	// One uniform draw decides both the branch and the pick: given u < eps, u/eps is again
	// uniform on [0, 1), and likewise (u-eps)/(1-eps) given u >= eps.
	if u < eps || total <= 0 || math.IsInf(total, 0) {
		var x float64
		if u < eps {
			x = u / eps
		} else {
			x = (u - eps) / (1 - eps)
		}
		k := min(int(x*float64(n)), n-1)
		for i, c := range cands {
			if c.eligible() {
				if k == 0 {
					return i, true
				}
				k--
			}
		}
	}
	r := (u - eps) / (1 - eps) * total
	last := -1
	for i, c := range cands {
		if !c.eligible() {
			continue
		}
		w := c.weight()
		if w <= 0 {
			continue
		}
		last = i
		if r < w {
			return i, true
		}
		r -= w
	}
	// Rounding left r just past the end: the last weighted candidate owns that sliver.
	return last, last >= 0
}

// Weight maps a node score to a selection weight:
//
//	score < 40        → 0 (excluded; also NaN)
//	40 ≤ score < 50   → 0.1 + 0.04·(score − 40)   probation: 0.1 at 40, 0.5 at 50
//	50 ≤ score < 90   → 0.5 + (score − 50)/80     0.5 at 50, 1.0 at 90
//	score ≥ 90        → 1
//
// The curve is continuous from 40 up; the probation band is four times steeper than the
// band above 50, so a peer at 45 weighs 0.3 against 1.0 at 90.
func Weight(score float64) float64 {
	switch {
	case !(score >= ExcludeBelow):
		return 0
	case score >= FullWeightScore:
		return 1
	case score >= NeutralScore:
		return NeutralWeight + (score-NeutralScore)*(1-NeutralWeight)/(FullWeightScore-NeutralScore)
	default:
		return ProbationWeight + (score-ExcludeBelow)*(NeutralWeight-ProbationWeight)/(NeutralScore-ExcludeBelow)
	}
}
