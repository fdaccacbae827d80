package bwprobe

import (
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// starts remembers when each peer's latest probe started, for at most maxPeersRemembered
// peers. Its owner guards it.
type starts map[peer.ID]time.Time

// due reports whether a probe of p may start at now, interval after its latest (the caller
// records the start). A peer not remembered is due, unless the map is full of peers whose
// interval is not over: then nobody new is.
func (s starts) due(p peer.ID, now time.Time, interval time.Duration) bool {
	last, ok := s[p]
	if ok && now.Sub(last) < interval {
		return false
	}
	if !ok && len(s) >= maxPeersRemembered {
		for q, t := range s {
			if now.Sub(t) >= interval {
				delete(s, q)
			}
		}
		if len(s) >= maxPeersRemembered {
			return false
		}
	}
	return true
}

// window counts the starts in a fixed window of time.
type window struct {
	start time.Time
	n     int
}

// allow reports whether one more start fits the window of length d holding at most max
// starts at now; if so it counts it.
func (w *window) allow(now time.Time, d time.Duration, max int) bool {
	if w.n == 0 || now.Sub(w.start) >= d || now.Before(w.start) {
		w.start, w.n = now, 0
	}
	if w.n >= max {
		return false
	}
	w.n++
	return true
}
