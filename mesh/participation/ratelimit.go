package participation

import "time"

// RateWindow is the rate limiter's window (60 s): max_tasks_per_min counts admissions in any
// 60 s span, sliding, so a burst at the end of one minute and the start of the next cannot
// double the rate as fixed per-minute buckets would allow.
const RateWindow = time.Minute

// RateLimiter enforces max_tasks_per_min at admission: at most limit admissions in any
// RateWindow, shared fairly between the requesters that ask for them.
//
// Fair shares: a requester refused within the last RateWindow is waiting. The contenders
// are the requesters with admissions in the window, the waiting ones and the one asking;
// each one's share is limit ÷ contenders, rounded up. While the window has room:
//
//   - a requester that has used its share or more is refused while the free admissions are
//     no more than what the waiting requesters under their share still lack of it: those
//     are kept for their next asks;
//   - a requester under its share is refused only while the free admissions are no more
//     than the waiting requesters before it (fewer admissions in the window, or as many and
//     the last one longer ago, or none ever), one kept for each: that settles a tie, such as
//     a limit of 1 between two requesters, in turns.
//
// So when the budget is contended the one that used more is refused before the one that
// used less, and a flood by one requester keeps another out no longer than until one of
// the flood's admissions ages out; a requester alone (nobody else refused within the
// window) may use the whole budget. Admissions kept for a waiting requester that does not
// come back are freed when its wait ages out, within RateWindow.
//
// It keeps the times and requesters of the admissions still in the window in a ring sized
// to the limit, or to those admissions while a higher limit's admissions age out, so it
// never holds more than MaxTasksPerMinLimit; a count per requester of those admissions; and
// at most maxWaiting waiting requesters (past that, the one refused longest ago is
// forgotten). The zero value is ready to use. A RateLimiter is not safe for concurrent use;
// its owner holds a lock around it.
type RateLimiter struct {
	ring    []admission       // oldest at head; len(ring) = max(limit, n)
	head    int               // index of the oldest admission kept
	n       int               // admissions kept
	used    map[string]usage  // admissions kept, per requester (no zero entries)
	waiting map[string]waiter // requesters refused within the window
}

// usage is a requester's admissions kept: how many, and the last one's time.
type usage struct {
	n    int
	last time.Time
}

// waiter is a waiting requester: its last refusal, and its last admission (zero: none
// known), kept after that admission leaves the window.
type waiter struct {
	refused, admitted time.Time
}

// admission is one admission kept: when, and for whom.
type admission struct {
	at   time.Time
	from string
}

// maxWaiting bounds the waiting requesters a RateLimiter remembers.
const maxWaiting = 64

// Allow reports whether a task of requester from may be admitted at now, and if so counts
// it; a refusal makes from a waiting requester (see RateLimiter). limit is the effective
// MaxTasksPerMin, read on every call so that a changed limit takes effect at once: after
// lowering it, nothing is admitted until fewer than limit admissions remain in the window.
// A limit of 0 (or below) means no limit; those admissions are not counted. A limit above
// MaxTasksPerMinLimit counts as MaxTasksPerMinLimit.
func (r *RateLimiter) Allow(from string, limit int, now time.Time) bool {
	if limit <= 0 {
		return true
	}
	limit = min(limit, MaxTasksPerMinLimit)
	r.expire(now)
	r.resize(max(limit, r.n))
	if r.n >= limit || limit-r.n <= r.reserved(from, limit) {
		r.wait(from, now)
		return false
	}
	r.ring[(r.head+r.n)%len(r.ring)] = admission{at: now, from: from}
	r.n++
	if r.used == nil {
		r.used = make(map[string]usage)
	}
	r.used[from] = usage{n: r.used[from].n + 1, last: now}
	if w, ok := r.waiting[from]; ok {
		w.admitted = now
		r.waiting[from] = w
	}
	return true
}

// reserved is how many free admissions are kept from from for waiting requesters (see
// RateLimiter).
func (r *RateLimiter) reserved(from string, limit int) int {
	contenders := len(r.used)
	for w := range r.waiting {
		if _, ok := r.used[w]; !ok {
			contenders++
		}
	}
	_, inUsed := r.used[from]
	_, inWaiting := r.waiting[from]
	if !inUsed && !inWaiting {
		contenders++
	}
	share := (limit + contenders - 1) / contenders
	mine, mineLast := r.rank(from)
	kept := 0
	for w := range r.waiting {
		if w == from {
			continue
		}
		used, last := r.rank(w)
		switch {
		case mine >= share && used < share:
			kept += share - used
		case mine < share && (used < mine || used == mine && last.Before(mineLast)):
			kept++
		}
	}
	return kept
}

// rank is from's place in the order of fair shares: its admissions in the window and its
// last known admission.
func (r *RateLimiter) rank(from string) (int, time.Time) {
	if u, ok := r.used[from]; ok {
		return u.n, u.last
	}
	return 0, r.waiting[from].admitted
}

// wait records from's refusal at now; past maxWaiting the requester refused longest ago is
// forgotten.
func (r *RateLimiter) wait(from string, now time.Time) {
	if r.waiting == nil {
		r.waiting = make(map[string]waiter)
	}
	w, ok := r.waiting[from]
	if !ok && len(r.waiting) >= maxWaiting {
		oldest, first := "", true
		for x, xw := range r.waiting {
			if first || xw.refused.Before(r.waiting[oldest].refused) {
				oldest, first = x, false
			}
		}
		delete(r.waiting, oldest)
	}
	w.refused = now
	if u, ok := r.used[from]; ok {
		w.admitted = u.last
	}
	r.waiting[from] = w
}

// Full reports whether Allow(limit, now) would refuse, without counting anything; status
// shows rate_limited while it holds.
func (r *RateLimiter) Full(limit int, now time.Time) bool {
	if limit <= 0 {
		return false
	}
	limit = min(limit, MaxTasksPerMinLimit)
	recent := 0
	for i := range r.n {
		if now.Sub(r.ring[(r.head+i)%len(r.ring)].at) < RateWindow {
			recent++
		}
	}
	return recent >= limit
}

// resize makes the ring hold exactly size entries, size ≥ r.n, keeping every admission.
func (r *RateLimiter) resize(size int) {
	if len(r.ring) == size {
		return
	}
	ring := make([]admission, size)
	for i := range r.n {
		ring[i] = r.ring[(r.head+i)%len(r.ring)]
	}
	r.ring, r.head = ring, 0
}

// expire drops admissions and waits that left the window. The ring is in admission order;
// a clock that went backwards keeps admissions longer, never shorter.
func (r *RateLimiter) expire(now time.Time) {
	for r.n > 0 && now.Sub(r.ring[r.head].at) >= RateWindow {
		from := r.ring[r.head].from
		if u := r.used[from]; u.n > 1 {
			r.used[from] = usage{n: u.n - 1, last: u.last}
		} else {
			delete(r.used, from)
		}
		r.ring[r.head] = admission{}
		r.head = (r.head + 1) % len(r.ring)
		r.n--
	}
	for x, w := range r.waiting {
		if now.Sub(w.refused) >= RateWindow {
			delete(r.waiting, x)
		}
	}
}
