package synth

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

func TestExp(t *testing.T) {
	for x := -740.0; x <= 709; x += 0.37 {
		got, want := exp(x), math.Exp(x)
		if rel := math.Abs(got-want) / want; rel > 1e-12 {
			t.Fatalf("exp(%g) = %g, math.Exp %g (rel err %g)", x, got, want, rel)
		}
	}
	for _, tt := range []struct{ x, want float64 }{
		{0, 1}, {math.Inf(-1), 0}, {-746, 0}, {710, math.Inf(1)}, {math.Inf(1), math.Inf(1)},
	} {
		if got := exp(tt.x); got != tt.want {
			t.Errorf("exp(%g) = %g, want %g", tt.x, got, tt.want)
		}
	}
	if !math.IsNaN(exp(math.NaN())) {
		t.Errorf("exp(NaN) is not NaN")
	}
}

// TestExpScaling: exp's power-of-two product is Ldexp's result bit for bit, over the whole
// range, where the results are normal and where they are subnormal (below about −708).
func TestExpScaling(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200000 {
		x := -745 + rng.Float64()*(709+745)
		if i%2 == 0 {
			x = -rng.Float64() * 40 // softmax's range, where attention calls it
		}
		if got, want := exp(x), math.Ldexp(expParts(x)); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("exp(%v) = %v, Ldexp of its parts %v", x, got, want)
		}
	}
}

// TestMatmulParallelBitIdentical: splitting rows over goroutines changes no bit.
func TestMatmulParallelBitIdentical(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const rows, cols, batch = 300, 257, 3
	w, x := make([]float32, rows*cols), make([]float32, batch*cols)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	serial := make([]float32, batch*rows)
	matmulRows(serial, w, x, rows, cols, batch, 0, rows)
	for _, procs := range []int{1, 2, 3, 7} {
		prev := runtime.GOMAXPROCS(procs)
		par := make([]float32, batch*rows)
		matmul(par, w, x, rows, cols, batch)
		runtime.GOMAXPROCS(prev)
		for i := range serial {
			if math.Float32bits(par[i]) != math.Float32bits(serial[i]) {
				t.Fatalf("GOMAXPROCS %d: output %d is %g, serial %g", procs, i, par[i], serial[i])
			}
		}
	}
	var want float64
	for i := range cols {
		want += float64(w[i]) * float64(x[i])
	}
	if math.Abs(float64(serial[0])-want) > 1e-3 {
		t.Errorf("dot = %g, float64 reference %g", serial[0], want)
	}
}

// TestWeighValuesPlainLoop: weighValues, four positions a pass, gives the bits of the plain
// loop (one position a pass, each product rounded, then added to o), for every count of
// positions modulo four.
func TestWeighValuesPlainLoop(t *testing.T) {
	const dh = 12
	for n := range 11 {
		scores := make([]float64, n)
		v := make([]float32, n*dh)
		var sum float64
		for j := range scores {
			scores[j] = 1 / float64(j+3)
			sum += scores[j]
		}
		for i := range v {
			v[i] = float32(i%7) - 2.9 + float32(i)/37
		}
		want := make([]float32, dh)
		for j, e := range scores {
			pj := float32(e / sum)
			for i := range want {
				want[i] += float32(pj * v[j*dh+i])
			}
		}
		got := make([]float32, dh)
		for i := range got {
			got[i] = 99 // weighValues overwrites o
		}
		weighValues(got, v, scores, sum)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%d positions: value %d is %g, the plain loop gives %g", n, i, got[i], want[i])
			}
		}
	}
}
