package synth

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/meshinfer/meshinfer/inference"
)

// Shape returns the shape of a served model (Preset.Shape), or a model_not_found
// *inference.Error.
func (b *Backend) Shape(model string) (inference.ModelShape, error) {
	m, err := b.lookup(model)
	if err != nil {
		return inference.ModelShape{}, err
	}
	return m.preset.Shape(), nil
}

// OpenStage returns a session of model's layers [lo, hi) for up to maxPositions positions;
// see inference.StageBackend. It checks the model (model_not_found), then the range and
// maxPositions (invalid_request unless 0 ≤ lo < hi ≤ Layers and 1 ≤ maxPositions ≤
// Context), then counts the range and the session's KV cache against the stage budget
// (WithStageBudget: it may unload ranges no session uses, or refuse with overloaded and
// change nothing), then loads layers [lo, hi), and nothing else, unless they or the whole
// model are loaded already. A range stays loaded until the budget needs its room; the
// session's KV cache, allocated here, is its own. If ctx ends during the load, it returns
// an error wrapping ctx's and the range stays cold.
func (b *Backend) OpenStage(ctx context.Context, model string, lo, hi, maxPositions int) (inference.StageSession, error) {
	m, err := b.lookup(model)
	if err != nil {
		return nil, err
	}
	p := m.preset
	if lo < 0 || lo >= hi || hi > p.Layers {
		return nil, inference.Errorf(inference.CodeInvalidRequest,
			"layers [%d, %d) are not a range of %s's %d layers", lo, hi, p.Name, p.Layers)
	}
	if maxPositions < 1 || maxPositions > p.Context {
		return nil, inference.Errorf(inference.CodeInvalidRequest,
			"a stage of %s holds 1 to %d positions, not %d", p.Name, p.Context, maxPositions)
	}
	// The whole model, once loaded, is never unloaded: its layers serve the range.
	w := m.loaded(whole(p))
	res, err := b.mem.reserve(m, layerRange(lo, hi), maxPositions, w != nil)
	if err != nil {
		return nil, err
	}
	if w == nil {
		if w, err = m.load(ctx, layerRange(lo, hi)); err != nil {
			res.release()
			return nil, err
		}
	}
	return newSession(w, lo, hi, maxPositions, res.release), nil
}

// RangeState is a layer range of a model held for pipeline stages: layers [Lo, Hi), loaded
// or still loading.
type RangeState struct {
	Model  string
	Lo, Hi int
	Loaded bool // false while the load runs
}

// Ranges lists the layer ranges that OpenStage has loaded or is loading, by model in New's
// order, then by Lo and Hi. A range whose load failed or was abandoned, or that the stage
// budget unloaded, is not listed. The head of a sharded generation and whole models are no
// stages' ranges and are never listed (Models reports whole models); nor is a range a stage
// runs from its whole model, loaded already.
func (b *Backend) Ranges() []RangeState {
	var out []RangeState
	for _, name := range b.names {
		m := b.models[name]
		from := len(out)
		m.mu.Lock()
		for pt, s := range m.parts {
			if pt.isRange() {
				out = append(out, RangeState{Model: name, Lo: pt.lo, Hi: pt.hi, Loaded: s.w != nil})
			}
		}
		m.mu.Unlock()
		slices.SortFunc(out[from:], func(a, b RangeState) int {
			if a.Lo != b.Lo {
				return a.Lo - b.Lo
			}
			return a.Hi - b.Hi
		})
	}
	return out
}

// session is a StageSession: a stack of layers with its KV cache. Forward and Close are
// serialized; a Close during a Forward waits for it to end.
type session struct {
	mu      sync.Mutex
	st      *stack // nil once closed
	desc    string // for messages
	release func() // gives back what the open counted against the stage budget; nil for Generate's
}

var _ inference.StageSession = (*session)(nil)

func newSession(w *weights, lo, hi, maxPositions int, release func()) *session {
	return &session{st: newStack(w, lo, hi, maxPositions), desc: layerRange(lo, hi).describe(w.p), release: release}
}

// Forward runs n positions through the session's layers; see inference.StageSession. It
// fails with invalid_request when the session is closed or hidden is not n × Width values
// (n ≥ 1), with context_overflow past maxPositions, and with an error wrapping ctx's when
// ctx ends. A failed Forward leaves the KV cache as it was: it can be retried.
func (s *session) Forward(ctx context.Context, hidden []float32, n int) ([]float32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	switch {
	case st == nil:
		return nil, inference.Errorf(inference.CodeInvalidRequest, "the session of %s is closed", s.desc)
	case n < 1 || len(hidden) != n*st.p.Dim:
		return nil, inference.Errorf(inference.CodeInvalidRequest,
			"%d values are not %d positions of width %d", len(hidden), n, st.p.Dim)
	case st.pos+n > st.capacity:
		return nil, inference.Errorf(inference.CodeContextOverflow,
			"%d positions after %d overflow the session of %s, which holds %d", n, st.pos, s.desc, st.capacity)
	}
	out := slices.Clone(hidden)
	pos := st.pos
	if err := st.forward(ctx, out, n); err != nil {
		st.pos = pos // forget the positions run: their cache entries are overwritten next time
		return nil, fmt.Errorf("synth: %s: %w", s.desc, err)
	}
	return out, nil
}

// Close frees the session's KV cache, and gives its memory and its range back to the stage
// budget. It is idempotent and never fails.
func (s *session) Close() error {
	s.mu.Lock()
	open := s.st != nil
	s.st = nil
	s.mu.Unlock()
	if open && s.release != nil {
		s.release()
	}
	return nil
}

var _ inference.StageMover = (*session)(nil)

// Positions is the length of the session's KV cache; 0 once closed.
func (s *session) Positions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil {
		return 0
	}
	return s.st.pos
}

// Rows returns positions [from, from+n) of the session's KV cache, over its layers only;
// see inference.StageMover. The keys and values are the very bits Forward wrote, so a
// session loaded with them computes what this one would have (TestStageMoveIdentical).
func (s *session) Rows(dst []float32, from, n int) (inference.KVRows, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	if st == nil || from < 0 || n < 1 || from+n > st.pos {
		return inference.KVRows{}, inference.Errorf(inference.CodeInvalidRequest,
			"rows [%d, %d) of the session of %s, which is closed or holds fewer", from, from+n, s.desc)
	}
	return inference.KVRows{Pos: from, N: n, Data: st.rows(dst[:0], from, n)}, nil
}

// Load appends rows of the session's layers to its KV cache; see inference.StageMover.
func (s *session) Load(r inference.KVRows) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	if st == nil {
		return inference.Errorf(inference.CodeInvalidRequest, "the session of %s is closed", s.desc)
	}
	if err := r.CheckLayers(st.p.Shape(), len(st.kc)); err != nil {
		return err
	}
	switch {
	case r.Pos != st.pos:
		return inference.Errorf(inference.CodeInvalidRequest, "KV rows at position %d, the session of %s holds %d", r.Pos, s.desc, st.pos)
	case st.pos+r.N > st.capacity:
		return inference.Errorf(inference.CodeInvalidRequest,
			"KV rows up to position %d, past the %d the session of %s holds", st.pos+r.N, st.capacity, s.desc)
	}
	st.load(r)
	return nil
}
