package stage

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/meshinfer/meshinfer/inference"
)

// arith is a StageBackend that computes for real, with honest deterministic arithmetic, until
// inference/synth's shards land. Layer l keeps a KV-like state: kv_l = ½·kv_l + x over the
// positions it has run, in order, and maps a position's hidden state x to
//
//	y[i] = a_l·x[i] + ¼·kv_l[i] + c·x[(i+1) mod width] + b_l[i]
//
// so every output depends on every earlier position and on its order: a position lost,
// repeated or reordered changes all that follow. Each stage of a chain holds its own
// layers' state, as a real KV cache would be held.
type arith struct {
	shape    inference.ModelShape
	capacity int // sessions it holds at once; past it OpenStage is overloaded

	// gate, when set, runs at the start of every Forward: a test's hook to hold a stage
	// (stop answering) or to learn that a step reached it.
	gate atomic.Pointer[func(ctx context.Context) error]

	mu   sync.Mutex
	open int // sessions open now
}

const arithModel = "arith"

func newArith(layers, width, capacity int) *arith {
	return &arith{capacity: capacity, shape: inference.ModelShape{
		Layers: layers, Width: width, Context: 4096, Params: int64(layers * width * 3),
		WeightBytes: int64(layers * width * 12), LayerBytes: int64(width * 12),
		KVBytesPerToken: int64(layers * width * 4),
	}}
}

func (a *arith) Shape(model string) (inference.ModelShape, error) {
	if model != arithModel {
		return inference.ModelShape{}, inference.Errorf(inference.CodeModelNotFound, "no model %q", model)
	}
	return a.shape, nil
}

func (a *arith) OpenStage(_ context.Context, model string, lo, hi, maxPositions int) (inference.StageSession, error) {
	if _, err := a.Shape(model); err != nil {
		return nil, err
	}
	if lo < 0 || hi <= lo || hi > a.shape.Layers || maxPositions < 1 {
		return nil, inference.Errorf(inference.CodeInvalidRequest, "layers [%d, %d)", lo, hi)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.open >= a.capacity {
		return nil, inference.Errorf(inference.CodeOverloaded, "holding %d sessions", a.open)
	}
	a.open++
	kv := make([][]float32, hi-lo)
	for i := range kv {
		kv[i] = make([]float32, a.shape.Width)
	}
	return &arithSession{a: a, lo: lo, maxPos: maxPositions, kv: kv}, nil
}

// sessions is the number of sessions open now.
func (a *arith) sessions() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.open
}

type arithSession struct {
	a      *arith
	lo     int
	maxPos int
	pos    int
	kv     [][]float32 // per layer
	closed atomic.Bool
}

func (s *arithSession) Forward(ctx context.Context, hidden []float32, n int) ([]float32, error) {
	if g := s.a.gate.Load(); g != nil {
		if err := (*g)(ctx); err != nil {
			return nil, err
		}
	}
	w := s.a.shape.Width
	if n < 1 || len(hidden) != n*w {
		return nil, inference.Errorf(inference.CodeInvalidRequest, "%d values for %d positions", len(hidden), n)
	}
	if s.pos+n > s.maxPos {
		return nil, inference.Errorf(inference.CodeContextOverflow, "past %d positions", s.maxPos)
	}
	out := make([]float32, len(hidden))
	x, y := make([]float32, w), make([]float32, w)
	for p := range n {
		copy(x, hidden[p*w:(p+1)*w])
		for l, kv := range s.kv {
			layerStep(s.lo+l, kv, x, y)
			x, y = y, x
		}
		copy(out[p*w:], x)
	}
	s.pos += n
	return out, nil
}

// layerStep runs layer l on one position x into y, updating its state kv: y[i] = a·x[i] +
// ¼·kv[i] + ⅛·x[(i+1) mod w] + b[i], with b[i] = ((31·l + 7·i) mod 13)/13 − ½.
func layerStep(l int, kv, x, y []float32) {
	w := len(x)
	a := 0.5 + float32(l%7)/16
	for i := range x {
		kv[i] = 0.5*kv[i] + x[i]
	}
	r := l * 31 % 13 // (31·l + 7·i) mod 13, kept as i goes
	for i := range x {
		next := x[0]
		if i+1 < w {
			next = x[i+1]
		}
		y[i] = a*x[i] + 0.25*kv[i] + 0.125*next + (float32(r)/13 - 0.5)
		if r += 7; r >= 13 {
			r -= 13
		}
	}
}

func (s *arithSession) Close() error {
	if s.closed.CompareAndSwap(false, true) {
		s.a.mu.Lock()
		s.a.open--
		s.a.mu.Unlock()
	}
	return nil
}
