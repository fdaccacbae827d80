package route

import (
	"cmp"
	"math"
	"slices"
)

// Warm plans: a chain of ranges that candidates hold loaded already (StageCandidate.Warm)
// is preferred to any plan that loads layers. The rule is in the package documentation
// ("Placement"); this file finds the chain.

// warmRange is a range item j holds warm and may run: [lo, hi) within its capacity,
// counted from the planner's first layer (planner.lo).
type warmRange struct {
	j, lo, hi int
}

// warmChain returns the warm ranges, in pipeline order, of the chain of p.stages ranges
// held warm by distinct eligible candidates, each within its budget, that covers every
// layer at the least estimate (compute and boundaries, as any plan); nil when there is none.
//
// No warm chain has fewer stages than p.stages (its candidates' capacities add up to the
// model's layers), so it looks for p.stages of them exactly, by a dynamic programme over
// (range, ranges so far) in the order of Lo: the best chain ending in a range, extended by
// each range starting where it ends. One chain is kept per state, and it is extended only
// by a candidate not on it (a peer is one stage of a chain), so in a mesh where a candidate
// holds two disjoint ranges of the model the chain found may not be the least, or may be
// missed; it is always a valid one. Ties go to ranges in the order of Lo, Hi and item.
// O(ranges × predecessors × stages²).
func (p *planner) warmChain() []warmRange {
	k, n := p.stages, p.layers
	var ranges []warmRange
	for j := range p.items {
		for _, r := range p.cands[p.items[j].c].Warm {
			// Layers are counted from p.lo here (PlanRange plans [p.lo, p.lo+n)).
			lo, hi := r.Lo-p.lo, r.Hi-p.lo
			if lo >= 0 && lo < hi && hi <= n && hi-lo <= p.items[j].cap {
				ranges = append(ranges, warmRange{j, lo, hi})
			}
		}
	}
	if len(ranges) < k {
		return nil
	}
	slices.SortFunc(ranges, func(a, b warmRange) int {
		return cmp.Or(cmp.Compare(a.lo, b.lo), cmp.Compare(a.hi, b.hi), cmp.Compare(a.j, b.j))
	})
	ranges = slices.Compact(ranges)
	if ranges[0].lo != 0 {
		return nil
	}
	// ending[l]: the ranges ending at layer l, in ranges' order.
	start := make([]int, n+2)
	for _, r := range ranges {
		start[r.hi+1]++
	}
	for l := range n + 1 {
		start[l+1] += start[l]
	}
	ending := make([]int, len(ranges))
	next := slices.Clone(start[:n+1])
	for x, r := range ranges {
		ending[next[r.hi]] = x
		next[r.hi]++
	}
	if start[n] == start[n+1] {
		return nil // none reaches the last layer
	}

	// cost[x*k+m]: the least estimate so far of a chain of m+1 ranges ending with ranges[x],
	// from the head's boundary into the first; prev the range before it there (-1: none).
	cost := make([]int64, len(ranges)*k)
	prev := make([]int32, len(ranges)*k)
	for i := range cost {
		cost[i] = math.MaxInt64
	}
	// onChain reports whether item j holds a range of the chain kept at state (x, m).
	onChain := func(x, m, j int) bool {
		for ; x >= 0; x, m = int(prev[x*k+m]), m-1 {
			if ranges[x].j == j {
				return true
			}
		}
		return false
	}
	for x, r := range ranges {
		it := &p.items[r.j]
		compute := int64(r.hi-r.lo) * it.t
		if r.lo == 0 {
			cost[x*k], prev[x*k] = it.d+compute, -1
			continue
		}
		for _, y := range ending[start[r.lo]:start[r.lo+1]] {
			for m := range k - 1 {
				c := cost[y*k+m]
				if c == math.MaxInt64 || onChain(y, m, r.j) {
					continue
				}
				if c += p.delay(ranges[y].j, r.j) + compute; c < cost[x*k+m+1] {
					cost[x*k+m+1], prev[x*k+m+1] = c, int32(y)
				}
			}
		}
	}
	last, best := -1, int64(math.MaxInt64)
	for _, x := range ending[start[n]:start[n+1]] {
		if c := cost[x*k+k-1]; c != math.MaxInt64 && c+p.items[ranges[x].j].d < best {
			last, best = x, c+p.items[ranges[x].j].d
		}
	}
	if last < 0 {
		return nil
	}
	chain := make([]warmRange, k)
	for x, m := last, k-1; m >= 0; x, m = int(prev[x*k+m]), m-1 {
		chain[m] = ranges[x]
	}
	return chain
}

// planChain writes a warm chain as a StagePlan: its ranges follow one another from the
// first layer, and each is one of its candidate's Warm, so every stage is marked Warm.
func (p *planner) planChain(chain []warmRange) StagePlan {
	order, layers := make([]int, len(chain)), make([]int, len(chain))
	for i, r := range chain {
		order[i], layers[i] = r.j, r.hi-r.lo
	}
	return p.write(order, layers)
}
