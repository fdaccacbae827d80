package reputation

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// FuzzStoreOps runs random operation sequences against a small store and checks the
// invariants of docs/reliability.md I4 after every step: scores finite and in [0, 100],
// Excluded ⇔ score < 40, each map within its cap, cooldown end monotonic within a failure
// streak, Order never returning a cooling target while a non-cooling one exists, Select
// never picking an excluded candidate, and the performance yardstick consistent with the
// entries.
//
// Input: byte 0 picks the cap (1-8) and whether ageing is per read; then each pair of bytes
// is one (operation, argument), at most maxFuzzOps of them.
func FuzzStoreOps(f *testing.F) {
	f.Add([]byte{3, 0, 0x11, 0, 0x11, 3, 20, 6, 0, 8, 1})
	f.Add([]byte{0x81, 1, 0x23, 1, 0x12, 3, 30, 2, 0x47, 7, 0, 5, 3})
	f.Add([]byte{1, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 3, 9, 6, 5, 4, 11, 0, 1, 8, 255})
	f.Add([]byte{7, 2, 0x10, 2, 0x33, 2, 0x56, 1, 0x22, 3, 35, 7, 0, 1, 0x31, 4, 9, 6, 2})
	f.Fuzz(runFuzzBody)
}

func runFuzzBody(t *testing.T, data []byte) {
	{
		if len(data) == 0 {
			return
		}
		data = data[:min(len(data), 1+2*maxFuzzOps)]
		p := DefaultParams()
		p.MaxEntries = 1 + int(data[0]&7)
		if data[0]&0x80 != 0 {
			p.DecayInterval = 0
		}
		s, err := New(p)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		peers := []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", LocalTarget}
		models := []string{"m0", "m1", "m2"}
		rng := rand.New(rand.NewPCG(1, 2))
		now := t0
		for i := 1; i+1 < len(data); i += 2 {
			op, arg := data[i], data[i+1]
			peer := peers[int(arg)%len(peers)]
			target := Target{Model: models[int(arg>>4)%len(models)], Peer: peer}
			switch op % 9 {
			case 0:
				o := Outcome(1 + int(op>>4)%6)
				before, had := s.TargetHealth(target, now)
				s.mu.Lock()
				live := had && s.healthLocked(target).streakLive(&s.p, now)
				s.mu.Unlock()
				s.Record(target, o, now)
				after, has := s.TargetHealth(target, now)
				if (o == Timeout || o == Unavailable) && live && has && after.CooldownUntil.Before(before.CooldownUntil) {
					t.Fatalf("cooldown moved back within a streak: %v → %v", before.CooldownUntil, after.CooldownUntil)
				}
			case 1:
				s.Observe(peer, Event(1+int(op>>4)%5), now)
			case 2:
				lat := time.Duration(1+int(op>>4)) * time.Millisecond << (arg % 16)
				tput := float64(arg>>4) * math.Pow(2, float64(op%7))
				s.RecordPerformance(peer, lat, tput, now)
			case 3:
				now = now.Add(time.Millisecond << (arg % 36)) // up to about a year
			case 4:
				now = now.Add(-(time.Millisecond << (arg % 12))) // a clock stepping back
			case 5:
				s.Forget(peer)
			case 6:
				cands := peers[:1+int(arg)%len(peers)]
				mode := Explicit
				if op&0x10 != 0 {
					mode = Auto
				}
				checkOrder(t, s, target.Model, cands, mode, now)
			case 7:
				s.Prune(now)
			case 8:
				cands := s.Candidates(peers, now, nil)
				for j := range cands {
					cands[j].Spare = float64((int(arg)+j)%4) / 3
				}
				if j, ok := Select(cands, p, rng); ok && (cands[j].Score < ExcludeBelow || cands[j].Spare <= 0) {
					t.Fatalf("Select picked %+v", cands[j])
				}
			}
			checkInvariants(t, s, peers, now)
		}
	}
}

// maxFuzzOps bounds one input's operations (512): every state the store can reach with a
// cap of 8 is reachable well within it, and longer inputs only slow the fuzzer down.
const maxFuzzOps = 512

func checkOrder(t *testing.T, s *Store, model string, cands []string, mode RouteMode, now time.Time) {
	t.Helper()
	got := s.Order(model, cands, mode, now)
	anyFree := false
	for _, c := range cands {
		if st, ok := s.TargetHealth(Target{model, c}, now); !ok || !st.Cooling {
			anyFree = true
		}
	}
	switch {
	case anyFree:
		for _, c := range got {
			if st, _ := s.TargetHealth(Target{model, c}, now); st.Cooling {
				t.Fatalf("Order returned cooling %s while a free candidate existed: %q", c, got)
			}
		}
	case mode == Explicit:
		if !slices.Equal(got, cands) {
			t.Fatalf("explicit all-cooling order = %q, want %q", got, cands)
		}
	default:
		if len(got) != 0 {
			t.Fatalf("auto all-cooling order = %q, want empty", got)
		}
	}
	for _, c := range got {
		if !slices.Contains(cands, c) {
			t.Fatalf("Order invented %s", c)
		}
	}
}

func checkInvariants(t *testing.T, s *Store, peers []string, now time.Time) {
	t.Helper()
	for _, peer := range peers {
		sc := s.Score(peer, now)
		if math.IsNaN(sc) || math.IsInf(sc, 0) || sc < MinScore || sc > MaxScore {
			t.Fatalf("score of %s = %v", peer, sc)
		}
		if s.Excluded(peer, now) != (sc < ExcludeBelow) {
			t.Fatalf("Excluded(%s) disagrees with score %v", peer, sc)
		}
		if f := s.Performance(peer, now); !(f > 0) || math.IsInf(f, 0) {
			t.Fatalf("performance of %s = %v", peer, f)
		}
	}
	st := s.Stats(now)
	if st.Targets > s.p.MaxEntries || st.Peers > s.p.MaxEntries {
		t.Fatalf("store over cap %d: %+v", s.p.MaxEntries, st)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var nTargets, nScores, nLat, nTput int
	for peer, e := range s.entries {
		if len(e.health) == 0 && !e.scored {
			t.Fatalf("empty entry kept for %s", peer)
		}
		nTargets += len(e.health)
		for i, a := range e.health {
			for _, b := range e.health[i+1:] {
				if a.model == b.model {
					t.Fatalf("two health records for (%s, %s)", a.model, peer)
				}
			}
		}
		if !e.scored {
			continue
		}
		nScores++
		if e.score.hasLat {
			nLat++
		}
		if e.score.hasTput {
			nTput++
		}
	}
	if nTargets != s.nTargets || nScores != s.nScores {
		t.Fatalf("counts (%d, %d), entries hold (%d, %d)", s.nTargets, s.nScores, nTargets, nScores)
	}
	if nLat != s.ref.nLat || nTput != s.ref.nTput {
		t.Fatalf("yardstick counts (%d, %d), entries (%d, %d)", s.ref.nLat, s.ref.nTput, nLat, nTput)
	}
	if e := s.entries[LocalTarget]; e != nil && e.scored {
		t.Fatalf("%s has a node score", LocalTarget)
	}
}
