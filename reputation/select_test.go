package reputation

import (
	"math"
	"math/rand/v2"
	"testing"
)

const draws = 10_000

// shares runs draws seeded selections and returns each candidate's share of picks.
func shares(t *testing.T, cands []Candidate, p Params, seed uint64) []float64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	counts := make([]int, len(cands))
	for range draws {
		i, ok := Select(cands, p, rng)
		if !ok {
			t.Fatalf("Select found no eligible candidate in %+v", cands)
		}
		counts[i]++
	}
	out := make([]float64, len(cands))
	for i, c := range counts {
		out[i] = float64(c) / draws
	}
	return out
}

func TestSelectThreeEqualPeers(t *testing.T) {
	cands := []Candidate{{Score: 70, Performance: 1, Spare: 1}, {Score: 70, Performance: 1, Spare: 1}, {Score: 70, Performance: 1, Spare: 1}}
	for seed := range uint64(5) {
		for i, sh := range shares(t, cands, DefaultParams(), seed) {
			if math.Abs(sh-1.0/3) > 0.03 {
				t.Fatalf("seed %d: peer %d share %.4f, want 0.333 ± 0.03", seed, i, sh)
			}
		}
	}
}

func TestSelectTwicePerformance(t *testing.T) {
	p := DefaultParams()
	cands := []Candidate{{Score: 70, Performance: 2, Spare: 1}, {Score: 70, Performance: 1, Spare: 1}, {Score: 70, Performance: 1, Spare: 1}}
	sh := shares(t, cands, p, 1)
	// Expected: ε/3 + (1-ε)·2/4 ≈ 0.492 against ε/3 + (1-ε)/4 ≈ 0.254.
	if sh[0] < 1.5*sh[1] || sh[0] < 1.5*sh[2] {
		t.Fatalf("shares %.4f: the faster peer does not clearly get more", sh)
	}
	for i := 1; i < 3; i++ {
		if sh[i] < p.Exploration/3 {
			t.Fatalf("shares %.4f: peer %d below its exploration share %.4f", sh, i, p.Exploration/3)
		}
	}
}

func TestSelectKeepsExplorationShare(t *testing.T) {
	p := DefaultParams()
	// One peer dwarfs the others' weight: they live on exploration alone.
	cands := []Candidate{{Score: 100, Performance: maxPerformanceFactor, Spare: 1}, {Score: 40, Performance: 1e-9, Spare: 1}, {Score: 40, Performance: 1e-9, Spare: 1}}
	sh := shares(t, cands, p, 2)
	want := p.Exploration / 3
	for i := 1; i < 3; i++ {
		if math.Abs(sh[i]-want) > 0.01 {
			t.Fatalf("shares %.4f: peer %d got %.4f, want its exploration share %.4f ± 0.01", sh, i, sh[i], want)
		}
	}
}

func TestSelectNeverPicksExcluded(t *testing.T) {
	cands := []Candidate{
		{Score: 39, Performance: maxPerformanceFactor, Spare: 1},
		{Score: 45, Performance: 1, Spare: 1},
		{Score: 39.999, Performance: 1, Spare: 1},
		{Score: math.NaN(), Performance: 1, Spare: 1},
		{Score: 90, Performance: 1, Spare: 0},          // full: not eligible
		{Score: 90, Performance: 1, Spare: math.NaN()}, // unknown spare must be passed as 1, NaN is not eligible
	}
	sh := shares(t, cands, DefaultParams(), 3)
	if sh[1] != 1 {
		t.Fatalf("shares %.4f: only the peer at 45 is eligible", sh)
	}
}

func TestSelectProbationShare(t *testing.T) {
	cands := []Candidate{{Score: 45, Performance: 1, Spare: 1}, {Score: 90, Performance: 1, Spare: 1}}
	sh := shares(t, cands, DefaultParams(), 4)
	if sh[0] >= sh[1]/2 {
		t.Fatalf("peer at 45 got %.4f, peer at 90 got %.4f: want less than half", sh[0], sh[1])
	}
	if sh[0] < DefaultExploration/2 {
		t.Fatalf("peer at 45 got %.4f, below its exploration share", sh[0])
	}
}

func TestSelectSpareCapacityWeighs(t *testing.T) {
	cands := []Candidate{{Score: 90, Performance: 1, Spare: 0.1}, {Score: 90, Performance: 1, Spare: 1}}
	sh := shares(t, cands, DefaultParams(), 5)
	if sh[0] > 0.15 {
		t.Fatalf("nearly full peer got %.4f of picks", sh[0])
	}
}

func TestSelectZeroWeightsIsUniform(t *testing.T) {
	cands := []Candidate{{Score: 70, Performance: 0, Spare: 1}, {Score: 70, Performance: math.NaN(), Spare: 1}, {Score: 70, Performance: -1, Spare: 1}}
	for i, sh := range shares(t, cands, DefaultParams(), 6) {
		if math.Abs(sh-1.0/3) > 0.03 {
			t.Fatalf("peer %d share %.4f, want uniform", i, sh)
		}
	}
}

func TestSelectDeterministicAndEdgeCases(t *testing.T) {
	cands := []Candidate{{Score: 60, Performance: 1, Spare: 1}, {Score: 80, Performance: 1.5, Spare: 0.5}, {Score: 95, Performance: 0.7, Spare: 1}, {Score: 41, Performance: 3, Spare: 1}}
	p := DefaultParams()
	a := rand.New(rand.NewPCG(7, 8))
	b := rand.New(rand.NewPCG(7, 8))
	for range 1000 {
		i, _ := Select(cands, p, a)
		j, _ := Select(cands, p, b)
		if i != j {
			t.Fatalf("same seed, different picks: %d vs %d", i, j)
		}
	}
	if i, ok := Select(nil, p, a); ok || i != -1 {
		t.Fatalf("Select(nil) = %d, %v; want -1, false", i, ok)
	}
	if _, ok := Select([]Candidate{{Score: 39, Performance: 1, Spare: 1}}, p, a); ok {
		t.Fatalf("Select picked from an all-excluded set")
	}
	if i, ok := Select(cands, p, nil); !ok || i < 0 || i >= len(cands) {
		t.Fatalf("Select with nil rng = %d, %v", i, ok)
	}
	// Unvalidated exploration falls back to the default instead of misbehaving.
	p.Exploration = math.NaN()
	if _, ok := Select(cands, p, a); !ok {
		t.Fatalf("Select failed with NaN exploration")
	}
	// No exploration: excluded-by-weight candidates are never picked.
	p.Exploration = 0
	sh := shares(t, []Candidate{{Score: 70, Performance: 0, Spare: 1}, {Score: 70, Performance: 1, Spare: 1}}, p, 9)
	if sh[0] != 0 {
		t.Fatalf("zero-weight candidate picked %.4f with no exploration", sh[0])
	}
}
