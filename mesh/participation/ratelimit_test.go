package participation

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// allowN admits at now until refused and returns how many got in.
func allowN(r *RateLimiter, limit int, now time.Time) int {
	n := 0
	for n <= limit && r.Allow(limit, now) {
		n++
	}
	return n
}

func TestRateLimiterWindowSlides(t *testing.T) {
	var r RateLimiter
	// 3 at t0, 2 at t0+30s: a limit of 5 is used up.
	for i := range 5 {
		at := t0
		if i >= 3 {
			at = t0.Add(30 * time.Second)
		}
		if !r.Allow(5, at) {
			t.Fatalf("admission %d refused under the limit", i)
		}
	}
	if r.Allow(5, t0.Add(59*time.Second)) || !r.Full(5, t0.Add(59*time.Second)) {
		t.Fatalf("6th admission within 60 s allowed, or Full false")
	}
	// At t0+60s the three oldest leave the window: three more fit, not four.
	at := t0.Add(time.Minute)
	if r.Full(5, at) {
		t.Fatalf("Full at t0+60s, want room for three")
	}
	if got := allowN(&r, 5, at); got != 3 {
		t.Fatalf("admitted %d at t0+60s, want 3", got)
	}
	// A fixed per-minute bucket would allow 5 more at t0+60s; the sliding window never
	// allows more than 5 in [t0+30s, t0+90s).
	if got := allowN(&r, 5, t0.Add(89*time.Second)); got != 0 {
		t.Fatalf("admitted %d at t0+89s, want 0", got)
	}
	if got := allowN(&r, 5, t0.Add(90*time.Second)); got != 2 {
		t.Fatalf("admitted %d at t0+90s, want 2", got)
	}
}

func TestRateLimiterUnlimited(t *testing.T) {
	var r RateLimiter
	for i := range 100_000 {
		if !r.Allow(0, t0) {
			t.Fatalf("admission %d refused with no limit", i)
		}
	}
	if r.Full(0, t0) || r.Full(-1, t0) || !r.Allow(-1, t0) {
		t.Fatalf("a limit of 0 or below must never refuse")
	}
	if len(r.ring) != 0 {
		t.Fatalf("unlimited admissions were stored: ring of %d", len(r.ring))
	}
	// Admissions under no limit are not counted against a limit set later.
	if got := allowN(&r, 3, t0); got != 3 {
		t.Fatalf("admitted %d after switching to a limit of 3, want 3", got)
	}
}

func TestRateLimiterLimitChanges(t *testing.T) {
	var r RateLimiter
	for i := range 10 {
		if !r.Allow(10, t0.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("admission %d refused", i)
		}
	}
	at := t0.Add(20 * time.Second)
	// Lowered to 4: full at once, and stays full until the 4th-newest admission (t0+6s)
	// leaves the window.
	if !r.Full(4, at) || r.Allow(4, at) {
		t.Fatalf("a lowered limit did not take effect at once")
	}
	if r.Allow(4, t0.Add(65*time.Second)) {
		t.Fatalf("allowed at t0+65s: the admissions at t0+6s … t0+9s are still in the window")
	}
	if !r.Allow(4, t0.Add(66*time.Second)) {
		t.Fatalf("refused at t0+66s: only 3 admissions are in the window")
	}
	if len(r.ring) != 4 {
		t.Fatalf("ring holds %d entries once the old admissions aged out, want 4", len(r.ring))
	}
	// Raised to 6: two more fit, and the admissions kept still count.
	at = t0.Add(66*time.Second + 500*time.Millisecond)
	if got := allowN(&r, 6, at); got != 2 {
		t.Fatalf("admitted %d after raising to 6, want 2", got)
	}
	// Above the cap counts as the cap.
	var big RateLimiter
	if got := allowN(&big, MaxTasksPerMinLimit*10, t0); got != MaxTasksPerMinLimit {
		t.Fatalf("admitted %d with a huge limit, want the cap %d", got, MaxTasksPerMinLimit)
	}
	if !big.Full(MaxTasksPerMinLimit*10, t0) {
		t.Fatalf("Full false at the cap")
	}
}

// TestRateLimiterProperty checks random admissions with random limit changes against a
// brute-force count over every admission ever made.
func TestRateLimiterProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 5))
	for trial := range 200 {
		var r RateLimiter
		var admitted []time.Time
		now := t0
		limit := 1 + rng.IntN(20)
		for i := range 2000 {
			now = now.Add(time.Duration(rng.Int64N(int64(8 * time.Second))))
			if rng.IntN(100) == 0 {
				limit = rng.IntN(20) // sometimes 0: unlimited
			}
			// Time only moves forward here, so admissions out of the window stay out.
			admitted = slices.DeleteFunc(admitted, func(a time.Time) bool { return now.Sub(a) >= RateWindow })
			inWindow := len(admitted)
			// With limit 0 nothing is recorded, so the reference forgets too.
			want := limit <= 0 || inWindow < limit
			if full := r.Full(limit, now); full == want {
				t.Fatalf("trial %d step %d: Full(%d) = %v with %d in the window", trial, i, limit, full, inWindow)
			}
			if got := r.Allow(limit, now); got != want {
				t.Fatalf("trial %d step %d: Allow(%d) = %v, want %v (%d in the window)", trial, i, limit, got, want, inWindow)
			}
			if want && limit > 0 {
				admitted = append(admitted, now)
			}
			if limit > 0 && len(r.ring) > max(limit, inWindow) {
				t.Fatalf("trial %d step %d: ring of %d entries for a limit of %d and %d in the window", trial, i, len(r.ring), limit, inWindow)
			}
		}
	}
}
