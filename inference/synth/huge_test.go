package synth

import "testing"

// TestHugeFloats: the weights' backing array has the length asked for, zeroed and
// writable, whether or not it is large enough to be given huge pages.
func TestHugeFloats(t *testing.T) {
	for _, n := range []int{0, 1, 1 << 20, 5<<20 + 3} {
		f := hugeFloats(n)
		if len(f) != n {
			t.Fatalf("hugeFloats(%d) has %d values", n, len(f))
		}
		for i := range f {
			if f[i] != 0 {
				t.Fatalf("hugeFloats(%d)[%d] = %v, want 0", n, i, f[i])
			}
			f[i] = float32(i)
		}
		if n > 0 && f[n-1] != float32(n-1) {
			t.Fatalf("hugeFloats(%d) did not keep a write", n)
		}
	}
}
