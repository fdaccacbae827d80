package reputation

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// TestRecordOutcomes covers each row of the outcome table, on a clean target and on one
// that is cooling after a failure.
func TestRecordOutcomes(t *testing.T) {
	const model, peer = "m", "peerA"
	target := Target{Model: model, Peer: peer}
	tests := []struct {
		name       string
		outcome    Outcome
		prefail    bool // the target failed once just before
		wantEntry  bool
		wantCool   bool
		wantPen    float64
		wantStreak int
		wantScore  float64
	}{
		{"success clean", Success, false, false, false, 0, 0, 50.5},
		{"success clears cooldown", Success, true, true, false, 0.5, 0, 46.5},
		{"timeout clean", Timeout, false, true, true, 1, 1, 46},
		{"timeout while cooling", Timeout, true, true, true, 2, 1, 42}, // the same incident: streak 1
		{"unavailable clean", Unavailable, false, true, true, 1, 1, 46},
		{"unavailable while cooling", Unavailable, true, true, true, 2, 1, 42},
		{"context overflow clean", ContextOverflow, false, false, false, 0, 0, 50},
		{"context overflow cooling", ContextOverflow, true, true, true, 1, 1, 46},
		{"rejected clean", Rejected, false, false, false, 0, 0, 50},
		{"rejected cooling", Rejected, true, true, true, 1, 1, 46},
		{"client disconnected clean", ClientDisconnected, false, false, false, 0, 0, 50},
		{"client disconnected cooling", ClientDisconnected, true, true, true, 1, 1, 46},
		{"unknown outcome", Outcome(200), false, false, false, 0, 0, 50},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			now := t0
			if tc.prefail {
				s.Record(target, Timeout, now) // cooling for 2 s from now
			}
			s.Record(target, tc.outcome, now)
			st, ok := s.TargetHealth(target, now)
			if ok != tc.wantEntry {
				t.Fatalf("entry present = %v, want %v", ok, tc.wantEntry)
			}
			if st.Cooling != tc.wantCool {
				t.Errorf("cooling = %v, want %v", st.Cooling, tc.wantCool)
			}
			if !near(st.Penalty, tc.wantPen) {
				t.Errorf("penalty = %v, want %v", st.Penalty, tc.wantPen)
			}
			if st.Streak != tc.wantStreak {
				t.Errorf("streak = %d, want %d", st.Streak, tc.wantStreak)
			}
			if got := s.Score(peer, now); !near(got, tc.wantScore) {
				t.Errorf("score = %v, want %v", got, tc.wantScore)
			}
		})
	}
}

func TestCooldownExponentialCapped(t *testing.T) {
	s := newStore(t)
	target := Target{Model: "m", Peer: "p"}
	now := t0
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i, w := range want {
		s.Record(target, Timeout, now)
		st, _ := s.TargetHealth(target, now)
		if got := st.CooldownUntil.Sub(now); got != w {
			t.Fatalf("failure %d: cooldown %v, want %v", i+1, got, w)
		}
		now = st.CooldownUntil // retry as soon as the cooldown ends
	}
	// A quiet spell longer than StreakReset starts a fresh streak.
	now = now.Add(DefaultStreakReset + time.Second)
	s.Record(target, Unavailable, now)
	st, _ := s.TargetHealth(target, now)
	if st.Streak != 1 || st.CooldownUntil.Sub(now) != DefaultCooldownBase {
		t.Fatalf("after quiet spell: streak %d cooldown %v, want 1 and %v", st.Streak, st.CooldownUntil.Sub(now), DefaultCooldownBase)
	}
}

// A peer that fails every attempt it held at once (frozen, gone) cools down as after one
// failure: the burst is one incident. The streak grows with the next failure after the
// cooldown ended.
func TestFailuresWhileCoolingAreOneIncident(t *testing.T) {
	s := newStore(t)
	target := Target{Model: "m", Peer: "p"}
	for i := range 8 {
		s.Record(target, Timeout, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	st, _ := s.TargetHealth(target, t0)
	if st.Streak != 1 || st.CooldownUntil != t0.Add(DefaultCooldownBase) {
		t.Fatalf("after 8 failures within 0.8 s: streak %d, cooling until %v; want 1 and t0+%v", st.Streak, st.CooldownUntil.Sub(t0), DefaultCooldownBase)
	}
	if st.Penalty <= 1 {
		t.Errorf("penalty %v: every failure still counts in the penalty", st.Penalty)
	}
	then := st.CooldownUntil
	s.Record(target, Unavailable, then)
	st, _ = s.TargetHealth(target, then)
	if st.Streak != 2 || st.CooldownUntil != then.Add(2*DefaultCooldownBase) {
		t.Fatalf("failing again after the cooldown: streak %d, cooling for %v; want 2 and %v", st.Streak, st.CooldownUntil.Sub(then), 2*DefaultCooldownBase)
	}
}

func TestCooldownNeverShortensWhenClockStepsBack(t *testing.T) {
	s := newStore(t)
	target := Target{Model: "m", Peer: "p"}
	s.Record(target, Timeout, t0)
	s.Record(target, Timeout, t0.Add(3*time.Second)) // until t0+7s
	s.Record(target, Timeout, t0.Add(-time.Minute))  // before t0+7s: cooling, the same incident
	st, _ := s.TargetHealth(target, t0)
	if want := t0.Add(7 * time.Second); st.CooldownUntil.Before(want) {
		t.Fatalf("cooldown until %v moved back before %v", st.CooldownUntil, want)
	}
}

func TestOrderDropsCoolingKeepsStableOrder(t *testing.T) {
	s := newStore(t)
	cands := []string{"a", "b", "c", "d"}
	s.Record(Target{"m", "b"}, Timeout, t0)
	wantOrder(t, s.Order("m", cands, Auto, t0), "a", "c", "d")
	wantOrder(t, s.Order("m", cands, Explicit, t0), "a", "c", "d")
	// Another model is unaffected.
	wantOrder(t, s.Order("other", cands, Auto, t0), "a", "b", "c", "d")
	if got := s.Stats(t0); got.RoutesCoolingSkipped != 2 || got.RoutesPenalized != 0 {
		t.Fatalf("stats %+v, want 2 cooling skips and 0 penalized routes", got)
	}
	// The input is never modified.
	wantOrder(t, cands, "a", "b", "c", "d")
}

func TestResidualPenaltyOrderingAfterCooldown(t *testing.T) {
	s := newStore(t)
	cands := []string{"a", "b", "c"}
	now := t0
	s.Record(Target{"m", "a"}, Timeout, now)
	s.Record(Target{"m", "b"}, Timeout, now)
	s.Record(Target{"m", "b"}, Timeout, now.Add(2*time.Second))
	now = now.Add(10 * time.Second) // both out of cooldown; b carries twice a's penalty
	wantOrder(t, s.Order("m", cands, Auto, now), "c", "a", "b")
	st := s.Stats(now)
	if st.RoutesPenalized != 0 || st.PenalizedTargets != 2 || st.CoolingTargets != 0 {
		t.Fatalf("stats %+v, want 0 penalized routes (the router counts them), 2 penalized targets, 0 cooling", st)
	}
	wantOrder(t, s.Order("m", []string{"c", "a", "b"}, Auto, now), "c", "a", "b")
	// a proves itself: one success halves its penalty, it moves ahead of b but stays
	// behind c; four successes clear it and the given order is back.
	s.Record(Target{"m", "a"}, Success, now)
	wantOrder(t, s.Order("m", cands, Auto, now), "c", "a", "b")
	for range 3 {
		s.Record(Target{"m", "a"}, Success, now)
	}
	if _, ok := s.TargetHealth(Target{"m", "a"}, now); ok {
		t.Fatalf("a still has an entry after its penalty cleared")
	}
	wantOrder(t, s.Order("m", cands, Auto, now), "a", "c", "b")
}

func TestAllCoolingExplicitVersusAuto(t *testing.T) {
	s := newStore(t)
	cands := []string{"x", LocalTarget, "y"}
	for _, c := range cands {
		s.Record(Target{"m", c}, Unavailable, t0)
	}
	wantOrder(t, s.Order("m", cands, Explicit, t0), "x", LocalTarget, "y")
	wantOrder(t, s.Order("m", cands, Auto, t0))
	if got := s.Stats(t0).RoutesAllCooling; got != 2 {
		t.Fatalf("routes_all_cooling = %d, want 2", got)
	}
	// Once one cooldown ends, both modes get only that one.
	s.Record(Target{"m", "x"}, Unavailable, t0.Add(2*time.Second)) // x fails again after its cooldown: 4 s more
	later := t0.Add(3 * time.Second)
	wantOrder(t, s.Order("m", cands, Explicit, later), LocalTarget, "y")
	wantOrder(t, s.Order("m", cands, Auto, later), LocalTarget, "y")
	// Empty input stays empty and counts nothing.
	wantOrder(t, s.Order("m", nil, Explicit, t0))
}

func TestLocalTargetHasHealthButNoScore(t *testing.T) {
	s := newStore(t)
	s.Record(Target{"m", LocalTarget}, Timeout, t0)
	if st, ok := s.TargetHealth(Target{"m", LocalTarget}, t0); !ok || !st.Cooling {
		t.Fatalf("local target health = %+v, %v; want cooling", st, ok)
	}
	if got := s.Stats(t0).Peers; got != 0 {
		t.Fatalf("local target created %d node-score entries", got)
	}
}

func TestTargetRecoveryByAgeing(t *testing.T) {
	s := newStore(t)
	cands := []string{"a", "b"}
	for i := range 5 {
		s.Record(Target{"m", "a"}, Timeout, t0.Add(time.Duration(i)*10*time.Second))
	}
	now := t0.Add(time.Minute)
	wantOrder(t, s.Order("m", cands, Auto, now), "b", "a")
	// Never retried, a's penalty of 5 halves every 5 min: under 0.1 after six half-lives.
	now = now.Add(30 * time.Minute)
	wantOrder(t, s.Order("m", cands, Auto, now), "a", "b")
	if st := s.Stats(now); st.PenalizedTargets != 0 {
		t.Fatalf("penalized_targets = %d after ageing, want 0", st.PenalizedTargets)
	}
	if n := s.Prune(now); n != 1 {
		t.Fatalf("Prune removed %d entries, want the 1 idle target", n)
	}
	if st := s.Stats(now); st.Targets != 0 {
		t.Fatalf("targets = %d after prune, want 0", st.Targets)
	}
}

// TestThreePeerScenario is the scenario: A, first in route order, fails with
// unavailable, is avoided on the next request, and returns to normal routing once a
// success clears its cooldown and it has proved itself.
func TestThreePeerScenario(t *testing.T) {
	s := newStore(t)
	const model = "llama"
	route := []string{"A", "B", "C"}
	now := t0

	first := s.Order(model, route, Explicit, now)
	wantOrder(t, first, "A", "B", "C")
	s.Record(Target{model, first[0]}, Unavailable, now)

	now = now.Add(100 * time.Millisecond)
	next := s.Order(model, route, Explicit, now)
	wantOrder(t, next, "B", "C")
	s.Record(Target{model, next[0]}, Success, now)

	// A request already in flight on A completes: the success clears A's cooldown. A is
	// routable again, behind the clean peers while its residual penalty lasts.
	s.Record(Target{model, "A"}, Success, now)
	if st, _ := s.TargetHealth(Target{model, "A"}, now); st.Cooling {
		t.Fatalf("A still cooling after a success")
	}
	wantOrder(t, s.Order(model, route, Explicit, now), "B", "C", "A")
	for range 3 {
		s.Record(Target{model, "A"}, Success, now)
	}
	wantOrder(t, s.Order(model, route, Explicit, now), "A", "B", "C")
	if st := s.Stats(now); st.PenalizedTargets != 0 || st.CoolingTargets != 0 {
		t.Fatalf("stats %+v, want no penalized or cooling targets", st)
	}
	if s.Excluded("A", now) {
		t.Fatalf("A excluded by one unavailable")
	}
}

func TestTargetStoreBounded(t *testing.T) {
	const maxEntries = 8
	s := newStore(t, func(p *Params) { p.MaxEntries = maxEntries })
	now := t0
	for i := range 100 {
		s.Record(Target{"m", string(rune('a'+i%26)) + string(rune('a'+i/26))}, Timeout, now)
		now = now.Add(time.Millisecond)
		if st := s.Stats(now); st.Targets > maxEntries {
			t.Fatalf("after %d inserts: %d targets, cap %d", i+1, st.Targets, maxEntries)
		}
	}
	if st := s.Stats(now); st.EvictedTargets == 0 {
		t.Fatalf("no evictions recorded past the cap")
	}
}

func TestTargetEvictionPrefersLeastUseful(t *testing.T) {
	const maxEntries = 4
	s := newStore(t, func(p *Params) { p.MaxEntries = maxEntries })
	// "old" fails first and its cooldown ends; the rest fail later and are still cooling.
	s.Record(Target{"m", "old"}, Timeout, t0)
	now := t0.Add(5 * time.Second)
	for _, p := range []string{"c1", "c2", "c3"} {
		s.Record(Target{"m", p}, Timeout, now)
	}
	s.Record(Target{"m", "new"}, Timeout, now)
	if _, ok := s.TargetHealth(Target{"m", "old"}, now); ok {
		t.Fatalf("the non-cooling entry survived while cooling ones were at risk")
	}
	for _, p := range []string{"c1", "c2", "c3", "new"} {
		if _, ok := s.TargetHealth(Target{"m", p}, now); !ok {
			t.Fatalf("cooling entry %s was evicted", p)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	s := newStore(t, func(p *Params) { p.MaxEntries = 64 })
	var wg sync.WaitGroup
	cands := []string{"a", "b", "c", "d"}
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				peer := cands[(g+i)%len(cands)]
				s.Record(Target{"m", peer}, Outcome(1+i%6), now)
				s.Observe(peer, Event(1+i%5), now)
				s.RecordPerformance(peer, time.Duration(1+i%7)*time.Millisecond, float64(10+g), now)
				_ = s.Order("m", cands, Auto, now)
				_ = s.Score(peer, now)
				_ = s.Candidates(cands, now, nil)
				_ = s.Stats(now)
				if i%100 == 0 {
					s.Prune(now)
					s.Forget(peer)
				}
			}
		})
	}
	wg.Wait()
}

func TestRankMatchesOrderAndCandidates(t *testing.T) {
	s := newStore(t)
	cands := []string{"a", "b", "c", LocalTarget, "d"}
	now := t0
	s.Record(Target{"m", "a"}, Timeout, now)                    // penalized, later out of cooldown
	s.Record(Target{"m", "c"}, Timeout, now.Add(9*time.Second)) // cooling at +10 s
	s.Record(Target{"m", LocalTarget}, Timeout, now)            // penalized
	s.Record(Target{"m", LocalTarget}, Timeout, now.Add(2*time.Second))
	s.Observe("d", VerificationPassed, now)
	s.Observe("b", MalformedFrame, now)
	now = now.Add(10 * time.Second)
	order, got := s.Rank("m", cands, Auto, now, nil, nil)
	wantOrder(t, order, "b", "d", "a", LocalTarget)
	want := s.Candidates(order, now, nil)
	if len(got) != len(want) {
		t.Fatalf("Rank gave %d candidates for %d targets", len(got), len(order))
	}
	for i := range want {
		st, _ := s.TargetHealth(Target{"m", order[i]}, now)
		want[i].Penalty, want[i].LastFailure = st.Penalty, st.LastFailure
		if got[i] != want[i] {
			t.Fatalf("candidate %d (%s) = %+v, want %+v", i, order[i], got[i], want[i])
		}
	}
	// All cooling: explicit returns every candidate with its score, auto none.
	for _, c := range []string{"b", "d", "a", LocalTarget} {
		s.Record(Target{"m", c}, Unavailable, now)
	}
	order, got = s.Rank("m", cands, Explicit, now, nil, nil)
	wantOrder(t, order, cands...)
	want = s.Candidates(cands, now, nil)
	for i := range want {
		want[i].Cooling = true
	}
	if !slices.Equal(got, want) {
		t.Fatalf("explicit all-cooling candidates = %+v, want %+v", got, want)
	}
	order, got = s.Rank("m", cands, Auto, now, nil, nil)
	if len(order) != 0 || len(got) != 0 {
		t.Fatalf("auto all-cooling = %q, %+v; want nothing", order, got)
	}
}
