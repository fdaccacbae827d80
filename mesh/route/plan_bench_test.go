package route

import (
	"cmp"
	"math"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// planBudget is the goal for one plan of a 70-layer model over 200 candidates (1 ms on 2
// cores): planning happens once per sharded request, before the first token.
const planBudget = time.Millisecond

// BenchmarkPlan measures PlanStages for a 70-layer model over 200 candidates.
//
// The model is a 70B-class model at 4 bits: 560 MB a layer, a KV cache of 280 KiB a
// position (GQA, 8 KV heads of 128, fp16), planned for 4,096 positions: 577 MB a layer
// with its share of the cache, 40 GB in all. Candidates sit in five clusters around the
// head, one-way delays 1 to about 100 ms, layer times 0.5 to 5 ms; one in ten is excluded
// and one in twenty paused. "big" nodes have 4 to 24 GB free (two or three stages),
// "small" ones 2 to 8 GB (six to eight). "no-links" gives no measured link (every boundary
// through the head: the exact programme alone); "links" gives each candidate its 16
// nearest links (3,200), measured within 20 % of the distance. "warm" adds warm ranges: the
// stages of the plan made without them, and one to three ranges of up to what it can hold on
// each of 60 other candidates (the warm chain found is that plan).
func BenchmarkPlan(b *testing.B) {
	shape := inference.ModelShape{Layers: 70, LayerBytes: 560e6, KVBytesPerToken: 70 * 2 * 8 * 128 * 2, Context: 8192}
	for _, bc := range []struct {
		name     string
		min, max float64 // GB free
		links    bool
		warm     bool
	}{
		{"big/no-links", 4, 24, false, false},
		{"big/links", 4, 24, true, false},
		{"small/no-links", 2, 8, false, false},
		{"small/links", 2, 8, true, false},
		{"big/links/warm", 4, 24, true, true},
		{"small/links/warm", 2, 8, true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cands, links := benchMesh(b, bc.min, bc.max, bc.links)
			if bc.warm {
				addWarm(b, shape, cands, links)
			}
			var stages int
			b.ReportAllocs()
			for b.Loop() {
				p, err := PlanStages(shape, 4096, cands, links)
				if err != nil {
					b.Fatal(err)
				}
				stages = len(p.Stages)
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(ns/float64(planBudget.Nanoseconds()), "x-budget")
			b.ReportMetric(float64(stages), "stages")
		})
	}
}

// addWarm gives the stages of the plan of cands their ranges warm, and 60 other candidates
// one to three random ranges each, of up to what they can hold.
func addWarm(b testing.TB, shape inference.ModelShape, cands []StageCandidate, links []StageLink) {
	p, err := PlanStages(shape, 4096, cands, links)
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range p.Stages {
		i := slices.IndexFunc(cands, func(c StageCandidate) bool { return c.Peer == s.Peer })
		cands[i].Warm = append(cands[i].Warm, LayerRange{s.Lo, s.Hi})
	}
	rng := seeded(43)
	for added := 0; added < 60; {
		c := &cands[rng.IntN(len(cands))]
		if len(c.Warm) > 0 {
			continue
		}
		most := int(min(c.Budget/StageBytes(shape, 4096, 1), int64(shape.Layers)))
		if most == 0 {
			continue
		}
		for range 1 + rng.IntN(3) {
			n := 1 + rng.IntN(most)
			lo := rng.IntN(shape.Layers - n + 1)
			c.Warm = append(c.Warm, LayerRange{lo, lo + n})
		}
		added++
	}
	if again, err := PlanStages(shape, 4096, cands, links); err != nil || !slices.EqualFunc(again.Stages, p.Stages,
		func(a, b PlannedStage) bool { return a.Peer == b.Peer && a.Lo == b.Lo && a.Hi == b.Hi && a.Warm }) {
		b.Fatalf("with the plan's ranges warm: %+v, %v; want the plan %+v, warm", again, err, p)
	}
}

func benchMesh(b testing.TB, minGB, maxGB float64, withLinks bool) ([]StageCandidate, []StageLink) {
	rng := seeded(42)
	type point struct{ x, y float64 }
	var centres []point
	for range 5 {
		centres = append(centres, point{rng.Float64()*120 - 60, rng.Float64()*120 - 60})
	}
	var at []point
	var cands []StageCandidate
	for i := range 200 {
		c := centres[rng.IntN(len(centres))]
		p := point{c.x + rng.NormFloat64()*8, c.y + rng.NormFloat64()*8}
		at = append(at, p)
		cand := StageCandidate{
			Peer:      newPeer(b),
			Budget:    int64((minGB + rng.Float64()*(maxGB-minGB)) * 1e9),
			LayerTime: time.Duration((0.5 + 4.5*rng.Float64()) * float64(time.Millisecond)),
			Delay:     time.Duration((1 + math.Hypot(p.x, p.y)) * float64(time.Millisecond)),
			Score:     40 + 60*rng.Float64(),
		}
		switch {
		case i%10 == 0:
			cand.Score = 20
		case i%20 == 1:
			cand.Paused = true
		}
		cands = append(cands, cand)
	}
	if !withLinks {
		return cands, nil
	}
	var links []StageLink
	for i := range cands {
		// The 16 nearest others.
		type near struct {
			j int
			d float64
		}
		var best []near
		for j := range cands {
			if j == i {
				continue
			}
			d := math.Hypot(at[i].x-at[j].x, at[i].y-at[j].y)
			best = append(best, near{j, d})
			for x := len(best) - 1; x > 0 && best[x].d < best[x-1].d; x-- {
				best[x], best[x-1] = best[x-1], best[x]
			}
			if len(best) > 16 {
				best = best[:16]
			}
		}
		for _, n := range best {
			d := (1 + n.d) * (0.8 + 0.4*rng.Float64())
			links = append(links, StageLink{From: cands[i].Peer, To: cands[n.j].Peer, Delay: time.Duration(d * float64(time.Millisecond))})
		}
	}
	return cands, links
}

// BenchmarkPlanMedium measures plans over meshes too big for TestPlanQuality's exhaustive
// search: 300 meshes of 10 to 24 candidates in one to five clusters, 8 to 47 layers, half
// of the links measured, that need two to four stages. Before timing, each plan is compared
// with the best of every set of that many candidates (each set split the fastest first and
// ordered every way: what is optimal for a set, as TestPlanQuality confirms on small
// meshes). It reports the share of optimal plans and the worst and mean ratios to the best.
func BenchmarkPlanMedium(b *testing.B) {
	rng := seeded(11)
	var meshes []mesh
	worst, sum, optimal := 1.0, 0.0, 0
	for len(meshes) < 300 {
		m := mediumMesh(b, rng)
		got, err := PlanStages(m.shape, m.positions, m.cands, m.links)
		if err != nil || len(got.Stages) < 2 || len(got.Stages) > 4 {
			continue
		}
		best := bestOfSets(m, len(got.Stages))
		r := float64(got.PerToken) / float64(best)
		if r < 1 {
			b.Fatalf("plan %v beats the best set %v", got.PerToken, best)
		}
		if got.PerToken == best {
			optimal++
		}
		worst, sum = max(worst, r), sum+r
		meshes = append(meshes, m)
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range meshes {
			if _, err := PlanStages(m.shape, m.positions, m.cands, m.links); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(meshes)), "ns/plan")
	b.ReportMetric(100*float64(optimal)/float64(len(meshes)), "%optimal")
	b.ReportMetric(worst, "worst-ratio")
	b.ReportMetric(sum/float64(len(meshes)), "mean-ratio")
}

// mediumMesh draws 10 to 24 candidates around the head in one to five clusters, budgets of
// up to a random share of the model's 8 to 47 layers, half of the links measured.
func mediumMesh(b testing.TB, rng *mrand.Rand) mesh {
	layers := 8 + rng.IntN(40)
	m := mesh{shape: inference.ModelShape{Layers: layers, LayerBytes: 100}}
	type point struct{ x, y float64 }
	var centres []point
	for range 1 + rng.IntN(5) {
		centres = append(centres, point{rng.Float64()*120 - 60, rng.Float64()*120 - 60})
	}
	room := 0.3 + 0.7*rng.Float64()
	var at []point
	for range 10 + rng.IntN(15) {
		c := centres[rng.IntN(len(centres))]
		p := point{c.x + rng.NormFloat64()*5, c.y + rng.NormFloat64()*5}
		at = append(at, p)
		m.cands = append(m.cands, StageCandidate{
			Peer:      seededPeer(rng),
			Budget:    int64(rng.Float64() * room * float64(layers+1) * 100),
			LayerTime: ms + time.Duration(rng.Int64N(int64(19*ms))),
			Delay:     time.Duration((1 + math.Hypot(p.x, p.y)) * float64(ms)),
			Score:     50,
		})
	}
	for i, from := range m.cands {
		for j, to := range m.cands {
			if i == j || rng.IntN(2) == 0 {
				continue
			}
			d := (1 + math.Hypot(at[i].x-at[j].x, at[i].y-at[j].y)) * (0.8 + 0.4*rng.Float64())
			m.links = append(m.links, StageLink{From: from.Peer, To: to.Peer, Delay: time.Duration(d * float64(ms))})
		}
	}
	return m
}

// bestOfSets is the least time per token of any plan of k stages over m (every candidate
// eligible, no KV cache): over every set of k candidates that can hold the layers, the
// fastest of them filled first, in every order.
func bestOfSets(m mesh, k int) time.Duration {
	link := linkMap(m.links)
	L := m.shape.Layers
	holds := make([]int, len(m.cands))
	for i, c := range m.cands {
		holds[i] = int(min(c.Budget/m.shape.LayerBytes, int64(L)))
	}
	best := time.Duration(math.MaxInt64)
	set := make([]int, 0, k)
	var choose func(from int)
	choose = func(from int) {
		if len(set) < k {
			for i := from; i < len(m.cands); i++ {
				set = append(set, i)
				choose(i + 1)
				set = set[:len(set)-1]
			}
			return
		}
		held := 0
		for _, i := range set {
			held += holds[i]
		}
		if held < L {
			return
		}
		fast := slices.Clone(set)
		slices.SortFunc(fast, func(a, b int) int { return cmp.Compare(m.cands[a].LayerTime, m.cands[b].LayerTime) })
		var compute time.Duration
		rest := L - k
		for _, i := range fast {
			n := 1 + min(holds[i]-1, rest)
			rest -= n - 1
			compute += time.Duration(n) * m.cands[i].LayerTime
		}
		order := slices.Clone(set)
		var permute func(x int)
		permute = func(x int) {
			if x == k {
				total := compute + m.cands[order[0]].Delay + m.cands[order[k-1]].Delay
				for y := 1; y < k; y++ {
					total += testLink(link, m.cands[order[y-1]], m.cands[order[y]])
				}
				best = min(best, total)
				return
			}
			for y := x; y < k; y++ {
				order[x], order[y] = order[y], order[x]
				permute(x + 1)
				order[x], order[y] = order[y], order[x]
			}
		}
		permute(0)
	}
	choose(0)
	return best
}
