package webrtc

import (
	"cmp"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// connView is what the pool's rules look at of a PeerConnection.
type connView struct {
	peer     peer.ID
	streams  int       // open streams
	lastUsed time.Time // when a stream last opened or ended
}

// evictions returns the indices of the PeerConnections to close so that at most maxPerPeer
// remain per peer and at most maxTotal in all, never keep's. It closes idle ones (no open
// stream) before busy ones, whose streams would break, and the least recently used first.
func evictions(cs []connView, keep, maxTotal, maxPerPeer int) []int {
	order := make([]int, 0, len(cs))
	perPeer := make(map[peer.ID]int)
	for i, c := range cs {
		perPeer[c.peer]++
		if i != keep {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if busyA, busyB := cs[a].streams > 0, cs[b].streams > 0; busyA != busyB {
			if busyA {
				return 1
			}
			return -1
		}
		return cmp.Compare(cs[a].lastUsed.UnixNano(), cs[b].lastUsed.UnixNano())
	})
	var out []int
	gone := make(map[int]bool)
	for _, i := range order {
		if p := cs[i].peer; perPeer[p] > maxPerPeer {
			perPeer[p]--
			gone[i] = true
			out = append(out, i)
		}
	}
	total := len(cs) - len(out)
	for _, i := range order {
		if total <= maxTotal {
			break
		}
		if !gone[i] {
			total--
			out = append(out, i)
		}
	}
	return out
}

// warmShare is the most PeerConnections one peer may hold in a pool of maxWarm:
// maxConnsPerPeer, and at most a quarter of the pool (but one), so that a peer that sets
// up again and again only ever replaces its own.
func warmShare(maxWarm int) int {
	return max(1, min(maxConnsPerPeer, maxWarm/4))
}

// idleExpired reports whether c has had no open stream for idle at now.
func idleExpired(c connView, now time.Time, idle time.Duration) bool {
	return c.streams == 0 && now.Sub(c.lastUsed) >= idle
}

// sweepInterval is the idle sweep's period for an IdleClose of idle.
func sweepInterval(idle time.Duration) time.Duration {
	return min(max(idle/4, 10*time.Millisecond), maxSweepInterval)
}

// sweepLoop closes idle PeerConnections until Close.
func (t *Transport) sweepLoop() {
	defer t.wg.Done()
	tick := time.NewTicker(sweepInterval(t.cfg.IdleClose))
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
			t.sweep()
		}
	}
}

// sweep closes the PeerConnections idle for IdleClose at t.cfg.Now().
func (t *Transport) sweep() {
	now := t.cfg.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range slices.Clone(t.conns) {
		if idleExpired(c.viewLocked(), now, t.cfg.IdleClose) && t.goLocked(func() { c.close(errIdle) }) {
			c.dead = true
			t.removeLocked(c)
			t.idleClosed.Add(1)
		}
	}
}
