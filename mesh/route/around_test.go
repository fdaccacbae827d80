package route

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/caps"
)

// TestPlanRange: a range of layers is placed by PlanStages' rule over those layers alone,
// each stage sized as a stage of the whole model.
func TestPlanRange(t *testing.T) {
	f := newFleet(t, "a", "b", "c")
	tests := []struct {
		name   string
		lo, hi int
		cands  []StageCandidate
		want   []string // stages in order; nil: wantSet
		set    []string // stages in any order (peer ID order)
		short  *ShortfallError
	}{
		{name: "a prefix on the fastest that holds it", lo: 0, hi: 3,
			cands: []StageCandidate{f.cand("a", 3, 1, 1), f.cand("b", 10, 2, 1)},
			want:  []string{"a 0-3"}},
		{name: "a middle range on a peer that could hold the model", lo: 3, hi: 5,
			cands: []StageCandidate{f.cand("a", 10, 1, 1)},
			want:  []string{"a 3-5"}},
		{name: "a suffix over the fewest stages", lo: 6, hi: 10,
			cands: []StageCandidate{f.cand("a", 2, 1, 1), f.cand("b", 2, 1, 1), f.cand("c", 1, 1, 1)},
			set:   []string{"a 2", "b 2"}},
		{name: "the whole model: PlanStages", lo: 0, hi: 10,
			cands: []StageCandidate{f.cand("a", 6, 1, 1), f.cand("b", 5, 1, 1)},
			set:   []string{"a 6", "b 4"}},
		{name: "a suffix held warm, beside a warm prefix that is not the range's", lo: 6, hi: 10,
			cands: []StageCandidate{holding(f.cand("a", 10, 1, 1), "0-4"), holding(f.cand("b", 4, 2, 1), "6-10")},
			want:  []string{"b 6-10"}},
		{name: "a range the candidates cannot hold", lo: 6, hi: 10,
			cands: []StageCandidate{f.cand("a", 1, 1, 1), f.cand("b", 2, 1, 1), pause(f.cand("c", 10, 1, 1))},
			short: &ShortfallError{Layers: 4, Positions: 4, Need: 480, Held: 3, Short: 120, Candidates: 2, Ignored: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PlanRange(planShape, 4, tc.lo, tc.hi, tc.cands, nil)
			if tc.short != nil {
				var short *ShortfallError
				if !errors.As(err, &short) || *short != *tc.short {
					t.Fatalf("error %v, want the shortfall %+v", err, *tc.short)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkRange(t, planShape, 4, tc.lo, tc.hi, tc.cands, nil, got)
			r := f.renderPlan(got)
			if tc.want != nil && !slices.Equal(r, tc.want) {
				t.Errorf("stages %q, want %q", r, tc.want)
			}
			if tc.set != nil {
				if !sameSet(f.renderSizes(got), tc.set) {
					t.Errorf("stages %q, want %q in any order", r, tc.set)
				}
			}
		})
	}
	for _, bad := range [][2]int{{-1, 2}, {2, 2}, {3, 2}, {8, 11}} {
		var short *ShortfallError
		if _, err := PlanRange(planShape, 4, bad[0], bad[1], []StageCandidate{f.cand("a", 10, 1, 1)}, nil); err == nil || errors.As(err, &short) {
			t.Errorf("layers [%d, %d): error %v, want one saying the range is not the model's", bad[0], bad[1], err)
		}
	}
	// PlanStages is the range of every layer.
	cands := []StageCandidate{f.cand("a", 4, 1, 3), f.cand("b", 4, 2, 7), f.cand("c", 4, 3, 11)}
	whole, err1 := PlanStages(planShape, 4, cands, nil)
	all, err2 := PlanRange(planShape, 4, 0, planShape.Layers, cands, nil)
	if err1 != nil || err2 != nil || !slices.Equal(whole.Stages, all.Stages) || whole.PerToken != all.PerToken {
		t.Fatalf("PlanStages %+v (%v), PlanRange of every layer %+v (%v)", whole, err1, all, err2)
	}
}

// TestPlanAround: the pinned stage keeps its peer and range, and the other peers hold the
// rest, each one part at most, never the pinned peer, by Decide's rules of candidacy.
func TestPlanAround(t *testing.T) {
	f := newFleet(t, "x", "a", "b", "c")
	// An 8-layer model of 1 MiB a layer and no KV cache: a peer with k MB holds k layers.
	sized := func(name string, budgetMB int64, rtt time.Duration) Peer {
		p := f.peer(name, caps.Model{Name: "m", State: caps.ModelWarm, Layers: 8, WeightBytes: 8 << 20})
		p.Entry.Vector.RAM.BudgetMB, p.RTT = budgetMB, rtt
		return p
	}
	other := func(p Peer) Peer { p.Entry.Vector.Models[0].WeightBytes = 16 << 20; return p }
	names := map[string]string{} // by peer ID string
	for n, id := range f.ids {
		names[id.String()] = n
	}
	pin := func(lo, hi int) inference.StageHop { return inference.StageHop{Peer: f.key("x"), Lo: lo, Hi: hi} }
	tests := []struct {
		name  string
		peers []Peer
		pin   inference.StageHop
		want  []string // stages as "name lo-hi"; nil: an error
	}{
		{"a part each side, the nearer peer first",
			[]Peer{sized("x", 8, ms), sized("a", 2, 10*ms), sized("b", 2, 20*ms)}, pin(2, 6),
			[]string{"a 0-2", "x 2-6", "b 6-8"}},
		{"a large peer taken by the small part before: the part after planned first",
			[]Peer{sized("a", 8, 10*ms), sized("b", 1, 20*ms)}, pin(1, 6),
			[]string{"b 0-1", "x 1-6", "a 6-8"}},
		{"pinned at the start: the part after only",
			[]Peer{sized("a", 2, 10*ms), sized("b", 4, 20*ms)}, pin(0, 5),
			[]string{"x 0-5", "b 5-8"}},
		{"pinned at the end: the part before only, on the one peer that holds it",
			[]Peer{sized("a", 2, 10*ms), sized("b", 4, 20*ms)}, pin(4, 8),
			[]string{"b 0-4", "x 4-8"}},
		{"the pinned peer holds no other part, whatever its budget",
			[]Peer{sized("x", 8, ms), sized("a", 3, 10*ms)}, pin(2, 6), nil},
		{"paused and stale peers hold nothing",
			[]Peer{paused(sized("a", 8, 10*ms)), stale(sized("b", 8, 10*ms)), sized("c", 2, 10*ms)}, pin(2, 6), nil},
		{"what the pinned peer announces counts for nothing",
			[]Peer{other(sized("x", 8, ms)), sized("a", 2, 10*ms), sized("b", 2, 20*ms)}, pin(2, 6),
			[]string{"a 0-2", "x 2-6", "b 6-8"}},
		{"a peer announcing another shape under the name holds nothing",
			[]Peer{sized("a", 2, 10*ms), other(sized("b", 8, 10*ms))}, pin(2, 6), nil},
		{"no other peer", []Peer{sized("x", 8, ms)}, pin(2, 6), nil},
		{"a range beyond the model's layers", []Peer{sized("a", 8, 10*ms)}, pin(6, 10), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &Snapshot{Peers: tc.peers, Rep: newStore(t)}
			before := slices.Clone(s.Peers)
			got, err := PlanAround(s, "m", tc.pin, 8, now)
			if !slices.EqualFunc(s.Peers, before, func(a, b Peer) bool { return a.Entry.Peer == b.Entry.Peer }) {
				t.Fatal("PlanAround changed the snapshot's peers")
			}
			if tc.want == nil {
				if err == nil {
					t.Fatalf("planned %v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var r []string
			for _, st := range got.Stages {
				r = append(r, fmt.Sprintf("%s %d-%d", names[st.Peer], st.Lo, st.Hi))
			}
			if got.Tier != TierMesh || got.Model != "m" || !slices.Equal(r, tc.want) {
				t.Fatalf("planned %s %q, stages %q; want the mesh, m, %q", got.Tier, got.Model, r, tc.want)
			}
		})
	}
}

// TestPlanReplacement: a leaving stage's layers go to peers outside the chain, the
// fewest that hold them; with none, an error.
func TestPlanReplacement(t *testing.T) {
	f := newFleet(t, "x", "a", "b", "c")
	sized := func(name string, budgetMB int64) Peer {
		p := f.peer(name, caps.Model{Name: "m", State: caps.ModelWarm, Layers: 8, WeightBytes: 8 << 20})
		p.Entry.Vector.RAM.BudgetMB, p.RTT = budgetMB, 10*ms
		return p
	}
	names := map[string]string{}
	for n, id := range f.ids {
		names[id.String()] = n
	}
	tests := []struct {
		name    string
		peers   []Peer
		exclude []string
		want    []string // "name lo-hi"; nil: an error
	}{
		{"one peer outside the chain holds it", []Peer{sized("x", 8), sized("a", 8), sized("b", 8)},
			[]string{"x", "a"}, []string{"b 2-6"}},
		{"split over two", []Peer{sized("x", 8), sized("b", 2), sized("c", 2)},
			[]string{"x"}, []string{"b 2-4", "c 4-6"}},
		{"the chain's peers hold nothing", []Peer{sized("x", 8), sized("a", 8)}, []string{"x", "a"}, nil},
		{"too small", []Peer{sized("x", 8), sized("b", 1)}, []string{"x"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var exclude []string
			for _, n := range tc.exclude {
				exclude = append(exclude, f.key(n))
			}
			hops, shape, err := PlanReplacement(&Snapshot{Peers: tc.peers, Rep: newStore(t)}, "m", 2, 6, exclude, 8, now)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("planned %v, want an error", hops)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, h := range hops {
				got = append(got, fmt.Sprintf("%s %d-%d", names[h.Peer], h.Lo, h.Hi))
			}
			if shape.Layers != 8 || !slices.Equal(got, tc.want) && !(len(tc.want) == 2 && slices.Equal(got, []string{"c 2-4", "b 4-6"})) {
				t.Fatalf("planned %v (shape %+v), want %v", got, shape, tc.want)
			}
		})
	}
}
