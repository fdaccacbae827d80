package testnet

import (
	"math"
	"testing"
)

// slope is the least-squares slope of ys over xs (docs/reliability.md L4: the heap's growth
// per minute after the warm-up). A leak shows as a steady slope; one spike or one GC cycle
// more or less moves a fit over dozens of samples far less than it moves a difference of
// the first and last sample. False with fewer than two samples or every x the same.
func slope(xs, ys []float64) (float64, bool) {
	n := float64(len(xs))
	if len(xs) < 2 || len(xs) != len(ys) {
		return 0, false
	}
	var sx, sy float64
	for i := range xs {
		sx, sy = sx+xs[i], sy+ys[i]
	}
	mx, my := sx/n, sy/n
	var sxy, sxx float64
	for i := range xs {
		dx := xs[i] - mx
		sxy += dx * (ys[i] - my)
		sxx += dx * dx
	}
	if sxx == 0 {
		return 0, false
	}
	return sxy / sxx, true
}

// The fit L4's heap assertion rests on: exact on a line, the line through noise, and no
// answer where there is no slope to fit.
func TestSlope(t *testing.T) {
	for _, tc := range []struct {
		name   string
		xs, ys []float64
		want   float64
		ok     bool
	}{
		{"flat", []float64{0, 1, 2, 3}, []float64{5, 5, 5, 5}, 0, true},
		{"line", []float64{0, 1, 2, 3}, []float64{1, 3, 5, 7}, 2, true},
		{"falling", []float64{0, 0.5, 1}, []float64{10, 9.5, 9}, -1, true},
		// Noise around y = x: residuals +1, -1, -1, +1 cancel in the fit.
		{"noise", []float64{0, 1, 2, 3}, []float64{1, 0, 1, 4}, 1, true},
		// One spike at the end of a flat series pulls the fit far less than last - first (6).
		{"spike", []float64{0, 1, 2, 3, 4, 5, 6}, []float64{0, 0, 0, 0, 0, 0, 6}, 9.0 / 14, true},
		{"one sample", []float64{1}, []float64{1}, 0, false},
		{"one x", []float64{2, 2}, []float64{1, 3}, 0, false},
		{"lengths differ", []float64{0, 1}, []float64{1}, 0, false},
	} {
		got, ok := slope(tc.xs, tc.ys)
		if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: slope %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
