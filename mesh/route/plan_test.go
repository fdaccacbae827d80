package route

import (
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
)

// planShape is a 10-layer model whose stages need 120 bytes a layer for 4 positions: 100 of
// weights and 20 of KV cache (50 bytes a position across the 10 layers).
var planShape = inference.ModelShape{Layers: 10, LayerBytes: 100, KVBytesPerToken: 50, Context: 4}

const ms = time.Millisecond

// cand is a candidate named name in f with room for layers of planShape's layers, a layer
// time of t ms and a one-way delay to the head of d ms, neutral score.
func (f *fleet) cand(name string, layers int, t, d float64) StageCandidate {
	return StageCandidate{
		Peer:      f.id(name),
		Budget:    int64(layers) * 120,
		LayerTime: time.Duration(t * float64(ms)),
		Delay:     time.Duration(d * float64(ms)),
		Score:     50,
	}
}

// renderPlan writes a plan's stages as "name lo-hi".
func (f *fleet) renderPlan(p StagePlan) []string {
	out := []string{}
	for _, s := range p.Stages {
		out = append(out, fmt.Sprintf("%s %d-%d", f.names[s.Peer], s.Lo, s.Hi))
	}
	return out
}

// renderSizes writes a plan's stages as "name layers", to compare in any order.
func (f *fleet) renderSizes(p StagePlan) []string {
	var out []string
	for _, s := range p.Stages {
		out = append(out, fmt.Sprintf("%s %d", f.names[s.Peer], s.Hi-s.Lo))
	}
	return out
}

// links are links between named peers: links{"a>b": 2} measured a→b at 2 ms.
func (f *fleet) links(m map[string]float64) []StageLink {
	var out []StageLink
	for k, d := range m {
		from, to, _ := strings.Cut(k, ">")
		out = append(out, StageLink{From: f.id(from), To: f.id(to), Delay: time.Duration(d * float64(ms))})
	}
	return out
}

func score(c StageCandidate, s float64) StageCandidate { c.Score = s; return c }
func pause(c StageCandidate) StageCandidate            { c.Paused = true; return c }

// TestPlanStages covers the rule: fewest stages, then the least time per token, within
// budgets, eligible candidates only.
func TestPlanStages(t *testing.T) {
	f := newFleet(t, "a", "b", "c", "d", "e")
	tests := []struct {
		name      string
		cands     []StageCandidate
		link      map[string]float64
		worse     bool          // each link also given 40 ms slower, before and after
		want      []string      // stages, in order; nil: any order of wantSet
		wantSet   []string      // stages in any order, when the order is peer ID order
		wantTotal time.Duration // PerToken; 0: not checked
	}{
		{name: "fits whole on one",
			cands: []StageCandidate{f.cand("a", 10, 1, 5), f.cand("b", 9, 0.5, 1)},
			want:  []string{"a 0-10"}, wantTotal: 20 * ms},
		{name: "one stage beats two faster ones",
			cands: []StageCandidate{f.cand("a", 10, 10, 5), f.cand("b", 5, 1, 1), f.cand("c", 5, 1, 1)},
			want:  []string{"a 0-10"}, wantTotal: 110 * ms},
		{name: "the fastest of those that fit whole",
			cands: []StageCandidate{f.cand("a", 10, 2, 5), f.cand("b", 12, 1, 5), f.cand("c", 10, 3, 0)},
			want:  []string{"b 0-10"}, wantTotal: 20 * ms},
		{name: "the nearest of those that fit whole",
			cands: []StageCandidate{f.cand("a", 10, 1, 30), f.cand("b", 12, 1, 5), f.cand("c", 10, 1, 6)},
			want:  []string{"b 0-10"}, wantTotal: 20 * ms},
		{name: "needs 2",
			cands:   []StageCandidate{f.cand("a", 6, 1, 1), f.cand("b", 5, 1, 1), f.cand("c", 2, 1, 1)},
			wantSet: []string{"a 6", "b 4"}, wantTotal: 14 * ms},
		{name: "needs 3",
			cands:   []StageCandidate{f.cand("a", 4, 1, 1), f.cand("b", 4, 2, 1), f.cand("c", 4, 3, 1), f.cand("d", 3, 1, 1)},
			wantSet: []string{"a 4", "d 3", "b 3"}, wantTotal: (4 + 3 + 6 + 6) * ms},
		{name: "the faster node gets more layers",
			cands:   []StageCandidate{f.cand("a", 8, 2, 1), f.cand("b", 8, 1, 1)},
			wantSet: []string{"b 8", "a 2"}, wantTotal: (8 + 4 + 4) * ms},
		{name: "a full faster node, the rest to the slower",
			cands:   []StageCandidate{f.cand("a", 9, 3, 1), f.cand("b", 4, 1, 1)},
			wantSet: []string{"b 4", "a 6"}, wantTotal: (4 + 18 + 4) * ms},
		{name: "near stages beat a far one of the same speed",
			cands:   []StageCandidate{f.cand("a", 6, 1, 1), f.cand("b", 6, 1, 50), f.cand("c", 6, 1, 2)},
			wantSet: []string{"a 6", "c 4"}, wantTotal: (10 + 6) * ms},
		{name: "excluded (score under 40) and paused peers ignored",
			cands: []StageCandidate{score(f.cand("a", 10, 1, 1), 39.9), pause(f.cand("b", 10, 1, 1)),
				f.cand("c", 5, 1, 1), f.cand("d", 5, 1, 1), score(f.cand("e", 5, 1, 1), math.NaN())},
			wantSet: []string{"c 5", "d 5"}, wantTotal: 14 * ms},
		{name: "score 40 is eligible",
			cands: []StageCandidate{score(f.cand("a", 10, 1, 1), 40), f.cand("c", 5, 1, 1), f.cand("d", 5, 1, 1)},
			want:  []string{"a 0-10"}, wantTotal: 12 * ms},
		{name: "a budget short of one layer holds none",
			cands:   []StageCandidate{f.cand("a", 7, 1, 1), f.cand("b", 3, 1, 1), {Peer: f.id("c"), Budget: 119, LayerTime: ms, Score: 50}},
			wantSet: []string{"a 7", "b 3"}, wantTotal: 14 * ms},
		{name: "no links: each boundary through the head, each delay counted once",
			cands:   []StageCandidate{f.cand("a", 5, 1, 3), f.cand("b", 5, 1, 7)},
			wantSet: []string{"a 5", "b 5"}, wantTotal: (10 + 3 + (3 + 7) + 7) * ms},
		{name: "a measured link orders the stages",
			cands: []StageCandidate{f.cand("a", 5, 1, 3), f.cand("b", 5, 1, 7)},
			link:  map[string]float64{"a>b": 1, "b>a": 9},
			want:  []string{"a 0-5", "b 5-10"}, wantTotal: (10 + 3 + 1 + 7) * ms},
		{name: "measured link the other way",
			cands: []StageCandidate{f.cand("a", 5, 1, 3), f.cand("b", 5, 1, 7)},
			link:  map[string]float64{"a>b": 9, "b>a": 1},
			want:  []string{"b 0-5", "a 5-10"}, wantTotal: (10 + 7 + 1 + 3) * ms},
		{name: "a close pair far away beats a near pair far apart",
			cands: []StageCandidate{f.cand("a", 5, 1, 20), f.cand("b", 5, 1, 20), f.cand("c", 5, 1, 12), f.cand("d", 5, 1, 12)},
			link:  map[string]float64{"a>b": 1, "b>a": 1, "c>d": 24, "d>c": 24},
			want:  nil, wantSet: []string{"a 5", "b 5"}, wantTotal: (10 + 20 + 1 + 20) * ms},
		{name: "an unmeasured link goes through the head",
			cands: []StageCandidate{f.cand("a", 5, 1, 3), f.cand("b", 5, 1, 7)},
			link:  map[string]float64{"b>a": 20},
			want:  []string{"a 0-5", "b 5-10"}, wantTotal: (10 + 3 + 10 + 7) * ms},
		{name: "a link given thrice counts at its least",
			cands: []StageCandidate{f.cand("a", 5, 1, 3), f.cand("b", 5, 1, 7)},
			link:  map[string]float64{"a>b": 1, "b>a": 9}, worse: true,
			want: []string{"a 0-5", "b 5-10"}, wantTotal: (10 + 3 + 1 + 7) * ms},
		{name: "links to ineligible or unknown peers are ignored",
			cands:   []StageCandidate{f.cand("a", 5, 1, 3), f.cand("b", 5, 1, 7), pause(f.cand("c", 5, 1, 1))},
			link:    map[string]float64{"a>c": 0, "c>b": 0, "b>e": 0, "e>a": 0, "a>a": 0},
			wantSet: []string{"a 5", "b 5"}, wantTotal: (10 + 20) * ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var link []StageLink
			if tc.link != nil {
				link = f.links(tc.link)
			}
			if tc.worse {
				worse := slices.Clone(link)
				for i := range worse {
					worse[i].Delay += 40 * ms
				}
				link = slices.Concat(worse, link, worse)
			}
			got, err := PlanStages(planShape, 4, tc.cands, link)
			if err != nil {
				t.Fatal(err)
			}
			checkPlan(t, planShape, 4, tc.cands, link, got)
			r := f.renderPlan(got)
			if tc.want != nil && !slices.Equal(r, tc.want) {
				t.Errorf("stages %q, want %q", r, tc.want)
			}
			if tc.wantSet != nil {
				if !sameSet(f.renderSizes(got), tc.wantSet) {
					t.Errorf("stages %q, want %q in any order", r, tc.wantSet)
				}
				if tc.link == nil && !slices.IsSortedFunc(got.Stages, func(a, b PlannedStage) int { return strings.Compare(string(a.Peer), string(b.Peer)) }) {
					t.Errorf("stages %q not in peer ID order", r)
				}
			}
			if tc.wantTotal != 0 && got.PerToken != tc.wantTotal {
				t.Errorf("per token %v, want %v", got.PerToken, tc.wantTotal)
			}
		})
	}
}

// TestPlanBoundaries: the plan reports each boundary once, where the data crosses it.
func TestPlanBoundaries(t *testing.T) {
	f := newFleet(t, "a", "b", "c")
	cands := []StageCandidate{f.cand("a", 4, 1, 3), f.cand("b", 4, 2, 7), f.cand("c", 4, 3, 11)}
	link := f.links(map[string]float64{"a>b": 1, "b>c": 2, "c>a": 40, "b>a": 40, "c>b": 40, "a>c": 40})
	got, err := PlanStages(planShape, 4, cands, link)
	if err != nil {
		t.Fatal(err)
	}
	want := StagePlan{
		Stages: []PlannedStage{
			{Peer: f.id("a"), Lo: 0, Hi: 4, Bytes: 480, Compute: 4 * ms, Delay: 3 * ms},
			{Peer: f.id("b"), Lo: 4, Hi: 8, Bytes: 480, Compute: 8 * ms, Delay: 1 * ms},
			{Peer: f.id("c"), Lo: 8, Hi: 10, Bytes: 240, Compute: 6 * ms, Delay: 2 * ms},
		},
		Return:   11 * ms,
		PerToken: (4 + 8 + 6 + 3 + 1 + 2 + 11) * ms,
	}
	if !slices.Equal(got.Stages, want.Stages) || got.Return != want.Return || got.PerToken != want.PerToken {
		t.Fatalf("plan\n got %+v\nwant %+v", got, want)
	}
}

// TestPlanTies: equal candidates are told apart by peer ID, whatever the order they come
// in: the smaller ID is chosen, and holds the larger range.
func TestPlanTies(t *testing.T) {
	f := newFleet(t, "a", "b", "c", "d")
	names := []string{"a", "b", "c", "d"}
	byID := slices.Clone(names)
	slices.SortFunc(byID, func(x, y string) int { return strings.Compare(string(f.id(x)), string(f.id(y))) })
	cands := make([]StageCandidate, len(names))
	for i, n := range names {
		cands[i] = f.cand(n, 7, 1, 1)
	}
	rng := seeded(3)
	var first []string
	for i := range 20 {
		rng.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
		got, err := PlanStages(planShape, 4, cands, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := f.renderPlan(got)
		if i == 0 {
			first = r
			want := []string{byID[0] + " 0-7", byID[1] + " 7-10"}
			if !slices.Equal(r, want) {
				t.Fatalf("stages %q, want %q (peer ID order %q)", r, want, byID)
			}
		} else if !slices.Equal(r, first) {
			t.Fatalf("shuffle %d: stages %q, first %q", i, r, first)
		}
	}

	// With links of equal delays too: every order is as good, peer ID order wins.
	var flat []StageLink
	for _, a := range cands {
		for _, b := range cands {
			flat = append(flat, StageLink{From: a.Peer, To: b.Peer, Delay: 2 * ms})
		}
	}
	got, err := PlanStages(planShape, 4, cands, flat)
	if err != nil {
		t.Fatal(err)
	}
	if r := f.renderPlan(got); !slices.Equal(r, first) {
		t.Fatalf("equal links: stages %q, want %q", r, first)
	}
}

// TestPlanShortfall: a mesh that cannot hold the model even together gets a
// *ShortfallError naming what is missing.
func TestPlanShortfall(t *testing.T) {
	f := newFleet(t, "a", "b", "c", "d")
	cands := []StageCandidate{f.cand("a", 4, 1, 1), f.cand("b", 3, 1, 1), score(f.cand("c", 10, 1, 1), 10), pause(f.cand("d", 10, 1, 1))}
	_, err := PlanStages(planShape, 4, cands, nil)
	var short *ShortfallError
	if !errors.As(err, &short) {
		t.Fatalf("error %v (%T), want a *ShortfallError", err, err)
	}
	want := ShortfallError{Layers: 10, Positions: 4, Need: 1200, Held: 7, Short: 360, Candidates: 2, Ignored: 2}
	if *short != want {
		t.Errorf("shortfall %+v, want %+v", *short, want)
	}
	for _, s := range []string{"10 layers", "need 1 MB", "hold 7", "3 layers short", "with 1 MB free", "2 ignored"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q does not say %q", err, s)
		}
	}
	wrapped := fmt.Errorf("plan: %w", err)
	if !errors.As(wrapped, &short) {
		t.Error("errors.As does not find a wrapped *ShortfallError")
	}

	// Big numbers: a 70-layer model on two 16 GB nodes.
	big := inference.ModelShape{Layers: 70, LayerBytes: 560e6, KVBytesPerToken: 286720, Context: 8192}
	_, err = PlanStages(big, 4096, []StageCandidate{{Peer: f.id("a"), Budget: 16e9, Score: 50}, {Peer: f.id("b"), Budget: 16e9, Score: 50}}, nil)
	if !errors.As(err, &short) || short.Held != 54 || !strings.Contains(err.Error(), "40.4 GB") || !strings.Contains(err.Error(), "9.2 GB free") {
		t.Errorf("big shortfall: %v", err)
	}

	// No candidate at all.
	_, err = PlanStages(planShape, 4, nil, nil)
	if !errors.As(err, &short) || short.Candidates != 0 || short.Held != 0 || short.Short != short.Need {
		t.Errorf("no candidates: %v", err)
	}
}

// TestPlanMemory: a stage's memory is its layers and their share of the KV cache for the
// positions planned, the whole context window by default.
func TestPlanMemory(t *testing.T) {
	shape := inference.ModelShape{Layers: 3, LayerBytes: 1000, KVBytesPerToken: 10, Context: 100}
	for _, tc := range []struct {
		positions, layers int
		want              int64
	}{
		{100, 3, 3000 + 1000},
		{100, 1, 1000 + 334}, // ⌈1000/3⌉
		{100, 2, 2000 + 667}, // ⌈2000/3⌉
		{10, 1, 1000 + 34},
		{0, 0, 0},
	} {
		if got := StageBytes(shape, tc.positions, tc.layers); got != tc.want {
			t.Errorf("StageBytes(%d positions, %d layers) = %d, want %d", tc.positions, tc.layers, got, tc.want)
		}
	}
	huge := inference.ModelShape{Layers: 4, LayerBytes: math.MaxInt64 / 2, KVBytesPerToken: math.MaxInt64}
	if got := StageBytes(huge, 1<<40, 3); got != math.MaxInt64 {
		t.Errorf("StageBytes saturates at %d, want MaxInt64", got)
	}

	f := newFleet(t, "a", "b")
	cands := []StageCandidate{{Peer: f.id("a"), Budget: 2667, Score: 50}, {Peer: f.id("b"), Budget: 1334, Score: 50}}
	got, err := PlanStages(shape, 0, cands, nil) // 0: the whole context window
	if err != nil {
		t.Fatal(err)
	}
	if r := f.renderPlan(got); !sameSet(r, []string{"a 0-2", "b 2-3"}) && !sameSet(r, []string{"b 0-1", "a 1-3"}) {
		t.Errorf("stages %q, want a 2 layers and b 1", r)
	}
	cands[0].Budget--
	var short *ShortfallError
	if _, err := PlanStages(shape, 0, cands, nil); !errors.As(err, &short) || short.Held != 2 {
		t.Errorf("a byte short: %v, want a shortfall holding 2 layers", err)
	}
	if got, err := PlanStages(shape, 10, cands, nil); err != nil || len(got.Stages) != 2 {
		t.Errorf("10 positions: %+v, %v, want 2 stages", got, err)
	}
}

// TestPlanDefaults: an unknown layer time is LayerBytes ÷ DefaultStageBandwidth; a
// negative delay counts as 0.
func TestPlanDefaults(t *testing.T) {
	f := newFleet(t, "a")
	shape := inference.ModelShape{Layers: 2, LayerBytes: 2 << 30}
	got, err := PlanStages(shape, 0, []StageCandidate{{Peer: f.id("a"), Budget: 4 << 30, Delay: -ms, Score: 50}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A layer is half of a 4 GiB model at 50 tokens/s: 10 ms.
	if s := got.Stages[0]; s.Compute != 20*ms || s.Delay != 0 || got.Return != 0 || got.PerToken != 20*ms {
		t.Errorf("plan %+v, want 20 ms of compute and no delay", got)
	}
}

// TestPlanInvalid: shapes PlanStages cannot plan, and a peer given twice.
func TestPlanInvalid(t *testing.T) {
	f := newFleet(t, "a")
	c := f.cand("a", 10, 1, 1)
	for _, tc := range []struct {
		name  string
		shape inference.ModelShape
		cands []StageCandidate
	}{
		{"no layers", inference.ModelShape{}, []StageCandidate{c}},
		{"too many layers", inference.ModelShape{Layers: MaxPlanLayers + 1}, []StageCandidate{c}},
		{"negative layer bytes", inference.ModelShape{Layers: 10, LayerBytes: -1}, []StageCandidate{c}},
		{"negative KV", inference.ModelShape{Layers: 10, KVBytesPerToken: -1}, []StageCandidate{c}},
		{"a peer twice", planShape, []StageCandidate{c, c}},
	} {
		_, err := PlanStages(tc.shape, 4, tc.cands, nil)
		var short *ShortfallError
		if err == nil || errors.As(err, &short) {
			t.Errorf("%s: error %v, want a plain error", tc.name, err)
		}
	}
}

// TestPlanQuality is S5: on 1,000 random small meshes, without and with measured links,
// the plan has the fewest stages of any plan and its estimated time per token is at most
// 1.05 × the best found by exhaustive search over every sequence of candidates and every
// split of the layers (never below it: the estimate is recomputed on its own). Meshes the
// exhaustive search cannot plan must get a shortfall, and shuffling the candidates and
// links must not change the plan. It logs the worst ratio seen.
func TestPlanQuality(t *testing.T) {
	for _, links := range []bool{false, true} {
		t.Run(fmt.Sprintf("links=%v", links), func(t *testing.T) {
			rng := seeded(5)
			worst, worstAt, optimal, shortfalls := 1.0, -1, 0, 0
			stages := map[int]int{} // meshes by stages
			for i := 0; i < 1000; {
				m := randomMesh(rng, links)
				got, err := PlanStages(m.shape, m.positions, m.cands, m.links)
				k, best, ok := exhaustive(m)
				if !ok {
					var short *ShortfallError
					if !errors.As(err, &short) {
						t.Fatalf("mesh %d: exhaustive search finds no plan, PlanStages: %+v, %v", i, got, err)
					}
					shortfalls++
					continue
				}
				if err != nil {
					t.Fatalf("mesh %d: %v; exhaustive search finds %d stages", i, err, k)
				}
				checkPlan(t, m.shape, m.positions, m.cands, m.links, got)
				if len(got.Stages) != k {
					t.Fatalf("mesh %d: %d stages, exhaustive search finds %d\n%s", i, len(got.Stages), k, m)
				}
				ratio := 1.0
				if best > 0 {
					ratio = float64(got.PerToken) / float64(best)
				}
				if ratio > 1.05 || got.PerToken < best {
					t.Errorf("mesh %d: %v per token, exhaustive %v: ratio %.3f\n%s", i, got.PerToken, best, ratio, m)
				}
				if got.PerToken == best {
					optimal++
				}
				if ratio > worst {
					worst, worstAt = ratio, i
				}
				stages[k]++

				shuffle(rng, m.cands)
				shuffle(rng, m.links)
				if again, err := PlanStages(m.shape, m.positions, m.cands, m.links); err != nil || !reflect.DeepEqual(again, got) {
					t.Fatalf("mesh %d shuffled: %+v, %v; first %+v", i, again, err, got)
				}
				i++
			}
			t.Logf("S5: 1000 meshes (%d more could not hold their model), stages %v: worst ratio %.4f (mesh %d), %d optimal",
				shortfalls, stages, worst, worstAt, optimal)
			if stages[3]+stages[4]+stages[5]+stages[6] < 100 {
				t.Errorf("stages %v: want 100 meshes of 3 stages or more, for the test to mean something", stages)
			}
		})
	}
}

func shuffle[T any](rng *mrand.Rand, s []T) {
	rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
}

// TestPlanLongPipelines: past exactOrderStages stages the order is searched by moving runs
// of stages, which finds a chain of measured links in any order of input; past
// maxLinkStages stages go in peer ID order.
func TestPlanLongPipelines(t *testing.T) {
	for _, n := range []int{exactOrderStages + 4, maxLinkStages + 6} {
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("c%02d", i)
		}
		f := newFleet(t, names...)
		shape := inference.ModelShape{Layers: n, LayerBytes: 100}
		var cands []StageCandidate
		var links []StageLink
		for i, name := range names {
			cands = append(cands, StageCandidate{Peer: f.id(name), Budget: 100, LayerTime: ms, Delay: 20 * ms, Score: 50})
			if i > 0 {
				links = append(links, StageLink{From: f.id(names[i-1]), To: f.id(name), Delay: ms})
			}
		}
		shuffle(seeded(1), cands)
		got, err := PlanStages(shape, 0, cands, links)
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, shape, 0, cands, links, got)
		if n <= maxLinkStages {
			want := time.Duration(n)*ms + 20*ms + time.Duration(n-1)*ms + 20*ms
			if got.PerToken != want {
				t.Errorf("%d stages: %v per token, want %v (the chain)\n%q", n, got.PerToken, want, f.renderPlan(got))
			}
			continue
		}
		if !slices.IsSortedFunc(got.Stages, func(a, b PlannedStage) int { return strings.Compare(string(a.Peer), string(b.Peer)) }) {
			t.Errorf("%d stages not in peer ID order: %q", n, f.renderPlan(got))
		}
	}
}

// TestPlanOrder: Held–Karp finds the shortest path through every stage, as trying every
// permutation does; moving runs of stages never lengthens a path, and on random paths of
// 3 to 8 stages comes within 5 % of the shortest on average.
func TestPlanOrder(t *testing.T) {
	rng := seeded(9)
	worst, sum := 1.0, 0.0
	const paths = 2000
	for range paths {
		k := 3 + rng.IntN(6)
		w := k + 1
		type point struct{ x, y float64 }
		at := make([]point, w)
		for i := range at {
			at[i] = point{rng.Float64() * 100, rng.Float64() * 100}
		}
		dist := make([]int64, w*w)
		for a := range w {
			for b := range w {
				if a != b {
					dist[a*w+b] = int64(math.Hypot(at[a].x-at[b].x, at[a].y-at[b].y) * (0.8 + 0.4*rng.Float64()) * 1e6)
				}
			}
		}
		perm := make([]int, k)
		for i := range perm {
			perm[i] = i
		}
		start := pathCost(perm, dist)
		shortest := int64(math.MaxInt64)
		if k <= 7 {
			var try func(i int)
			try = func(i int) {
				if i == k {
					shortest = min(shortest, pathCost(perm, dist))
					return
				}
				for j := i; j < k; j++ {
					perm[i], perm[j] = perm[j], perm[i]
					try(i + 1)
					perm[i], perm[j] = perm[j], perm[i]
				}
			}
			try(0)
		}
		exact := heldKarp(dist, k)
		if c := pathCost(exact, dist); k <= 7 && c != shortest {
			t.Fatalf("%d stages: Held–Karp %d, permutations %d", k, c, shortest)
		}
		relocate(perm, dist)
		moved := pathCost(perm, dist)
		if moved > start || moved < pathCost(exact, dist) || !isPermutation(perm) {
			t.Fatalf("%d stages: moves give %v (%d), from %d, shortest %d", k, perm, moved, start, pathCost(exact, dist))
		}
		r := float64(moved) / float64(pathCost(exact, dist))
		sum += r
		worst = max(worst, r)
	}
	t.Logf("moving runs of stages vs the shortest path: mean ratio %.4f, worst %.3f", sum/paths, worst)
	if sum/paths > 1.05 {
		t.Errorf("mean ratio %.4f, want 1.05 at most", sum/paths)
	}
}

func isPermutation(perm []int) bool {
	s := slices.Sorted(slices.Values(perm))
	for i, x := range s {
		if x != i {
			return false
		}
	}
	return true
}

// checkPlan checks what every plan must satisfy: contiguous ranges over every layer,
// distinct eligible peers within their budgets, and an estimate that adds up, computed
// here from the cost model on its own.
func checkPlan(t *testing.T, shape inference.ModelShape, positions int, cands []StageCandidate, links []StageLink, p StagePlan) {
	t.Helper()
	checkRange(t, shape, positions, 0, shape.Layers, cands, links, p)
}

// checkRange is checkPlan for a plan of the layers [lo, hi) (PlanRange).
func checkRange(t *testing.T, shape inference.ModelShape, positions, lo, hi int, cands []StageCandidate, links []StageLink, p StagePlan) {
	t.Helper()
	link := linkMap(links)
	if positions <= 0 {
		positions = shape.Context
	}
	byPeer := map[peer.ID]StageCandidate{}
	for _, c := range cands {
		byPeer[c.Peer] = c
	}
	seen := map[peer.ID]bool{}
	var total time.Duration
	prev := StageCandidate{}
	for i, s := range p.Stages {
		c, ok := byPeer[s.Peer]
		switch {
		case !ok:
			t.Fatalf("stage %d: peer %s is no candidate", i, s.Peer)
		case c.Paused || !(c.Score >= 40):
			t.Fatalf("stage %d: peer %s is not eligible (score %v, paused %v)", i, s.Peer, c.Score, c.Paused)
		case seen[s.Peer]:
			t.Fatalf("stage %d: peer %s twice", i, s.Peer)
		case s.Lo != lo || s.Hi <= s.Lo:
			t.Fatalf("stage %d: layers [%d, %d) after %d", i, s.Lo, s.Hi, lo)
		}
		seen[s.Peer] = true
		n := int64(s.Hi - s.Lo)
		need := n*shape.LayerBytes + (n*shape.KVBytesPerToken*int64(positions)+int64(shape.Layers)-1)/int64(shape.Layers)
		if s.Bytes != need || need > c.Budget {
			t.Fatalf("stage %d: %d bytes (model: %d), budget %d", i, s.Bytes, need, c.Budget)
		}
		if s.Compute != time.Duration(n)*c.LayerTime {
			t.Fatalf("stage %d: compute %v, want %d × %v", i, s.Compute, n, c.LayerTime)
		}
		d := c.Delay
		if i > 0 {
			d = testLink(link, prev, c)
		}
		if s.Delay != d {
			t.Fatalf("stage %d: delay %v, want %v", i, s.Delay, d)
		}
		total += s.Compute + s.Delay
		lo, prev = s.Hi, c
	}
	if lo != hi {
		t.Fatalf("stages end at layer %d, want %d", lo, hi)
	}
	if p.Return != prev.Delay || p.PerToken != total+p.Return {
		t.Fatalf("return %v (last stage's delay %v), per token %v (sum %v)", p.Return, prev.Delay, p.PerToken, total+p.Return)
	}
}

// linkMap indexes links by their ends, each at its least.
func linkMap(links []StageLink) map[[2]peer.ID]time.Duration {
	m := map[[2]peer.ID]time.Duration{}
	for _, l := range links {
		k := [2]peer.ID{l.From, l.To}
		if d, ok := m[k]; !ok || l.Delay < d {
			m[k] = l.Delay
		}
	}
	return m
}

// testLink is the boundary between two candidates: measured, or through the head.
func testLink(link map[[2]peer.ID]time.Duration, a, b StageCandidate) time.Duration {
	if d, ok := link[[2]peer.ID{a.Peer, b.Peer}]; ok {
		return d
	}
	return a.Delay + b.Delay
}

// mesh is a random planning problem.
type mesh struct {
	shape     inference.ModelShape
	positions int
	cands     []StageCandidate
	links     []StageLink
}

func (m mesh) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "shape %+v, positions %d\n", m.shape, m.positions)
	for i, c := range m.cands {
		fmt.Fprintf(&b, "  %d: budget %d, layer %v, delay %v, score %v, paused %v\n", i, c.Budget, c.LayerTime, c.Delay, c.Score, c.Paused)
	}
	index := map[peer.ID]int{}
	for i, c := range m.cands {
		index[c.Peer] = i
	}
	for _, l := range m.links {
		fmt.Fprintf(&b, "  %d>%d %v", index[l.From], index[l.To], l.Delay)
	}
	return b.String()
}

// randomMesh draws up to 6 candidates and up to 12 layers, planned for up to 8 positions
// (0: the context window, 8). Candidates sit around the head in up to three clusters,
// delays being distances (1 to about 100 ms); with links, four links in five between
// candidates are measured: the distance within 20 %. Budgets hold up to a random share
// (20 to 100 %) of the model, layer times are 1 to 20 ms, one candidate in ten is excluded
// and one in ten paused.
func randomMesh(rng *mrand.Rand, links bool) mesh {
	layers := 1 + rng.IntN(12)
	m := mesh{
		shape:     inference.ModelShape{Layers: layers, LayerBytes: 100, KVBytesPerToken: int64(rng.IntN(60)), Context: 8},
		positions: rng.IntN(9),
	}
	positions := m.positions
	if positions == 0 {
		positions = m.shape.Context
	}
	perLayer := StageBytes(m.shape, positions, 1)
	type point struct{ x, y float64 }
	var centres []point
	for range 1 + rng.IntN(3) {
		centres = append(centres, point{rng.Float64()*120 - 60, rng.Float64()*120 - 60})
	}
	room := 0.2 + 0.8*rng.Float64() // the largest budget's share of the model
	var at []point
	for range 1 + rng.IntN(6) {
		c := centres[rng.IntN(len(centres))]
		p := point{c.x + rng.NormFloat64()*5, c.y + rng.NormFloat64()*5}
		at = append(at, p)
		cand := StageCandidate{
			Peer:      seededPeer(rng),
			Budget:    int64(rng.Float64() * room * float64(int64(layers+1)*perLayer)),
			LayerTime: ms + time.Duration(rng.Int64N(int64(19*ms))),
			Delay:     time.Duration((1 + math.Hypot(p.x, p.y)) * float64(ms)),
			Score:     40 + rng.Float64()*60,
		}
		switch rng.IntN(10) {
		case 0:
			cand.Score = rng.Float64() * 40
		case 1:
			cand.Paused = true
		}
		m.cands = append(m.cands, cand)
	}
	if links {
		for i, a := range m.cands {
			for j, b := range m.cands {
				if i == j || rng.IntN(10) < 2 {
					continue
				}
				d := (1 + math.Hypot(at[i].x-at[j].x, at[i].y-at[j].y)) * (0.8 + 0.4*rng.Float64())
				m.links = append(m.links, StageLink{From: a.Peer, To: b.Peer, Delay: time.Duration(d * float64(ms))})
			}
		}
	}
	return m
}

// seededPeer is a peer ID drawn from rng, so that a seeded mesh is the same every run: the
// form of an Ed25519 peer's ID (an identity multihash of its public key) around 32 random
// bytes, not a real key, which would cost the quality tests more time than the plans.
func seededPeer(rng *mrand.Rand) peer.ID {
	id := []byte{0x00, 0x24, 0x08, 0x01, 0x12, 0x20}
	for range 32 {
		id = append(id, byte(rng.Uint32()))
	}
	return peer.ID(id)
}

// exhaustive searches every plan of m: each sequence of distinct eligible candidates and
// each split of the layers into contiguous ranges, one per candidate, that fit their
// budgets. It returns the fewest stages of any plan and the least time per token among
// plans of that many stages, or false when there is no plan. The cost model is written here
// again, plainly, rather than shared with PlanStages.
func exhaustive(m mesh) (stages int, best time.Duration, ok bool) {
	positions := m.positions
	if positions <= 0 {
		positions = m.shape.Context
	}
	link := linkMap(m.links)
	L := m.shape.Layers
	var elig []StageCandidate
	var holds []int // most layers each can hold
	for _, c := range m.cands {
		if c.Paused || !(c.Score >= 40) {
			continue
		}
		n := 0
		for n < L {
			k := int64(n + 1)
			if k*m.shape.LayerBytes+(k*m.shape.KVBytesPerToken*int64(positions)+int64(L)-1)/int64(L) > c.Budget {
				break
			}
			n++
		}
		elig = append(elig, c)
		holds = append(holds, n)
	}
	used := make([]bool, len(elig))
	var found bool
	// search extends a plan whose last stage is elig[last] (-1: none yet), with placed
	// layers placed, depth stages and cost so far, by one more stage, if depth < k.
	var search func(last, placed, depth, k int, cost time.Duration)
	search = func(last, placed, depth, k int, cost time.Duration) {
		if found && cost >= best {
			return
		}
		if placed == L {
			cost += elig[last].Delay
			if !found || cost < best {
				found, best = true, cost
			}
			return
		}
		if depth == k {
			return
		}
		for j, c := range elig {
			if used[j] {
				continue
			}
			d := c.Delay
			if last >= 0 {
				d = testLink(link, elig[last], c)
			}
			used[j] = true
			for n := 1; n <= holds[j] && placed+n <= L; n++ {
				search(j, placed+n, depth+1, k, cost+d+time.Duration(n)*c.LayerTime)
			}
			used[j] = false
		}
	}
	for k := 1; k <= len(elig); k++ {
		search(-1, 0, 0, k, 0)
		if found {
			return k, best, true
		}
	}
	return 0, 0, false
}
