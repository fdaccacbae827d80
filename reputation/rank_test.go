package reputation

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestRankIndicesMatchesOrder checks RankIndices, Rank and Order against the ordering rule
// computed from TargetHealth alone: cooling targets dropped, the rest stably sorted by
// penalty. Sixty penalized targets at three levels, interleaved with clean and cooling ones,
// are enough for the penalized sort to be one that does not keep equal penalties in place
// on its own.
func TestRankIndicesMatchesOrder(t *testing.T) {
	s := newStore(t)
	var cands []string
	for i := range 100 {
		c := fmt.Sprintf("p%02d", i)
		cands = append(cands, c)
		target := Target{"m", c}
		switch {
		case i%10 == 9:
			s.Record(target, Timeout, t0.Add(29*time.Second)) // cooling at +30 s
		case i%10 < 6:
			for range 1 + (i*7)%3 { // penalty 1, 2 or 3 points, out of order
				s.Record(target, Timeout, t0)
			}
		default:
			s.Observe(c, VerificationPassed, t0) // clean, with a score
		}
	}
	cands = append(cands, LocalTarget, "unknown")
	s.Record(Target{"m", LocalTarget}, Timeout, t0)
	now := t0.Add(30 * time.Second) // every cooldown but the late ones is over

	type kept struct {
		target  string
		index   int
		penalty float64
	}
	var want []kept
	for i, c := range cands {
		st, ok := s.TargetHealth(Target{"m", c}, now)
		if ok && st.Cooling {
			continue
		}
		want = append(want, kept{c, i, st.Penalty})
	}
	slices.SortStableFunc(want, func(a, b kept) int { return cmp.Compare(a.penalty, b.penalty) })

	before := s.Stats(now)
	idx, got := s.RankIndices("m", cands, Auto, now, nil, nil)
	if len(idx) != len(want) || len(got) != len(want) {
		t.Fatalf("RankIndices kept %d indices and %d candidates, want %d", len(idx), len(got), len(want))
	}
	for j, w := range want {
		if idx[j] != w.index {
			t.Fatalf("position %d: index %d (%s), want %d (%s, penalty %v)", j, idx[j], cands[idx[j]], w.index, w.target, w.penalty)
		}
		c := s.Candidates([]string{w.target}, now, nil)[0]
		st, _ := s.TargetHealth(Target{"m", w.target}, now)
		c.Penalty, c.LastFailure = w.penalty, st.LastFailure
		if got[j] != c {
			t.Fatalf("position %d (%s): candidate %+v, want %+v", j, w.target, got[j], c)
		}
	}
	after := s.Stats(now)
	if after.RoutesPenalized != before.RoutesPenalized || after.RoutesCoolingSkipped != before.RoutesCoolingSkipped+1 {
		t.Fatalf("stats went from %+v to %+v, want one cooling skip (penalized routes are the router's count)", before, after)
	}

	// Rank and Order agree, and a second call reusing the buffers gives the same again.
	order, rc := s.Rank("m", cands, Auto, now, nil, nil)
	for j, i := range idx {
		if order[j] != cands[i] {
			t.Fatalf("Rank position %d = %s, RankIndices says %s", j, order[j], cands[i])
		}
	}
	if !slices.Equal(rc, got) {
		t.Fatalf("Rank candidates differ from RankIndices'")
	}
	wantOrder(t, s.Order("m", cands, Auto, now), order...)
	idx2, got2 := s.RankIndices("m", cands, Auto, now, idx[:0], got[:0])
	if !slices.Equal(idx2, idx) || !slices.Equal(got2, got) {
		t.Fatalf("a second RankIndices into the same buffers differs")
	}
}

// TestRankIndicesAllCooling: explicit routing gets every index back in the given order,
// auto none; RankIndices appends to what the caller passes.
func TestRankIndicesAllCooling(t *testing.T) {
	s := newStore(t)
	cands := []string{"x", LocalTarget, "y"}
	for _, c := range cands {
		s.Record(Target{"m", c}, Unavailable, t0)
	}
	idx, got := s.RankIndices("m", cands, Explicit, t0, []int{7}, nil)
	if !slices.Equal(idx, []int{7, 0, 1, 2}) {
		t.Fatalf("explicit all-cooling indices = %v, want [7 0 1 2]", idx)
	}
	want := s.Candidates(cands, t0, nil)
	for i := range want {
		want[i].Cooling = true
	}
	if !slices.Equal(got, want) {
		t.Fatalf("explicit all-cooling candidates = %+v, want %+v", got, want)
	}
	if idx, got := s.RankIndices("m", cands, Auto, t0, nil, nil); len(idx) != 0 || len(got) != 0 {
		t.Fatalf("auto all-cooling = %v, %+v; want nothing", idx, got)
	}
}
