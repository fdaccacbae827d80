package synth

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

// TestStageBudget: ranges no session uses are unloaded to make room, least recently used
// first and no more than needed; a range an open session uses never is; an open that even
// those would not make room for is refused with overloaded, naming the MB, and unloads
// nothing; a lowered budget unloads what is unpinned at once and the rest as it is closed.
// Every unload is reported to the hook, and the count is back to zero at the end.
func TestStageBudget(t *testing.T) {
	ctx := context.Background()
	var changes int
	b, err := NewWith([]string{"synth-small"}, []Option{
		WithOnRangeChange(func() { changes++ }),
	})
	if err != nil {
		t.Fatal(err)
	}
	m := b.models["synth-small"]
	sh := m.preset.Shape()
	const positions = 8
	kv := kvBytes(sh, 1, positions) // a layer's KV cache: 16 KiB
	// Room for the 4 layers and four layers' caches; not for a fifth layer.
	b.SetStageBudget(4*sh.LayerBytes + 4*kv)

	open := func(lo, hi int) inference.StageSession {
		t.Helper()
		s, err := b.OpenStage(ctx, "synth-small", lo, hi, positions)
		if err != nil {
			t.Fatalf("OpenStage(%d, %d): %v", lo, hi, err)
		}
		return s
	}
	want := func(what string, ranges ...[2]int) {
		t.Helper()
		var got [][2]int
		for _, r := range b.Ranges() {
			got = append(got, [2]int{r.Lo, r.Hi})
		}
		if !slices.Equal(got, ranges) {
			t.Fatalf("%s: ranges %v, want %v", what, got, ranges)
		}
		if held, budget := b.StageMemory(); held > budget {
			t.Fatalf("%s: %d bytes held, over the budget of %d", what, held, budget)
		}
	}
	unloads := func(what string, n int) {
		t.Helper()
		// Each load reports twice (start, end); the test counts what is left over.
		if changes != n {
			t.Fatalf("%s: the hook heard %d changes, want %d", what, changes, n)
		}
		changes = 0
	}

	a := open(0, 2) // pinned until closed below
	open(2, 3).Close()
	open(3, 4).Close()
	want("four layers held", [2]int{0, 2}, [2]int{2, 3}, [2]int{3, 4})
	unloads("three loads", 6)

	// Two layers more: the two unpinned ranges go, [0, 2) stays.
	bs := open(1, 3)
	want("[1, 3) in place of [2, 3) and [3, 4)", [2]int{0, 2}, [2]int{1, 3})
	unloads("one load, two unloads", 2+2)

	// Everything held is pinned: refused, nothing unloaded.
	_, err = b.OpenStage(ctx, "synth-small", 3, 4, positions)
	if inference.CodeOf(err) != inference.CodeOverloaded || !strings.Contains(err.Error(), "3.2 MB") {
		t.Fatalf("an open past the pinned ranges: %v, want overloaded naming the 3.2 MB needed", err)
	}
	want("after the refusal", [2]int{0, 2}, [2]int{1, 3})
	unloads("a refusal", 0)

	// Closed, [0, 2) is the least recently used: it goes for [3, 4); [1, 3) stays.
	a.Close()
	a.Close() // idempotent: counts once
	c := open(3, 4)
	want("[3, 4) in place of [0, 2)", [2]int{1, 3}, [2]int{3, 4})
	unloads("one load, one unload", 2+1)
	c.Close()

	// Lowered below what is pinned: the unpinned [3, 4) goes at once, the pinned [1, 3)
	// when its session closes.
	b.SetStageBudget(sh.LayerBytes)
	if got := b.Ranges(); len(got) != 1 || got[0].Lo != 1 || got[0].Hi != 3 {
		t.Fatalf("after the budget was lowered: %+v, want [1, 3) alone", got)
	}
	unloads("lowered", 1)
	if err := bs.Close(); err != nil {
		t.Fatal(err)
	}
	if got := b.Ranges(); len(got) != 0 {
		t.Fatalf("after the last session closed over the budget: %+v", got)
	}
	unloads("closed over the budget", 1)
	if held, _ := b.StageMemory(); held != 0 {
		t.Fatalf("%d bytes held with nothing loaded", held)
	}

	// A failed load counts nothing once its open gives up.
	b.SetStageBudget(0)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.OpenStage(canceled, "synth-small", 0, 1, positions); err == nil {
		t.Fatal("an open with a cancelled context succeeded")
	}
	if held, _ := b.StageMemory(); held != 0 {
		t.Fatalf("%d bytes held after a failed load", held)
	}
	// Larger than the whole budget: refused.
	b.SetStageBudget(sh.LayerBytes)
	if _, err := b.OpenStage(ctx, "synth-small", 0, 2, positions); inference.CodeOf(err) != inference.CodeOverloaded {
		t.Fatalf("two layers over a one-layer budget: %v, want overloaded", err)
	}
}

// TestStageBudgetHeap: sessions of different ranges of synth-small open and close one after
// another, one of them kept open throughout, under a budget of two and a half layers. The
// heap held (measured as TestStageMemory does) never passes the budget by more than 10 %
// and stageSlack, the kept range is never unloaded, and its session still runs. Without
// the budget the same sequence would hold seven ranges, ten layers: four times the budget.
func TestStageBudgetHeap(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, "synth-small")
	m := b.models["synth-small"]
	sh := m.preset.Shape()
	const positions = 16
	budget := 5*sh.LayerBytes/2 + 4*kvBytes(sh, 1, positions)
	b.SetStageBudget(budget)
	limit := budget + budget/10 + stageSlack
	before := heapAlloc()

	kept, err := b.OpenStage(ctx, "synth-small", 3, 4, positions)
	if err != nil {
		t.Fatal(err)
	}
	keptW := m.loaded(layerRange(3, 4))
	rng := rand.New(rand.NewPCG(7, 8))
	opened, refused := 0, 0
	for i := range 30 {
		lo := rng.IntN(4)
		hi := lo + 1 + rng.IntN(min(2, 4-lo))
		s, err := b.OpenStage(ctx, "synth-small", lo, hi, positions)
		switch {
		case inference.CodeOf(err) == inference.CodeOverloaded:
			refused++ // two layers beside the kept one: no room
		case err != nil:
			t.Fatal(err)
		default:
			opened++
			grown := heapAlloc() - before
			if grown > limit {
				t.Fatalf("step %d, [%d, %d) open: the heap grew %d bytes, over %d (budget %d)", i, lo, hi, grown, limit, budget)
			}
			s.Close()
		}
		if held, _ := b.StageMemory(); held > budget {
			t.Fatalf("step %d: %d bytes counted, over the budget of %d", i, held, budget)
		}
		if m.loaded(layerRange(3, 4)) != keptW {
			t.Fatalf("step %d: the range of the open session was unloaded", i)
		}
	}
	if opened < 10 || refused == 0 {
		t.Fatalf("%d opens, %d refused: the sequence should have both", opened, refused)
	}
	d := m.preset.Dim
	if _, err := kept.Forward(ctx, make([]float32, d), 1); err != nil {
		t.Fatalf("the kept session after the others came and went: %v", err)
	}
	kept.Close()
	t.Logf("budget %d, limit %d, %d opened, %d refused", budget, limit, opened, refused)
}

// TestStageBudgetConcurrent: opens and closes of random ranges from several goroutines never
// count more than the budget, and count nothing once all are closed.
func TestStageBudgetConcurrent(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, "synth-tiny")
	sh := b.models["synth-tiny"].preset.Shape()
	budget := 3*sh.LayerBytes/2 + 4*kvBytes(sh, 2, 8)
	b.SetStageBudget(budget)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 50 {
				lo := rng.IntN(2)
				s, err := b.OpenStage(ctx, "synth-tiny", lo, lo+1, 8)
				if held, _ := b.StageMemory(); held > budget {
					t.Errorf("%d bytes counted, over the budget of %d", held, budget)
				}
				if err == nil {
					s.Close()
				} else if inference.CodeOf(err) != inference.CodeOverloaded {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	held, _ := b.StageMemory()
	var ranges int64
	for _, r := range b.Ranges() {
		ranges += int64(r.Hi-r.Lo) * sh.LayerBytes
	}
	if held != ranges {
		t.Fatalf("%d bytes counted with no session open, %d of ranges held", held, ranges)
	}
}
