package synth

import (
	"context"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
)

// part names what a load materializes of a model: the head (token and position
// embeddings, final norm, output projection) or not, and the layers [lo, hi). Comparable,
// so it keys a model's cache of loaded parts.
type part struct {
	head   bool
	lo, hi int
}

// whole is all of p: what Generate runs.
func whole(p Preset) part { return part{head: true, lo: 0, hi: p.Layers} }

// headOnly is what the head of a sharded generation holds.
func headOnly() part { return part{head: true} }

// layerRange is what a pipeline stage holds: layers [lo, hi) and no head.
func layerRange(lo, hi int) part { return part{lo: lo, hi: hi} }

// isRange reports whether pt is what a pipeline stage holds: layers and no head.
func (pt part) isRange() bool { return !pt.head && pt.lo < pt.hi }

// describe names pt of p for messages: "synth-base", "the head of synth-base" or
// "layers 4-7 of synth-base".
func (pt part) describe(p Preset) string {
	switch {
	case pt == whole(p):
		return p.Name
	case pt.lo == pt.hi:
		return "the head of " + p.Name
	}
	return "layers " + strconv.Itoa(pt.lo) + "-" + strconv.Itoa(pt.hi-1) + " of " + p.Name
}

// weights holds a materialized part of a model. All tensors are row-major [out][in] slices
// of one backing array, so a matrix-vector product reads each row contiguously. Immutable
// after materialize returns; shared read-only by every request and stage session.
type weights struct {
	p    Preset
	part part
	all  []float32 // the backing array: exactly the part's parameters
	// The head's tensors, nil unless part.head.
	tokEmb    []float32 // [Vocab][Dim]
	posEmb    []float32 // [Context][Dim]
	finalNorm []float32 // [Dim]
	out       []float32 // [Vocab][Dim]
	// layers are layers part.lo … part.hi−1.
	layers []layerWeights
}

type layerWeights struct {
	attnNorm, mlpNorm []float32 // [Dim] RMSNorm gains
	wq, wk, wv, wo    []float32 // [Dim][Dim]
	up                []float32 // [FFN][Dim]
	down              []float32 // [Dim][FFN]
}

// tensor is one named slice of the backing array and how it is initialized: std 0 means
// all ones (norm gains), otherwise approximately normal with that standard deviation.
type tensor struct {
	name string
	dst  *[]float32
	n    int
	std  float64
}

// tensors lays out the tensors of w's part in their fixed order (head first, then the
// layers, then the rest of the head), with their initial scales:
//
//	tok_emb        std 1           the residual stream starts at unit scale
//	pos_emb        std 0.5         position matters, but less than the token
//	q, k, v, up    std 1/√Dim      unit-variance projections (attention logits of order 1)
//	o, down        std 1/√fan_in/√(2·Layers)   GPT-2's residual scaling: the stream stays O(1)
//	out            std 2/√Dim      logits with std ≈ 2, so temperature and top_p matter
//	norm gains     1
//
// A tensor's values depend only on the model's and the tensor's names, so a part holds
// exactly the values the whole model holds for the same tensors.
func (w *weights) tensors() []tensor {
	p := w.p
	d, f := p.Dim, p.FFN
	proj := 1 / math.Sqrt(float64(d))
	resid := 1 / math.Sqrt(2*float64(p.Layers))
	var ts []tensor
	if w.part.head {
		ts = append(ts,
			tensor{"tok_emb", &w.tokEmb, p.Vocab * d, 1},
			tensor{"pos_emb", &w.posEmb, p.Context * d, 0.5},
		)
	}
	w.layers = make([]layerWeights, w.part.hi-w.part.lo)
	for i := range w.layers {
		l := &w.layers[i]
		pre := "layer" + strconv.Itoa(w.part.lo+i) + "."
		ts = append(ts,
			tensor{pre + "attn_norm", &l.attnNorm, d, 0},
			tensor{pre + "q", &l.wq, d * d, proj},
			tensor{pre + "k", &l.wk, d * d, proj},
			tensor{pre + "v", &l.wv, d * d, proj},
			tensor{pre + "o", &l.wo, d * d, proj * resid},
			tensor{pre + "mlp_norm", &l.mlpNorm, d, 0},
			tensor{pre + "up", &l.up, f * d, proj},
			tensor{pre + "down", &l.down, d * f, resid / math.Sqrt(float64(f))},
		)
	}
	if w.part.head {
		ts = append(ts,
			tensor{"final_norm", &w.finalNorm, d, 0},
			tensor{"out", &w.out, p.Vocab * d, 2 * proj},
		)
	}
	return ts
}

// materialize builds the weights of part pt of p, and computes no other tensor. Each
// tensor is drawn from its own PCG stream seeded with FNV-64a of "<model name>/<tensor
// name>", so the values depend on nothing but the names, and tensors can be filled in any
// order: GOMAXPROCS goroutines take them from a shared counter and all end before
// materialize returns. It checks ctx between tensors and
// every chunkCheck values inside a large one; on the first error the others stop too.
func materialize(ctx context.Context, p Preset, pt part) (*weights, error) {
	w := &weights{p: p, part: pt}
	ts := w.tensors()
	n := 0
	for _, t := range ts {
		n += t.n
	}
	w.all = hugeFloats(n)
	off := 0
	for _, t := range ts {
		*t.dst = w.all[off : off+t.n : off+t.n]
		off += t.n
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	work := func() {
		for i := int(next.Add(1) - 1); i < len(ts); i = int(next.Add(1) - 1) {
			t := ts[i]
			if err := fill(ctx, *t.dst, p.Name+"/"+t.name, t.std); err != nil {
				errOnce.Do(func() { first = err; cancel() })
				return
			}
		}
	}
	for range runtime.GOMAXPROCS(0) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	if first != nil {
		return nil, first
	}
	return w, nil
}

// chunkCheck is how many values fill draws between two looks at ctx: about a millisecond
// of work, so a cancelled load stops within a few milliseconds.
const chunkCheck = 1 << 18

// pcgStream is the second PCG word (the stream selector), fixed: "meshinfr".
const pcgStream = 0x6d657368696e6672

func fill(ctx context.Context, dst []float32, key string, std float64) error {
	if std == 0 {
		for i := range dst {
			dst[i] = 1
		}
		return ctx.Err()
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	rng := rand.NewPCG(h.Sum64(), pcgStream)
	// Irwin–Hall: the sum of four uniform 16-bit draws from one 64-bit word is close to
	// normal (mean 4·32767.5, variance 4·(65536²−1)/12) and bounded at ±3.46σ, so no weight
	// is an outlier. scale maps it to the requested std.
	const mean, sigma = 4 * 32767.5, 37837.22
	scale := std / sigma
	for i := range dst {
		if i%chunkCheck == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		u := rng.Uint64()
		s := u&0xffff + u>>16&0xffff + u>>32&0xffff + u>>48
		dst[i] = float32((float64(s) - mean) * scale)
	}
	return ctx.Err()
}

// blockSize is how many positions one pass through the layers processes together: a
// weight row is then read once for 16 positions, which makes prefill several times faster
// than one position at a time, while scratch memory stays at 16 vectors and ctx is checked
// every 16 positions.
const blockSize = 16

// embed writes to x the input hidden states of tokens at positions pos, pos+1, …: token
// embedding plus position embedding. w holds the head.
func (w *weights) embed(x []float32, tokens []int, pos int) {
	d := w.p.Dim
	for b, id := range tokens {
		row, te, pe := x[b*d:(b+1)*d], w.tokEmb[id*d:(id+1)*d], w.posEmb[(pos+b)*d:(pos+b+1)*d]
		for i := range row {
			row[i] = te[i] + pe[i]
		}
	}
}

// logits writes to dst (Vocab values) the logits after h, one position's hidden state out
// of the last layer: the final norm, then the output projection. xn is Dim values of
// scratch. w holds the head.
func (w *weights) logits(dst, xn, h []float32) {
	rmsNorm(xn, h, w.finalNorm)
	matmul(dst, w.out, xn, w.p.Vocab, w.p.Dim, 1)
}

// stack runs a contiguous range of layers over hidden states, with its own KV cache for
// those layers and its own scratch. Not safe for concurrent use; each generation (or stage
// session) owns one.
type stack struct {
	p        Preset
	layers   []layerWeights
	pos      int // positions already in the cache
	capacity int // positions the cache holds

	// kc and vc are per layer the keys and values, head-major: [Heads][capacity][Dim/Heads].
	// Attention reads one head's keys of every position in turn, which are then
	// contiguous: read position-major ([capacity][Dim]) they are a slice of every row, and a
	// long context's decode step took 3 to 4 times as long in attention.
	kc, vc [][]float32

	xn, q, k, v, att, proj []float32   // [blockSize][Dim]
	ff                     []float32   // [blockSize][FFN]
	scores                 [][]float64 // per attention worker: [capacity]
}

// newStack allocates a run of layers [lo, hi), which w holds, with room for capacity
// positions.
func newStack(w *weights, lo, hi, capacity int) *stack {
	p := w.p
	d := p.Dim
	s := &stack{
		p:        p,
		layers:   w.layers[lo-w.part.lo : hi-w.part.lo],
		capacity: capacity,
		kc:       make([][]float32, hi-lo),
		vc:       make([][]float32, hi-lo),
		xn:       make([]float32, blockSize*d),
		q:        make([]float32, blockSize*d),
		k:        make([]float32, blockSize*d),
		v:        make([]float32, blockSize*d),
		att:      make([]float32, blockSize*d),
		proj:     make([]float32, blockSize*d),
		ff:       make([]float32, blockSize*p.FFN),
	}
	// One row of attention scores for each goroutine attend may split the heads over.
	s.scores = make([][]float64, max(1, min(runtime.GOMAXPROCS(0), p.Heads)))
	for i := range s.scores {
		s.scores[i] = make([]float64, capacity)
	}
	for l := range s.kc {
		s.kc[l] = make([]float32, capacity*d)
		s.vc[l] = make([]float32, capacity*d)
	}
	return s
}

// forward runs the n hidden states of x (n×Dim, overwritten with the result) through the
// layers at the next n positions, filling the KV cache, in passes of blockSize positions.
// The caller keeps s.pos+n within the capacity. The result does not depend on how
// positions are split between calls or passes: every position is computed by the same
// sequence of operations, which reads only the keys and values of earlier positions.
// If ctx ends it returns ctx's error, and the positions run so far stay in the cache.
func (s *stack) forward(ctx context.Context, x []float32, n int) error {
	d := s.p.Dim
	for done := 0; done < n; {
		if err := ctx.Err(); err != nil {
			return err
		}
		B := min(n-done, blockSize)
		s.block(x[done*d:(done+B)*d], B)
		done += B
	}
	return nil
}

func (s *stack) block(x []float32, B int) {
	p := s.p
	d, f := p.Dim, p.FFN
	xn, q, k, v, att, proj, ff := s.xn[:B*d], s.q[:B*d], s.k[:B*d], s.v[:B*d], s.att[:B*d], s.proj[:B*d], s.ff[:B*f]
	for l := range s.layers {
		lw := &s.layers[l]
		kc, vc := s.kc[l], s.vc[l]
		// Attention: x += o(attend(q(n(x)), k(n(x)), v(n(x)))).
		for b := range B {
			rmsNorm(xn[b*d:(b+1)*d], x[b*d:(b+1)*d], lw.attnNorm)
		}
		matmul(q, lw.wq, xn, d, d, B)
		matmul(k, lw.wk, xn, d, d, B)
		matmul(v, lw.wv, xn, d, d, B)
		s.store(kc, k, s.pos, B)
		s.store(vc, v, s.pos, B)
		s.attend(att, q, kc, vc, B)
		matmul(proj, lw.wo, att, d, d, B)
		addTo(x, proj)
		// MLP: x += down(silu(up(n(x)))).
		for b := range B {
			rmsNorm(xn[b*d:(b+1)*d], x[b*d:(b+1)*d], lw.mlpNorm)
		}
		matmul(ff, lw.up, xn, f, d, B)
		silu(ff)
		matmul(proj, lw.down, ff, d, f, B)
		addTo(x, proj)
	}
	s.pos += B
}

// store copies n position-major rows of x ([n][Dim]) into the head-major cache c at
// positions from….
func (s *stack) store(c, x []float32, from, n int) {
	d, dh := s.p.Dim, s.p.Dim/s.p.Heads
	for h := range s.p.Heads {
		head := c[h*s.capacity*dh:]
		for b := range n {
			copy(head[(from+b)*dh:(from+b+1)*dh], x[b*d+h*dh:b*d+(h+1)*dh])
		}
	}
}

// gather appends positions [from, from+n) of the head-major cache c to dst, position-major.
func (s *stack) gather(dst, c []float32, from, n int) []float32 {
	dh := s.p.Dim / s.p.Heads
	for b := from; b < from+n; b++ {
		for h := range s.p.Heads {
			dst = append(dst, c[(h*s.capacity+b)*dh:(h*s.capacity+b+1)*dh]...)
		}
	}
	return dst
}

// attend computes causal multi-head attention for the B queries at positions s.pos…,
// whose keys and values are already in the cache. Long attention (over parallelMinWork
// multiply-adds: a long prompt's blocks, a decode step at a long context) is split by heads
// over as many goroutines as s.scores has rows (GOMAXPROCS when the stack was made), which
// all end before attend returns; each head's output is computed by the same operations
// however heads are split, so the split never changes a bit.
func (s *stack) attend(out, q, kc, vc []float32, B int) {
	heads, workers := s.p.Heads, len(s.scores)
	if B*(s.pos+B)*s.p.Dim*2 < parallelMinWork || workers < 2 {
		s.attendHeads(out, q, kc, vc, B, 0, heads, s.scores[0])
		return
	}
	chunk := (heads + workers - 1) / workers
	var wg sync.WaitGroup
	for w, lo := 1, chunk; lo < heads; w, lo = w+1, lo+chunk {
		hi := min(lo+chunk, heads)
		wg.Go(func() { s.attendHeads(out, q, kc, vc, B, lo, hi, s.scores[w]) })
	}
	s.attendHeads(out, q, kc, vc, B, 0, chunk, s.scores[0])
	wg.Wait()
}

// attendHeads is attend for heads [lo, hi), with scores as scratch. Heads are the outer
// loop: one head's keys and values, read by every query of the pass, stay in the CPU's
// cache between them (a long context's whole cache does not).
func (s *stack) attendHeads(out, q, kc, vc []float32, B, lo, hi int, scratch []float64) {
	p := s.p
	d, dh := p.Dim, p.Dim/p.Heads
	scale := 1 / math.Sqrt(float64(dh))
	for h := lo; h < hi; h++ {
		off := h * dh
		kh, vh := kc[h*s.capacity*dh:(h+1)*s.capacity*dh], vc[h*s.capacity*dh:(h+1)*s.capacity*dh]
		for b := range B {
			t := s.pos + b // the query's position: it sees keys 0…t
			scores := scratch[:t+1]
			qh := q[b*d+off : b*d+off+dh]
			best := math.Inf(-1)
			for j := range scores {
				sc := float64(float64(dot(qh, kh[j*dh:(j+1)*dh])) * scale)
				scores[j] = sc
				best = max(best, sc)
			}
			var sum float64
			for j, sc := range scores {
				e := exp(sc - best)
				scores[j] = e
				sum += e
			}
			weighValues(out[b*d+off:b*d+off+dh], vh, scores, sum)
		}
	}
}
