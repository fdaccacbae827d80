package bandwidth

import (
	"math"
	"slices"
	"sync"
	"time"
)

const (
	// PastWeight is the weight, in logarithms, an estimate keeps against a sample taken
	// right after it: 0.4, so three samples at a new rate leave 6.4 % of the old one (a
	// tenfold change tracked within 16 %), and one odd sample moves it 60 % of the way.
	PastWeight = 0.4
	// HalfLife is the age at which the weight an estimate keeps against a new sample has
	// halved again: 2 min. A rate measured a quarter of an hour before counts for 0.2 % of
	// the mix: the path may have changed since.
	HalfLife = 2 * time.Minute
	// Recent is how old a peer's Down estimate may be and still count towards the node's
	// downlink: 10 min, five half-lives.
	Recent = 10 * time.Minute
	// MaxPeers bounds the peers an Estimator keeps: 1024, far above the connections a node
	// keeps (node/host.go), so only peers met long ago are forgotten.
	MaxPeers = 1024
)

// Rate is a per-direction estimate.
type Rate struct {
	// BytesPerSec is the estimate, in bytes per second; 0 when never measured.
	BytesPerSec float64
	// At is when the latest sample was taken (the clock the samples were given with).
	At time.Time
	// Samples counts the samples the estimate is made of.
	Samples int
}

// Mbps is the estimate in Mbit/s, as the capability vector and the console show it.
func (r Rate) Mbps() float64 { return r.BytesPerSec * 8 / 1e6 }

// Measured reports whether the estimate has a sample taken within d before now.
func (r Rate) Measured(now time.Time, d time.Duration) bool {
	return r.Samples > 0 && now.Sub(r.At) <= d
}

// add is r moved by a sample of rate bps taken at: see the package doc.
func (r Rate) add(bps float64, at time.Time) Rate {
	if r.Samples == 0 {
		return Rate{BytesPerSec: bps, At: at, Samples: 1}
	}
	age := max(at.Sub(r.At), 0) // a sample older than the estimate counts as taken with it
	w := PastWeight * math.Exp2(-age.Seconds()/HalfLife.Seconds())
	est := math.Exp(w*math.Log(r.BytesPerSec) + (1-w)*math.Log(bps))
	return Rate{BytesPerSec: est, At: later(r.At, at), Samples: r.Samples + 1}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Estimate is what is known of the bandwidth with one peer, each way.
type Estimate struct {
	Down Rate // from the peer to this node
	Up   Rate // from this node to the peer
}

// At is when the latest sample of either direction was taken; zero when none was.
func (e Estimate) At() time.Time { return later(e.Down.At, e.Up.At) }

// Estimator keeps the bandwidth estimates of this node's peers. It is safe for concurrent
// use; its methods are pure functions of its state and the times given, it runs nothing in
// the background.
type Estimator struct {
	mu    sync.Mutex
	peers map[string]Estimate // at most MaxPeers
}

// New returns an empty Estimator.
func New() *Estimator { return &Estimator{peers: make(map[string]Estimate)} }

// Observe adds t, a transfer with peer taken at (the end of the transfer, by the clock the
// estimates are read with), if it is a sample (Transfer.Rate). It reports whether it was.
func (e *Estimator) Observe(peer string, t Transfer, at time.Time) bool {
	bps, ok := t.Rate()
	if !ok {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	est, known := e.peers[peer]
	if !known && len(e.peers) >= MaxPeers {
		e.evictLocked()
	}
	if t.Dir == Down {
		est.Down = est.Down.add(bps, at)
	} else {
		est.Up = est.Up.add(bps, at)
	}
	e.peers[peer] = est
	return true
}

// evictLocked forgets the peer measured least recently. e.mu is held.
func (e *Estimator) evictLocked() {
	var (
		oldest string
		at     time.Time
		found  bool
	)
	for p, est := range e.peers {
		if !found || est.At().Before(at) {
			oldest, at, found = p, est.At(), true
		}
	}
	delete(e.peers, oldest)
}

// Get returns what is known of peer, and whether anything is.
func (e *Estimator) Get(peer string) (Estimate, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	est, ok := e.peers[peer]
	return est, ok
}

// Downlink is the node's downlink as of now, in bytes per second: the lower median of the
// Down estimates moved within Recent, or 0 when there is none.
func (e *Estimator) Downlink(now time.Time) float64 {
	e.mu.Lock()
	rates := make([]float64, 0, len(e.peers))
	for _, est := range e.peers {
		if est.Down.Measured(now, Recent) {
			rates = append(rates, est.Down.BytesPerSec)
		}
	}
	e.mu.Unlock()
	if len(rates) == 0 {
		return 0
	}
	slices.Sort(rates)
	return rates[(len(rates)-1)/2]
}
