package synth

import (
	"math"
	"runtime"
	"sync"
)

// Numerics are bit-identical on every machine and for every schedule:
//
//   - Every product that is then added is written float32(a*b) (or float64(a*b)). The Go
//     spec lets a compiler fuse x*y+z into one FMA, and it does on arm64 and with
//     GOAMD64=v3; an explicit conversion forces the rounding and forbids the fusion.
//   - exp is our own, built from + − × ÷ alone: math.Exp has assembly versions whose
//     results depend on the architecture and, on amd64, on whether the CPU has FMA.
//   - math.Sqrt and math.Floor are exact (correctly rounded) everywhere, so they are used.
//   - Parallel matmul splits output rows between goroutines; each output is still one dot
//     product computed in one fixed order, so the split never changes a bit.

// dot returns Σ a[i]·b[i] with four interleaved float32 accumulators.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		aa, bb := a[i:i+4:i+4], b[i:i+4:i+4]
		s0 += float32(aa[0] * bb[0])
		s1 += float32(aa[1] * bb[1])
		s2 += float32(aa[2] * bb[2])
		s3 += float32(aa[3] * bb[3])
	}
	for ; i < len(a); i++ {
		s0 += float32(a[i] * b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

// weighValues sets o to the sum over positions j of scores[j]/sum times the value v[j]
// (v holds one head's values, len(o) per position). Each o[i] is the float32 sum
// ((0 + p0·v0[i]) + p1·v1[i]) + … in the order of the positions, every product rounded to
// float32 before it is added (the numerics above). Attention (stack.attendHeads) weighs
// each head's values with it. Four positions are taken a pass, so o is loaded and stored
// once for four of them: the same additions in the same order as one position a pass, in
// half the CPU time (a profile of 100 decode steps at 258 positions and 100 at 3,943: 1.8 s
// → 0.83 s).
func weighValues(o, v []float32, scores []float64, sum float64) {
	clear(o)
	n := len(o)
	j := 0
	for ; j+4 <= len(scores); j += 4 {
		p0, p1 := float32(scores[j]/sum), float32(scores[j+1]/sum)
		p2, p3 := float32(scores[j+2]/sum), float32(scores[j+3]/sum)
		v0, v1 := v[j*n:][:n], v[(j+1)*n:][:n]
		v2, v3 := v[(j+2)*n:][:n], v[(j+3)*n:][:n]
		for i := range o {
			t := o[i]
			t += float32(p0 * v0[i])
			t += float32(p1 * v1[i])
			t += float32(p2 * v2[i])
			t += float32(p3 * v3[i])
			o[i] = t
		}
	}
	for ; j < len(scores); j++ {
		pj := float32(scores[j] / sum)
		vj := v[j*n:][:n]
		for i := range o {
			o[i] += float32(pj * vj[i])
		}
	}
}

// parallelMinWork is the number of multiply-adds below which a matmul runs on the calling
// goroutine alone: about 0.4 ms of work. Handing half of a product to another goroutine
// costs a few µs on an idle machine but up to a scheduler slice when the CPUs are busy (a
// node serving several requests); measured on a loaded 2-core machine, splitting 100 µs
// products made decoding slower, so only large ones (synth-base's MLP and output
// projection, and prompt blocks) are split.
const parallelMinWork = 1 << 20

// matmul computes dst[b·rows+i] = w[i,:] · x[b,:] for a batch of vectors: w is rows×cols,
// row-major; x holds batch vectors of cols values; dst holds batch vectors of rows values.
// Large products are split by rows over GOMAXPROCS goroutines, which all end before matmul
// returns.
func matmul(dst, w, x []float32, rows, cols, batch int) {
	workers := runtime.GOMAXPROCS(0)
	if rows*cols*batch < parallelMinWork || workers < 2 || rows < 2*workers {
		matmulRows(dst, w, x, rows, cols, batch, 0, rows)
		return
	}
	chunk := (rows + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := chunk; lo < rows; lo += chunk {
		hi := min(lo+chunk, rows)
		wg.Go(func() { matmulRows(dst, w, x, rows, cols, batch, lo, hi) })
	}
	matmulRows(dst, w, x, rows, cols, batch, 0, chunk)
	wg.Wait()
}

func matmulRows(dst, w, x []float32, rows, cols, batch, lo, hi int) {
	for i := lo; i < hi; i++ {
		wr := w[i*cols : (i+1)*cols]
		for b := range batch {
			dst[b*rows+i] = dot(wr, x[b*cols:(b+1)*cols])
		}
	}
}

// rmsNormEps keeps rmsNorm finite for an all-zero vector; 1e-5 as in LLaMA.
const rmsNormEps = 1e-5

// rmsNorm writes x / rms(x) · gain to dst.
func rmsNorm(dst, x, gain []float32) {
	var ss float64
	for _, v := range x {
		ss += float64(float64(v) * float64(v))
	}
	inv := float32(1 / math.Sqrt(ss/float64(len(x))+rmsNormEps))
	gain = gain[:len(x)]
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = float32(v*inv) * gain[i]
	}
}

// silu applies x·σ(x) in place.
func silu(x []float32) {
	for i, v := range x {
		x[i] = float32(float64(v) / (1 + exp(-float64(v))))
	}
}

// addTo adds src to dst element-wise.
func addTo(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}

// Cody–Waite split of ln 2 (the constants of Go's math.Exp) and a degree-11 Taylor
// polynomial: on the reduced range |r| ≤ ln2/2 its error is below 1e-13, far under
// float32 precision, which is all the model needs.
const (
	ln2Hi = 6.93147180369123816490e-01
	ln2Lo = 1.90821492927058770002e-10
	log2e = 1.44269504088896338700e+00
)

// exp returns eˣ computed with + − × ÷ only, each product rounded explicitly, so that the
// result is the same on every architecture. It returns 0 below −745 (including −Inf), +Inf
// above 709, and NaN for NaN.
func exp(x float64) float64 {
	switch {
	case x != x:
		return x
	case x < -745:
		return 0
	case x > 709:
		return math.Inf(1)
	}
	p, k := expParts(x)
	if k >= -1021 && k <= 1023 {
		// p is in [1/√2, √2]: p·2ᵏ is a normal number, and multiplying by a power of two
		// is then exact, as Ldexp is, without its checks (a third of exp's time).
		return p * math.Float64frombits(uint64(k+1023)<<52)
	}
	return math.Ldexp(p, k)
}

// expParts splits eˣ = p·2ᵏ, with p = e^r for the reduced |r| ≤ ln2/2, for finite x in
// [−745, 709].
func expParts(x float64) (p float64, k int) {
	kf := math.Floor(float64(x*log2e) + 0.5)
	r := float64(x-float64(kf*ln2Hi)) - float64(kf*ln2Lo)
	// Horner on 1 + r + r²/2! + … + r¹¹/11!.
	p = 1.0 / 39916800
	for _, c := range [...]float64{1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040,
		1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1, 1} {
		p = float64(p*r) + c
	}
	return p, int(kf)
}
