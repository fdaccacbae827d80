package reputation

import (
	"math"
	"slices"
	"testing"
	"time"
)

// t0 is an arbitrary fixed start; tests advance time by adding to it.
var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func newStore(t testing.TB, mutate ...func(*Params)) *Store {
	t.Helper()
	p := DefaultParams()
	for _, m := range mutate {
		m(&p)
	}
	s, err := New(p)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func wantOrder(t *testing.T, got []string, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("order = %q, want %q", got, want)
	}
}
