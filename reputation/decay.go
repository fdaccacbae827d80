package reputation

import (
	"math"
	"time"
)

// decayFactor is the multiplier that ages a counter over dt with the given half-life.
// A negative dt (a clock that stepped back) ages nothing.
func decayFactor(dt, halfLife time.Duration) float64 {
	if dt <= 0 {
		return 1
	}
	return math.Exp2(-float64(dt) / float64(halfLife))
}

// snap turns an aged counter that no longer matters into exactly zero.
func snap(v float64) float64 {
	if math.Abs(v) < decayToZero {
		return 0
	}
	return v
}

// clampScore bounds a raw score to [MinScore, MaxScore]. NaN cannot arise from validated
// parameters and sanitised inputs; if it ever did, the peer is treated as unknown.
func clampScore(v float64) float64 {
	switch {
	case math.IsNaN(v):
		return NeutralScore
	case v < MinScore:
		return MinScore
	case v > MaxScore:
		return MaxScore
	}
	return v
}
