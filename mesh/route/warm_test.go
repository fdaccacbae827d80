package route

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// holding is c holding the ranges "lo-hi" warm.
func holding(c StageCandidate, ranges ...string) StageCandidate {
	for _, r := range ranges {
		var lo, hi int
		if _, err := fmt.Sscanf(r, "%d-%d", &lo, &hi); err != nil {
			panic(r)
		}
		c.Warm = append(c.Warm, LayerRange{lo, hi})
	}
	return c
}

// TestPlanWarm covers the warm rule: a chain of warm ranges in the fewest stages is chosen
// over any plan that loads layers, the least of such chains; chains of more stages, ranges
// over a budget, of ineligible candidates or using one candidate twice are not.
func TestPlanWarm(t *testing.T) {
	f := newFleet(t, "a", "b", "c", "d", "e")
	tests := []struct {
		name      string
		cands     []StageCandidate
		link      map[string]float64
		want      []string // stages in order, "name lo-hi*" (a warm chain); or in any order, "name layers" (a plan that loads)
		wantTotal time.Duration
	}{
		{name: "a warm chain beats a faster plan that loads",
			cands: []StageCandidate{holding(f.cand("a", 5, 2, 1), "0-5"), holding(f.cand("b", 5, 2, 1), "5-10"),
				f.cand("c", 5, 1, 1), f.cand("d", 5, 1, 1)},
			want: []string{"a 0-5*", "b 5-10*"}, wantTotal: (20 + 1 + 2 + 1) * ms},
		{name: "one warm stage that holds it all beats a faster one",
			cands: []StageCandidate{holding(f.cand("a", 10, 3, 1), "0-10"), f.cand("b", 10, 1, 1)},
			want:  []string{"a 0-10*"}, wantTotal: (30 + 2) * ms},
		{name: "the least of the warm chains",
			cands: []StageCandidate{holding(f.cand("a", 5, 2, 1), "0-5"), holding(f.cand("b", 5, 2, 1), "5-10"),
				holding(f.cand("c", 6, 1, 1), "0-5", "0-6"), holding(f.cand("d", 5, 3, 3), "6-10")},
			want: []string{"c 0-5*", "b 5-10*"}, wantTotal: (5 + 10 + 1 + 2 + 1) * ms},
		{name: "the split of the warm ranges, not the fastest-first fill",
			cands: []StageCandidate{holding(f.cand("a", 8, 1, 1), "0-2"), holding(f.cand("b", 8, 5, 1), "2-10")},
			want:  []string{"a 0-2*", "b 2-10*"}, wantTotal: (2 + 40 + 1 + 2 + 1) * ms},
		{name: "a chain of more stages than the fewest is not taken",
			cands: []StageCandidate{holding(f.cand("a", 5, 1, 1), "0-3"), holding(f.cand("b", 5, 1, 1), "3-6"),
				holding(f.cand("c", 5, 2, 1), "6-10")},
			want: []string{"a 5", "b 5"}},
		{name: "a warm range over its budget now is not used",
			cands: []StageCandidate{holding(f.cand("a", 5, 1, 1), "0-6"), holding(f.cand("b", 5, 1, 1), "6-10")},
			want:  []string{"a 5", "b 5"}},
		{name: "ranges of paused or excluded candidates are not used",
			cands: []StageCandidate{holding(pause(f.cand("a", 5, 1, 1)), "0-5"), holding(f.cand("b", 5, 2, 1), "5-10"),
				holding(score(f.cand("c", 5, 1, 1), 30), "0-5"), f.cand("d", 5, 1, 1)},
			want: []string{"b 5", "d 5"}},
		{name: "one candidate is one stage",
			cands: []StageCandidate{holding(f.cand("a", 5, 1, 1), "0-5", "5-10"), f.cand("b", 5, 2, 1)},
			want:  []string{"a 5", "b 5"}},
		{name: "ranges outside the model are ignored",
			cands: []StageCandidate{holding(f.cand("a", 5, 1, 1), "-1-3", "0-5", "5-11", "3-3"), holding(f.cand("b", 5, 1, 1), "5-10", "7-5")},
			want:  []string{"a 0-5*", "b 5-10*"}},
		{name: "a chain with a gap is none",
			cands: []StageCandidate{holding(f.cand("a", 5, 1, 1), "0-4"), holding(f.cand("b", 6, 1, 1), "5-10")},
			want:  []string{"b 6", "a 4"}},
		{name: "measured links cost the warm chain",
			cands: []StageCandidate{holding(f.cand("a", 5, 1, 3), "0-5"), holding(f.cand("b", 5, 1, 7), "5-10"),
				holding(f.cand("c", 5, 1, 1), "0-5")},
			link: map[string]float64{"a>b": 1, "c>b": 30},
			want: []string{"a 0-5*", "b 5-10*"}, wantTotal: (10 + 3 + 1 + 7) * ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var link []StageLink
			if tc.link != nil {
				link = f.links(tc.link)
			}
			got, err := PlanStages(planShape, 4, tc.cands, link)
			if err != nil {
				t.Fatal(err)
			}
			checkPlan(t, planShape, 4, tc.cands, link, got)
			var r, set []string
			for _, s := range got.Stages {
				r = append(r, fmt.Sprintf("%s %d-%d%s", f.names[s.Peer], s.Lo, s.Hi, map[bool]string{true: "*"}[s.Warm]))
				set = append(set, fmt.Sprintf("%s %d", f.names[s.Peer], s.Hi-s.Lo))
			}
			if strings.Contains(tc.want[0], "-") && !slices.Equal(r, tc.want) || !strings.Contains(tc.want[0], "-") && !sameSet(set, tc.want) {
				t.Errorf("stages %q, want %q", r, tc.want)
			}
			if tc.wantTotal != 0 && got.PerToken != tc.wantTotal {
				t.Errorf("per token %v, want %v", got.PerToken, tc.wantTotal)
			}
			for _, s := range got.Stages {
				c := tc.cands[slices.IndexFunc(tc.cands, func(c StageCandidate) bool { return c.Peer == s.Peer })]
				if s.Warm != slices.Contains(c.Warm, LayerRange{s.Lo, s.Hi}) {
					t.Errorf("stage %s %d-%d marked warm %v", f.names[s.Peer], s.Lo, s.Hi, s.Warm)
				}
			}
		})
	}
}

// TestPlanWarmQuality: on random small meshes whose candidates hold random ranges warm, the
// plan is a warm chain exactly when some chain of warm ranges, in the fewest stages, exists
// (exhaustive search), and then it is the least of them; shuffled inputs give the same
// plan. Where a candidate holds two disjoint ranges the search may miss the least (see
// warmChain): the test counts those meshes, asks for a valid plan there and for the least
// warm chain in 95 % of them (so far it was found in all of some 2,600 such meshes).
func TestPlanWarmQuality(t *testing.T) {
	rng := seeded(9)
	warmPlans, ambiguous, missed := 0, 0, 0
	for i := 0; i < 1000; {
		m := randomMesh(rng, rng.IntN(2) == 0)
		L := m.shape.Layers
		for c := range m.cands {
			for range rng.IntN(3) {
				lo := rng.IntN(L)
				m.cands[c].Warm = append(m.cands[c].Warm, LayerRange{lo, lo + 1 + rng.IntN(L-lo)})
			}
		}
		k, _, ok := exhaustive(m)
		if !ok {
			continue
		}
		got, err := PlanStages(m.shape, m.positions, m.cands, m.links)
		if err != nil {
			t.Fatalf("mesh %d: %v", i, err)
		}
		checkPlan(t, m.shape, m.positions, m.cands, m.links, got)
		if len(got.Stages) != k {
			t.Fatalf("mesh %d: %d stages, want the fewest, %d", i, len(got.Stages), k)
		}
		best, found := bestWarmChain(m, k)
		allWarm := !slices.ContainsFunc(got.Stages, func(s PlannedStage) bool { return !s.Warm })
		twice := holdsTwoDisjoint(m)
		switch {
		case twice:
			ambiguous++
			if found != allWarm || allWarm && got.PerToken != best {
				missed++
			}
			if allWarm && got.PerToken < best {
				t.Fatalf("mesh %d: a warm plan of %v beats the exhaustive best %v\n%s", i, got.PerToken, best, m)
			}
		case found && (!allWarm || got.PerToken != best):
			t.Fatalf("mesh %d: plan %+v, want the warm chain of %v\n%s", i, got, best, m)
		case !found && allWarm:
			t.Fatalf("mesh %d: a warm plan %+v where the exhaustive search finds none\n%s", i, got, m)
		}
		if allWarm {
			warmPlans++
		}
		shuffle(rng, m.cands)
		shuffle(rng, m.links)
		for _, c := range m.cands {
			shuffle(rng, c.Warm)
		}
		if again, err := PlanStages(m.shape, m.positions, m.cands, m.links); err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("mesh %d shuffled: %+v, %v; first %+v", i, again, err, got)
		}
		i++
	}
	t.Logf("1000 meshes: %d warm plans; %d with a candidate holding two disjoint ranges, of which %d not the least warm chain", warmPlans, ambiguous, missed)
	if missed > ambiguous/20 {
		t.Errorf("%d of %d meshes where a candidate holds two disjoint ranges missed the least warm chain: over 5 %%", missed, ambiguous)
	}
	if warmPlans < 100 {
		t.Errorf("%d warm plans: want 100 at least, for the test to mean something", warmPlans)
	}
}

// bestWarmChain is the least time per token of a chain of k warm ranges of distinct
// eligible candidates within their budgets covering m's layers, by trying every one.
func bestWarmChain(m mesh, k int) (time.Duration, bool) {
	positions := m.positions
	if positions <= 0 {
		positions = m.shape.Context
	}
	link := linkMap(m.links)
	best, found := time.Duration(math.MaxInt64), false
	used := map[peer.ID]bool{}
	var walk func(lo, stages int, prev *StageCandidate, total time.Duration)
	walk = func(lo, stages int, prev *StageCandidate, total time.Duration) {
		if lo == m.shape.Layers {
			if stages == k {
				best, found = min(best, total+prev.Delay), true
			}
			return
		}
		if stages == k {
			return
		}
		for i := range m.cands {
			c := &m.cands[i]
			if c.Paused || !(c.Score >= 40) || used[c.Peer] {
				continue
			}
			for _, r := range c.Warm {
				if r.Lo != lo || r.Hi > m.shape.Layers || StageBytes(m.shape, positions, r.Hi-r.Lo) > c.Budget {
					continue
				}
				d := c.Delay
				if prev != nil {
					d = testLink(link, *prev, *c)
				}
				used[c.Peer] = true
				walk(r.Hi, stages+1, c, total+d+time.Duration(r.Hi-r.Lo)*c.LayerTime)
				used[c.Peer] = false
			}
		}
	}
	walk(0, 0, nil, 0)
	return best, found
}

// holdsTwoDisjoint reports whether a candidate of m holds two disjoint warm ranges.
func holdsTwoDisjoint(m mesh) bool {
	for _, c := range m.cands {
		for i, a := range c.Warm {
			for _, b := range c.Warm[i+1:] {
				if a.Hi <= b.Lo || b.Hi <= a.Lo {
					return true
				}
			}
		}
	}
	return false
}
