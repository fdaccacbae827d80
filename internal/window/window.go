// Package window counts events per key in fixed windows of time, for a bounded number of
// keys: the per-peer limits of the protocols (caps-sync answers a peer gets, bandwidth probes
// a peer starts or is sent, warnings logged once per peer and interval).
//
// A key's window starts at its first event and lasts Length; it holds at most Max events;
// the next event after it starts a new window. At most Cap keys are remembered: a new key
// when Cap are, and none of their windows has ended, is refused, so that a flood of new
// keys costs a bounded map and never pushes out the keys being limited.
//
// This package imports the standard library only (internal/), and a Keyed is not safe for
// concurrent use: its owner guards it.
package window

import "time"

// Keyed is the windows of the keys seen. Set Length, Max and Cap before use.
type Keyed[K comparable] struct {
	Length time.Duration // of a window
	Max    int           // events a window holds
	Cap    int           // keys remembered

	m map[K]count
}

type count struct {
	start time.Time
	n     int
}

// Allow reports whether one more event of k fits at now, without counting it (Add does).
// When k is new and Cap keys are remembered, it forgets those whose window has ended.
func (w *Keyed[K]) Allow(k K, now time.Time) bool {
	c, ok := w.m[k]
	if ok {
		return now.Sub(c.start) >= w.Length || c.n < w.Max
	}
	if len(w.m) >= w.Cap {
		for q, c := range w.m {
			if now.Sub(c.start) >= w.Length {
				delete(w.m, q)
			}
		}
	}
	return len(w.m) < w.Cap && w.Max > 0
}

// Add counts an event of k at now, which Allow said fits.
func (w *Keyed[K]) Add(k K, now time.Time) {
	if w.m == nil {
		w.m = make(map[K]count)
	}
	c, ok := w.m[k]
	if !ok || now.Sub(c.start) >= w.Length {
		c = count{start: now}
	}
	c.n++
	w.m[k] = c
}

// Take counts an event of k at now if it fits, and reports whether it did.
func (w *Keyed[K]) Take(k K, now time.Time) bool {
	if !w.Allow(k, now) {
		return false
	}
	w.Add(k, now)
	return true
}

// Len is the number of keys remembered.
func (w *Keyed[K]) Len() int { return len(w.m) }
