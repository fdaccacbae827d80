package synth

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
)

// samplerStream is the PCG stream selector of the sampling generator, fixed: "sampling".
const samplerStream = 0x73616d706c696e67

// sampler picks the next token from the logits. At temperature 0 it is greedy (argmax,
// lowest id on ties) and uses no randomness, so seed and top_p do not matter. Otherwise it
// draws exactly one uniform number per token from a PCG seeded by the request's seed, so a
// completion with a smaller max_tokens is a prefix of one with a larger budget.
type sampler struct {
	temp, topP float64
	allowed    []bool // tokenizer.sampleable
	rng        *rand.Rand
	probs      []float64
	order      []int32
}

func newSampler(temp, topP float64, seed int64, allowed []bool) *sampler {
	s := &sampler{temp: temp, topP: topP, allowed: allowed}
	if temp > 0 {
		s.rng = rand.New(rand.NewPCG(uint64(seed), samplerStream))
		s.probs = make([]float64, len(allowed))
	}
	return s
}

func (s *sampler) pick(logits []float32) int {
	if s.temp <= 0 {
		return s.argmax(logits)
	}
	maxL := math.Inf(-1)
	for id, l := range logits {
		if s.allowed[id] {
			maxL = max(maxL, float64(l))
		}
	}
	var total float64
	for id, l := range logits {
		s.probs[id] = 0
		if s.allowed[id] {
			s.probs[id] = exp((float64(l) - maxL) / s.temp)
			total += s.probs[id]
		}
	}
	u := s.rng.Float64()
	if s.topP >= 1 {
		return s.walk(u*total, func(yield func(int) bool) {
			for id := range s.probs {
				if !yield(id) {
					return
				}
			}
		})
	}
	// Nucleus: the most probable tokens (ties by lower id, a total order, so the sort is
	// deterministic) whose mass first reaches top_p of the total.
	s.order = s.order[:0]
	for id, pr := range s.probs {
		if pr > 0 {
			s.order = append(s.order, int32(id))
		}
	}
	slices.SortFunc(s.order, func(a, b int32) int {
		if c := cmp.Compare(s.probs[b], s.probs[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	var mass float64
	n := 0
	for n < len(s.order) {
		mass += s.probs[s.order[n]]
		n++
		if mass >= s.topP*total {
			break
		}
	}
	nucleus := s.order[:n]
	return s.walk(u*mass, func(yield func(int) bool) {
		for _, id := range nucleus {
			if !yield(int(id)) {
				return
			}
		}
	})
}

// walk returns the first id of seq at which the running sum of probabilities exceeds
// target, or the last id with a non-zero probability when rounding leaves it short.
func (s *sampler) walk(target float64, seq func(func(int) bool)) int {
	var cum float64
	last := -1
	for id := range seq {
		if s.probs[id] == 0 {
			continue
		}
		last = id
		cum += s.probs[id]
		if cum > target {
			return id
		}
	}
	return last
}

// skip stands for a pick whose token is known already (a replayed token): it draws the
// uniform number that pick would have, so the picks after it are those of the run it
// continues.
func (s *sampler) skip() {
	if s.temp > 0 {
		s.rng.Float64()
	}
}

func (s *sampler) argmax(logits []float32) int {
	best, bestL := -1, float32(math.Inf(-1))
	for id, l := range logits {
		if s.allowed[id] && (best < 0 || l > bestL) {
			best, bestL = id, l
		}
	}
	return best
}
