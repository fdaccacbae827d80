package participation

import "time"

// RateWindow is the rate limiter's window (60 s): max_tasks_per_min counts admissions in any
// 60 s span, sliding, so a burst at the end of one minute and the start of the next cannot
// double the rate as fixed per-minute buckets would allow.
const RateWindow = time.Minute

// RateLimiter enforces max_tasks_per_min at admission: at most limit admissions in any
// RateWindow. It keeps the times of the admissions still in the window in a ring sized to the
// limit, or to those admissions while a higher limit's admissions age out, so it never holds
// more than MaxTasksPerMinLimit. The zero value is ready to use. A RateLimiter is not safe for
// concurrent use; its owner holds a lock around it.
type RateLimiter struct {
	ring []time.Time // admission times, oldest at head; len(ring) = max(limit, n)
	head int         // index of the oldest admission kept
	n    int         // admissions kept
}

// Allow reports whether a task may be admitted at now, and if so counts it. limit is the
// effective MaxTasksPerMin, read on every call so that a changed limit takes effect at once:
// after lowering it, nothing is admitted until fewer than limit admissions remain in the
// window. A limit of 0 (or below) means no limit; those admissions are not counted. A limit
// above MaxTasksPerMinLimit counts as MaxTasksPerMinLimit.
func (r *RateLimiter) Allow(limit int, now time.Time) bool {
	if limit <= 0 {
		return true
	}
	limit = min(limit, MaxTasksPerMinLimit)
	r.expire(now)
	r.resize(max(limit, r.n))
	if r.n >= limit {
		return false
	}
	r.ring[(r.head+r.n)%len(r.ring)] = now
	r.n++
	return true
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
		if now.Sub(r.ring[(r.head+i)%len(r.ring)]) < RateWindow {
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
	ring := make([]time.Time, size)
	for i := range r.n {
		ring[i] = r.ring[(r.head+i)%len(r.ring)]
	}
	r.ring, r.head = ring, 0
}

// expire drops admissions that left the window. The ring is in admission order; a clock
// that went backwards keeps admissions longer, never shorter.
func (r *RateLimiter) expire(now time.Time) {
	for r.n > 0 && now.Sub(r.ring[r.head]) >= RateWindow {
		r.ring[r.head] = time.Time{}
		r.head = (r.head + 1) % len(r.ring)
		r.n--
	}
}
