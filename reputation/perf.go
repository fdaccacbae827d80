package reputation

import (
	"math"
	"time"
)

// perfRef is the yardstick a peer's speed is measured against: the mean over measured
// peers of their moving averages, in the same log2 units as peerScore. Each peer counts
// once however much traffic it gets, so a busy peer cannot become the yardstick.
//
// The sums are exact and updated incrementally (recomputed whenever the store walks all
// entries, which bounds floating-point drift). The published means, which scores use, move
// only when the live means drift by more than refTolerance; each move bumps epoch and so
// invalidates every cached score. With many peers one sample barely moves the mean, so
// caches survive; with few peers they are cheap to rebuild.
type perfRef struct {
	sumLat, sumTput float64
	nLat, nTput     int

	lat, tput       float64 // published means
	hasLat, hasTput bool
	epoch           uint64 // starts at 1 in New; 0 marks a stale peer cache
}

// refTolerance is how far (log2 units) the live yardstick may drift from the published one
// before scores are recomputed: 0.01 is 0.7 % in speed and at most 0.08 score points at
// the default weights.
const refTolerance = 0.01

// add adds (sign +1) or removes (sign -1) ps's averages to or from the sums; publish must
// follow.
func (r *perfRef) add(ps *peerScore, sign float64) {
	if ps.hasLat {
		r.sumLat += sign * ps.perfLat
		r.nLat += int(sign)
	}
	if ps.hasTput {
		r.sumTput += sign * ps.perfTput
		r.nTput += int(sign)
	}
}

// publish moves the published means to the live ones if they drifted past refTolerance or
// an axis appeared or vanished.
func (r *perfRef) publish() {
	lat, hasLat := mean(r.sumLat, r.nLat)
	tput, hasTput := mean(r.sumTput, r.nTput)
	if hasLat == r.hasLat && hasTput == r.hasTput &&
		math.Abs(lat-r.lat) <= refTolerance && math.Abs(tput-r.tput) <= refTolerance {
		return
	}
	r.lat, r.tput, r.hasLat, r.hasTput = lat, tput, hasLat, hasTput
	r.epoch++
}

func mean(sum float64, n int) (float64, bool) {
	if n <= 0 {
		return 0, false
	}
	return sum / float64(n), true
}

// confidence is how much the performance average counts, in [0, 1].
func (ps *peerScore) confidence(p *Params) float64 {
	return min(ps.perfConf/p.PerformanceSamples, 1)
}

// perfRel is the peer's speed relative to the yardstick in log2 units, clamped to
// ±PerformanceRange and scaled by confidence: positive is faster. Latency and throughput
// count equally when both are known.
func (ps *peerScore) perfRel(p *Params, ref *perfRef) float64 {
	var d float64
	n := 0
	if ps.hasLat && ref.hasLat {
		d += ref.lat - ps.perfLat
		n++
	}
	if ps.hasTput && ref.hasTput {
		d += ps.perfTput - ref.tput
		n++
	}
	if n == 0 {
		return 0
	}
	rel := max(-p.PerformanceRange, min(d/float64(n), p.PerformanceRange))
	return rel * ps.confidence(p)
}

// RecordPerformance records one completed request's speed for peer at now: latency (time to
// first token, or whatever latency the router measures the same way for all peers) and
// throughput (tokens per second). A non-positive or non-finite value means "not measured";
// a sample with neither is ignored. Peers are compared with the mean over measured peers.
func (s *Store) RecordPerformance(peer string, latency time.Duration, throughput float64, now time.Time) {
	hasLat := latency > 0
	hasTput := throughput > 0 && !math.IsInf(throughput, 0) // NaN fails the comparison
	if !hasLat && !hasTput {
		return
	}
	var lat, tput float64
	if hasLat {
		lat = math.Log2(latency.Seconds())
	}
	if hasTput {
		tput = math.Log2(throughput)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peerEventLocked(peer, now, "", func(ps *peerScore) {
		// Stale history weighs less than fresh: with no confidence left, the new sample
		// replaces the old average outright.
		alpha := max(perfSmoothing, 1-ps.confidence(&s.p))
		s.ref.add(ps, -1)
		if hasLat {
			ps.perfLat = blend(ps.perfLat, lat, alpha, ps.hasLat)
			ps.hasLat = true
		}
		if hasTput {
			ps.perfTput = blend(ps.perfTput, tput, alpha, ps.hasTput)
			ps.hasTput = true
		}
		s.ref.add(ps, +1)
		s.ref.publish()
		ps.perfConf = min(ps.perfConf+1, s.p.PerformanceSamples)
	})
}

// blend is one step of an exponential moving average; the first sample initialises it.
func blend(avg, x, alpha float64, has bool) float64 {
	if !has {
		return x
	}
	return avg + alpha*(x-avg)
}

// Performance returns peer's selection factor as of now: 2^rel, where rel is its
// confidence-weighted speed relative to the mean of measured peers in log2 units. It lies
// in [2^-PerformanceRange, 2^PerformanceRange]; 1 is par, and an unmeasured or stale peer
// drifts back to 1.
func (s *Store) Performance(peer string, now time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.candidateLocked(s.entries[peer], now, s.tickLocked(now)).Performance
}
