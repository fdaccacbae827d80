package window

import (
	"testing"
	"time"
)

func TestKeyed(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := Keyed[string]{Length: 10 * time.Second, Max: 2, Cap: 2}
	for i, tc := range []struct {
		key  string
		at   time.Duration
		want bool
	}{
		{"a", 0, true}, {"a", time.Second, true}, {"a", 2 * time.Second, false}, // a window holds 2
		{"b", 3 * time.Second, true},
		{"c", 4 * time.Second, false},    // 2 keys remembered, neither window over
		{"a", 10 * time.Second, true},    // a's window ended: a new one
		{"c", 13 * time.Second, true},    // b's ended: forgotten, c takes its place
		{"b", 13 * time.Second, false},   // full again
		{"a", 19 * time.Second, true},    // a's window from 10 s holds one: a second fits
		{"a", 19*time.Second + 1, false}, // full
		{"a", 20 * time.Second, true},    // over: a new window
	} {
		if got := w.Take(tc.key, t0.Add(tc.at)); got != tc.want {
			t.Fatalf("step %d: Take(%s, +%v) = %v, want %v", i, tc.key, tc.at, got, tc.want)
		}
	}
	if w.Len() != 2 {
		t.Fatalf("%d keys remembered, want 2", w.Len())
	}
	// Allow does not count.
	v := Keyed[int]{Length: time.Second, Max: 1, Cap: 4}
	for range 3 {
		if !v.Allow(1, t0) {
			t.Fatal("Allow counted an event")
		}
	}
	if v.Add(1, t0); v.Allow(1, t0) {
		t.Fatal("a full window allowed one more")
	}
}
