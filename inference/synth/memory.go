package synth

import (
	"cmp"
	"slices"
	"strconv"
	"sync"

	"github.com/meshinfer/meshinfer/inference"
)

// The memory of a Backend's stages, kept within a budget (WithStageBudget, SetStageBudget):
// the rule is in the package doc ("Stage memory"); this file keeps the count.

// WithStageBudget bounds the memory of the layer ranges held for pipeline stages and of
// their sessions' KV caches, in bytes (see SetStageBudget). Zero, the default, is no bound.
func WithStageBudget(bytes int64) Option { return func(b *Backend) { b.mem.budget = bytes } }

// SetStageBudget sets the bound of WithStageBudget, at once: when what is held is over the
// new budget, the ranges no open session uses are unloaded, least recently used first,
// until it is not (or none is left: the pinned ones are unloaded as their sessions close,
// until what is held fits). Zero or less is no bound.
func (b *Backend) SetStageBudget(bytes int64) {
	b.mem.mu.Lock()
	b.mem.budget = bytes
	gone := b.mem.trimLocked()
	b.mem.mu.Unlock()
	unloaded(gone)
}

// StageMemory reports the bytes counted against the stage budget (the ranges held, loaded
// or loading, and the open sessions' KV caches) and the budget (0: none).
func (b *Backend) StageMemory() (held, budget int64) {
	b.mem.mu.Lock()
	defer b.mem.mu.Unlock()
	return b.mem.held, b.mem.budget
}

// stageMem counts the stages' memory against the budget. Lock order: mu, then a model's
// mu (to drop an unloaded range from its parts); never the other way.
type stageMem struct {
	mu     sync.Mutex
	budget int64                // bytes; 0 or less: no bound
	held   int64                // bytes counted: the ranges in ranges, and the open sessions' KV caches
	clock  uint64               // ticks at each open and close, for least recently used
	ranges map[heldKey]*heldRng // every range loaded or loading, counted once each
}

// heldKey names a range of a model.
type heldKey struct {
	m  *model
	pt part
}

// heldRng is a range counted against the budget.
type heldRng struct {
	bytes int64  // its weights: layers × LayerBytes
	pins  int    // open sessions of it, and opens loading or waiting for it
	used  uint64 // the clock at its last open or close
}

// reservation is what an open counted: a range's pin (unless its layers came from the
// whole model) and a KV cache. release gives both back, once.
type reservation struct {
	mem  *stageMem
	key  heldKey
	pin  bool // key's range is pinned
	kv   int64
	once sync.Once
}

// reserve counts an open of pt of m for positions positions: it pins pt's range (counting
// its weights if it is not held yet) unless fromWhole (the layers are the whole model's,
// not counted), and counts the session's KV cache. When that would pass the budget it first
// unloads ranges no session uses, least recently used first, as few as make room; when
// even all of those would not, it refuses with overloaded and changes nothing.
func (s *stageMem) reserve(m *model, pt part, positions int, fromWhole bool) (*reservation, error) {
	key := heldKey{m, pt}
	sh := m.preset.Shape()
	kv := kvBytes(sh, pt.hi-pt.lo, positions)
	s.mu.Lock()
	r := s.ranges[key]
	need := kv
	if !fromWhole && r == nil {
		need += int64(pt.hi-pt.lo) * sh.LayerBytes
	}
	var gone []heldKey
	if s.budget > 0 && s.held+need > s.budget {
		victims := s.unpinnedLocked(key)
		free, n := s.budget-s.held, 0
		for ; free < need && n < len(victims); n++ {
			free += s.ranges[victims[n]].bytes
		}
		if free < need { // every range no session uses counted, and still short
			budget := s.budget
			s.mu.Unlock()
			return nil, inference.Errorf(inference.CodeOverloaded,
				"%s and a KV cache of %d positions need %s; this node's stage memory has %s free of %s, the rest held by open sessions",
				pt.describe(m.preset), positions,
				megabytes(need), megabytes(max(free, 0)), megabytes(budget))
		}
		for _, v := range victims[:n] {
			s.dropLocked(v)
		}
		gone = victims[:n]
	}
	res := &reservation{mem: s, key: key, kv: kv}
	s.clock++
	if !fromWhole {
		if r == nil {
			r = &heldRng{bytes: need - kv}
			s.ranges[key] = r
			s.held += r.bytes
		}
		r.pins++
		r.used = s.clock
		res.pin = true
	}
	s.held += kv
	s.mu.Unlock()
	unloaded(gone)
	return res, nil
}

// release gives back what the open counted; it is idempotent. A range whose load failed and
// that nobody else waits for stops counting; then, if what is held is over the budget (it
// was lowered), the ranges no session uses are unloaded until it is not.
func (r *reservation) release() {
	r.once.Do(func() {
		s := r.mem
		s.mu.Lock()
		s.held -= r.kv
		s.clock++
		if h := s.ranges[r.key]; r.pin && h != nil {
			h.pins--
			h.used = s.clock
			if h.pins == 0 && r.key.m.loaded(r.key.pt) == nil {
				delete(s.ranges, r.key) // its load failed: nothing is held
				s.held -= h.bytes
			}
		}
		gone := s.trimLocked()
		s.mu.Unlock()
		unloaded(gone)
	})
}

// trimLocked unloads ranges no session uses, least recently used first, while what is held
// is over the budget, and returns them.
func (s *stageMem) trimLocked() []heldKey {
	if s.budget <= 0 || s.held <= s.budget {
		return nil
	}
	var gone []heldKey
	for _, v := range s.unpinnedLocked(heldKey{}) {
		if s.held <= s.budget {
			break
		}
		s.dropLocked(v)
		gone = append(gone, v)
	}
	return gone
}

// unpinnedLocked lists the ranges no session or open uses, but except, least recently used
// first. Each is loaded: a range is counted from its open, and a failed load that no open
// pins any more is dropped at once (release).
func (s *stageMem) unpinnedLocked(except heldKey) []heldKey {
	var out []heldKey
	for k, r := range s.ranges {
		if r.pins == 0 && k != except {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b heldKey) int { return cmp.Compare(s.ranges[a].used, s.ranges[b].used) })
	return out
}

// dropLocked unloads the range k, which no session uses: it leaves the model's parts (and
// Ranges) and stops counting. Its weights are garbage once no session holds them, and none
// does.
func (s *stageMem) dropLocked(k heldKey) {
	s.held -= s.ranges[k].bytes
	delete(s.ranges, k)
	k.m.mu.Lock()
	delete(k.m.parts, k.pt)
	k.m.mu.Unlock()
}

// unloaded reports the ranges unloaded to their model's onRange (the node re-announces its
// stages). Called with no lock held.
func unloaded(gone []heldKey) {
	for _, k := range gone {
		k.m.rangeChanged(k.pt)
	}
}

// kvBytes is the KV cache of a session of layers of sh's layers for positions positions, as
// newStack allocates it and placement counts it (route.StageBytes): KVBytesPerToken ×
// layers ÷ Layers per position, exactly (KVBytesPerToken is 2·Layers·Dim·4).
func kvBytes(sh inference.ModelShape, layers, positions int) int64 {
	return sh.KVBytesPerToken / int64(sh.Layers) * int64(layers) * int64(positions)
}

// megabytes writes n bytes in MB (decimal), to one decimal.
func megabytes(n int64) string {
	return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + " MB"
}
