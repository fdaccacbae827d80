package reputation

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// decisionBudget is the goal for one routing decision over 1,000 candidates (50 µs, from
// issue 3): ordering plus selection must stay far below a request's network cost.
const decisionBudget = 50 * time.Microsecond

// BenchmarkOrderAndSelect1000 measures one routing decision over 1,000 candidates: Rank
// (Order plus scores in one pass), spare capacity, Select. It reports ns/decision, the ratio to the 50 µs budget,
// and the ratio to sorting 1,000 float64s with slices.Sort, measured first in the same run
// by the "ref-sort1000" sub-benchmark (a reference that drifts with the machine the same
// way; the ratio is omitted when a -bench filter skips it).
//
// "cached": decisions 1 ms apart, so each score ages once per DecayInterval (the common
// case under load). "age-every-decision": decisions 1 s apart, every score ages every time.
func BenchmarkOrderAndSelect1000(b *testing.B) {
	var ref float64 // ns per reference sort
	b.Run("ref-sort1000", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(3, 4))
		src := make([]float64, 1000)
		for i := range src {
			src[i] = rng.Float64()
		}
		buf := make([]float64, len(src))
		for b.Loop() {
			copy(buf, src)
			slices.Sort(buf)
		}
		ref = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	for _, bc := range []struct {
		name string
		step time.Duration
	}{
		{"cached", time.Millisecond},
		{"age-every-decision", DefaultDecayInterval},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, peers, spare := benchStore(b)
			p := s.Params()
			rng := rand.New(rand.NewPCG(1, 2))
			order := make([]string, 0, len(peers))
			cands := make([]Candidate, 0, len(peers))
			now := t0.Add(time.Minute)
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(bc.step)
				order, cands = s.Rank("m", peers, Auto, now, order[:0], cands[:0])
				for i := range cands {
					cands[i].Spare = spare[i]
				}
				if _, ok := Select(cands, p, rng); !ok {
					b.Fatalf("no candidate selected")
				}
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(ns, "ns/decision")
			b.ReportMetric(ns/float64(decisionBudget.Nanoseconds()), "x-budget")
			if ref > 0 {
				b.ReportMetric(ns/ref, "x-sort1000")
			}
		})
	}
}

// benchStore builds a store holding 1,000 peers with history: every peer measured, one in
// ten penalized but out of cooldown, one in twenty cooling, one in a hundred caught lying.
func benchStore(b *testing.B) (*Store, []string, []float64) {
	b.Helper()
	s := newStore(b)
	rng := rand.New(rand.NewPCG(5, 6))
	peers := make([]string, 1000)
	spare := make([]float64, len(peers))
	for i := range peers {
		// Peer IDs are about this long; hashing cost depends on it.
		peers[i] = fmt.Sprintf("12D3KooWPeer%040d", i)
		spare[i] = 0.1 + 0.9*rng.Float64()
	}
	for i, peer := range peers {
		now := t0
		lat := time.Duration(20+rng.IntN(400)) * time.Millisecond
		for range 5 {
			s.RecordPerformance(peer, lat, 10+90*rng.Float64(), now)
			s.Record(Target{"m", peer}, Success, now)
		}
		switch {
		case i%100 == 0:
			s.Observe(peer, VerificationFailed, now)
		case i%20 == 0:
			s.Record(Target{"m", peer}, Timeout, now.Add(59*time.Second)) // cooling at t0+1m
		case i%10 == 0:
			s.Record(Target{"m", peer}, Timeout, now)
		}
	}
	return s, peers, spare
}
