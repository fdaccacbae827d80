package node

import "sync/atomic"

// memoryBudget is the memory this node gives to mesh work: the configured budget
// (--memory-budget, else DefaultMemoryShare of the memory available at start), cut to the
// effective participation policy's max_memory_share of the memory available at start. It
// is announced as ram.budget_mb and bounds the stages' ranges and KV caches (synth's stage
// budget). Both shares are of the memory available at start, not now: a budget that
// shrank as this node's own stages filled memory would unload them in turn.
type memoryBudget struct {
	base  int64 // the configured budget, or DefaultMemoryShare of free
	free  int64 // the memory available at start (bytes); 0: unknown
	bytes atomic.Int64
}

// init sets the budget from the configured one (0 or less: the default share), the memory
// available at start and the effective policy's share.
func (m *memoryBudget) init(configured, free int64, share int) {
	m.base, m.free = configured, free
	if m.base <= 0 {
		m.base = int64(float64(free) * DefaultMemoryShare)
	}
	m.bytes.Store(m.of(share))
}

// of is the budget under the memory share share (percent; 0: no cap). When the memory
// available is unknown (the probe read none) the share caps nothing: it is a share of an
// unknown amount, and the default budget is then 0 anyway.
func (m *memoryBudget) of(share int) int64 {
	if share <= 0 || m.free <= 0 {
		return m.base
	}
	return min(m.base, m.free/100*int64(share))
}

func (m *memoryBudget) get() int64 { return m.bytes.Load() }

// set applies the memory share share and reports whether the budget changed.
func (m *memoryBudget) set(share int) (int64, bool) {
	b := m.of(share)
	return b, m.bytes.Swap(b) != b
}

// policyChanged follows a change of the effective participation policy (the owner's consent
// re-read): a new memory share changes the budget, which the stages' backend applies at once
// (unloading what no session uses and no longer fits) and the node announces.
func (n *Node) policyChanged() {
	b, changed := n.mem.set(n.part.memoryShare())
	if !changed {
		return
	}
	log.Infow("memory budget changed", "budget_mb", b>>20)
	if n.ranges != nil {
		n.ranges.SetStageBudget(b)
	}
	n.announcer.Changed()
}
