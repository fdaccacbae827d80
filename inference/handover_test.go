package inference

import "testing"

// TestPreCopyQuota: a move's own bound stands; by default a pre-copy sends MovePreCopyBytes
// a token, or a MovePreCopyTicks-th of a larger cache, so that it ends within about
// MovePreCopyTicks tokens however long the context.
func TestPreCopyQuota(t *testing.T) {
	for _, tc := range []struct {
		name              string
		preCopy, cache    int
		want              int
		ticksForThisCache int
	}{
		{"small cache: the default bound", 0, 8 << 20, MovePreCopyBytes, 8},
		{"synth-base at 4,096 positions: a 32nd", 0, 128 << 20, 4 << 20, MovePreCopyTicks},
		{"the move's own bound stands", 64 << 10, 128 << 20, 64 << 10, 2048},
	} {
		m := Move{PreCopyBytes: tc.preCopy}
		got := m.PreCopyQuota(tc.cache)
		if got != tc.want || (tc.cache+got-1)/got != tc.ticksForThisCache {
			t.Errorf("%s: %d bytes a token, %d tokens; want %d, %d", tc.name, got, (tc.cache+got-1)/got, tc.want, tc.ticksForThisCache)
		}
	}
}
