package bwprobe

import (
	"time"
)

// span counts the starts in a fixed window of time, all peers together.
type span struct {
	start time.Time
	n     int
}

// allow reports whether one more start fits the window of length d holding at most max
// starts at now; if so it counts it.
func (w *span) allow(now time.Time, d time.Duration, max int) bool {
	if w.n == 0 || now.Sub(w.start) >= d || now.Before(w.start) {
		w.start, w.n = now, 0
	}
	if w.n >= max {
		return false
	}
	w.n++
	return true
}
