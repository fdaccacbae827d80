package participation

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// allowN admits at now until refused and returns how many got in.
func allowN(r *RateLimiter, limit int, now time.Time) int {
	n := 0
	for n <= limit && r.Allow("a", limit, now) {
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
		if !r.Allow("a", 5, at) {
			t.Fatalf("admission %d refused under the limit", i)
		}
	}
	if r.Allow("a", 5, t0.Add(59*time.Second)) || !r.Full(5, t0.Add(59*time.Second)) {
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
		if !r.Allow("a", 0, t0) {
			t.Fatalf("admission %d refused with no limit", i)
		}
	}
	if r.Full(0, t0) || r.Full(-1, t0) || !r.Allow("a", -1, t0) {
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
		if !r.Allow("a", 10, t0.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("admission %d refused", i)
		}
	}
	at := t0.Add(20 * time.Second)
	// Lowered to 4: full at once, and stays full until the 4th-newest admission (t0+6s)
	// leaves the window.
	if !r.Full(4, at) || r.Allow("a", 4, at) {
		t.Fatalf("a lowered limit did not take effect at once")
	}
	if r.Allow("a", 4, t0.Add(65*time.Second)) {
		t.Fatalf("allowed at t0+65s: the admissions at t0+6s … t0+9s are still in the window")
	}
	if !r.Allow("a", 4, t0.Add(66*time.Second)) {
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
			if got := r.Allow("a", limit, now); got != want {
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

// A requester alone uses the whole budget, however often it asks; refusals of its own do
// not hold anything back from it.
func TestRateLimiterLoneRequesterGetsTheBudget(t *testing.T) {
	var r RateLimiter
	for i := range 3 {
		at := t0.Add(time.Duration(i) * RateWindow)
		if got := allowN(&r, 10, at); got != 10 {
			t.Fatalf("window %d: a lone requester admitted %d, want 10", i, got)
		}
		if r.Allow("a", 10, at.Add(RateWindow-time.Millisecond)) {
			t.Fatalf("window %d: an 11th admission within 60 s", i)
		}
	}
}

// One requester floods; a second asks once a second. As the flood's admissions age out,
// the second is admitted first every time, until both have half the budget; the
// total never exceeds the limit.
func TestRateLimiterFloodLeavesAShare(t *testing.T) {
	const limit = 10
	var r RateLimiter
	if got := allowN(&r, limit, t0); got != limit { // "a" takes the whole budget at t0
		t.Fatalf("flood admitted %d, want %d", got, limit)
	}
	type ask struct {
		at time.Time
		ok bool
	}
	var a, b []ask
	for s := 1; s <= 300; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		for range 5 { // the flood asks first, five times a second
			a = append(a, ask{now, r.Allow("a", limit, now)})
		}
		b = append(b, ask{now, r.Allow("b", limit, now)})
	}
	inWindow := func(asks []ask, end time.Time) int {
		n := 0
		for _, x := range asks {
			if x.ok && end.Sub(x.at) < RateWindow && !x.at.After(end) {
				n++
			}
		}
		return n
	}
	// b is refused until the flood's admissions age out at t0+60s, then admitted.
	firstB := -1
	for i, x := range b {
		if x.ok {
			firstB = i
			break
		}
	}
	if got := b[firstB].at; firstB < 0 || got != t0.Add(RateWindow) {
		t.Fatalf("b first admitted at %v, want t0+60s", got)
	}
	for s := 61; s <= 300; s++ {
		end := t0.Add(time.Duration(s) * time.Second)
		na, nb := inWindow(a, end), inWindow(b, end)
		if s <= 60 {
			na += limit // the flood's admissions at t0
		}
		if na+nb > limit {
			t.Fatalf("at t0+%ds: %d + %d admissions in the window, limit %d", s, na, nb, limit)
		}
		if s >= 120 && (nb != limit/2 || na != limit/2) {
			t.Fatalf("at t0+%ds: a has %d, b %d of %d: want about half each", s, na, nb, limit)
		}
	}
}

// With a budget of one, two requesters asking all the time take turns.
func TestRateLimiterBudgetOfOneAlternates(t *testing.T) {
	var r RateLimiter
	var got []string
	for s := 0; s < 6*60; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		for _, who := range []string{"a", "b"} { // a always asks first
			if r.Allow(who, 1, now) {
				got = append(got, who)
			}
		}
	}
	if want := []string{"a", "b", "a", "b", "a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("admitted %v, want %v", got, want)
	}
}

// Admissions kept for a waiting requester that never comes back (its share) are freed when
// its wait ages out; meanwhile the others use the rest of the budget.
func TestRateLimiterWaitingRequesterHoldsItsShare(t *testing.T) {
	var r RateLimiter
	if allowN(&r, 4, t0) != 4 || r.Allow("b", 4, t0.Add(time.Second)) {
		t.Fatalf("set-up: a takes the budget, b is refused")
	}
	at := t0.Add(RateWindow) // a's four admissions age out: b keeps its share, 2
	if got := allowN(&r, 4, at); got != 2 {
		t.Fatalf("a admitted %d while b waits, want 2", got)
	}
	if got := allowN(&r, 4, t0.Add(RateWindow+time.Second)); got != 2 { // b's wait aged out
		t.Fatalf("a admitted %d once b's wait aged out, want 2", got)
	}
}

// However many requesters ask and are refused, the limiter remembers at most the budget's
// admissions and maxWaiting waiting requesters.
func TestRateLimiterMemoryIsBounded(t *testing.T) {
	var r RateLimiter
	for i := range 10_000 {
		r.Allow(fmt.Sprint("peer", i), 8, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if len(r.ring) != 8 || len(r.used) > 8 || len(r.waiting) > maxWaiting {
		t.Fatalf("ring %d, used %d, waiting %d: want 8, ≤ 8, ≤ %d", len(r.ring), len(r.used), len(r.waiting), maxWaiting)
	}
}

// TestRateLimiterFairProperty drives random requesters against a brute-force history: the
// admissions in any window never exceed the limit, a refusal with room in the window
// happens only while another requester refused within the window has fewer admissions in
// it (or as many, admitted less recently), and the limiter's memory stays bounded.
func TestRateLimiterFairProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 6))
	type event struct {
		at   time.Time
		from string
		ok   bool
	}
	for trial := range 100 {
		var r RateLimiter
		var hist []event
		now := t0
		limit := 1 + rng.IntN(12)
		peers := 1 + rng.IntN(5)
		for i := range 1500 {
			now = now.Add(time.Duration(rng.Int64N(int64(3 * time.Second))))
			from := fmt.Sprint("p", rng.IntN(peers))
			hist = slices.DeleteFunc(hist, func(e event) bool { return now.Sub(e.at) >= RateWindow })
			admitted := map[string]int{}
			total := 0
			for _, e := range hist {
				if e.ok {
					admitted[e.from]++
					total++
				}
			}
			ok := r.Allow(from, limit, now)
			if ok && total >= limit {
				t.Fatalf("trial %d step %d: admitted %s over the limit %d", trial, i, from, limit)
			}
			if !ok && total < limit {
				// Someone refused in the window with fewer admissions (or as many) than from.
				before := false
				for _, e := range hist {
					if !e.ok && e.from != from && admitted[e.from] <= admitted[from] {
						before = true
					}
				}
				if !before {
					t.Fatalf("trial %d step %d: %s refused with %d of %d used and nobody with less waiting", trial, i, from, total, limit)
				}
			}
			hist = append(hist, event{now, from, ok})
			if len(r.used) > limit || len(r.waiting) > maxWaiting || len(r.ring) > limit {
				t.Fatalf("trial %d step %d: memory used %d, waiting %d, ring %d", trial, i, len(r.used), len(r.waiting), len(r.ring))
			}
		}
	}
}
