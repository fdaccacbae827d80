package testnet

import (
	"testing"
	"time"
)

// m2Slower is M2's test for "measurably slower": exact one-sided Mann-Whitney at 5 %.
func TestM2Slower(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		out := make([]time.Duration, len(vs))
		for i, v := range vs {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	for _, c := range []struct {
		a, b []time.Duration
		want bool
	}{
		// p values computed by enumerating every ordering.
		{ms(11, 12, 13), ms(1, 2, 3), true},                              // U = 0: p = 1/20
		{ms(11, 12, 2), ms(1, 13, 3), false},                             // U = 4: p = 0.5
		{ms(10, 11, 12, 13, 14, 15, 16), ms(1, 2, 3, 4, 5, 6, 7), true},  // U = 0: p = 1/3432
		{ms(10, 2, 12, 4, 14, 6, 16), ms(1, 11, 3, 13, 5, 15, 7), false}, // U = 21: p = 0.36
		{ms(10, 11, 12, 13, 14, 15, 3), ms(1, 2, 16, 4, 5, 6, 7), true},  // U = 11: p = 0.049
		{ms(10, 11, 12, 13, 14, 9, 8), ms(1, 2, 3, 4, 5, 15, 16), false}, // U = 14: p = 0.10
		{ms(10, 11, 12, 13, 14, 15, 6), ms(1, 2, 3, 4, 5, 7, 16), true},  // U = 8: p = 0.019
		{ms(5), ms(1, 2, 3), true},                                       // run once: it was no contender
		{ms(1, 2, 3), ms(5), false},
	} {
		if got := m2Slower(c.a, c.b); got != c.want {
			t.Errorf("m2Slower(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
