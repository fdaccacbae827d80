package reputation

import (
	"math"
	"time"
)

// Event is a node-score signal that does not come from Record: missed heartbeats and
// integrity checks.
type Event uint8

const (
	// HeartbeatMissed is an availability debit (Params.HeartbeatMissedWeight).
	HeartbeatMissed Event = iota + 1
	// VerificationPassed is an integrity credit (Params.VerifyPassedWeight).
	VerificationPassed
	// VerificationFailed is an integrity debit (Params.VerifyFailedWeight).
	VerificationFailed
	// ForgedAnnouncement is an integrity debit (Params.ForgedWeight).
	ForgedAnnouncement
	// MalformedFrame is an integrity debit (Params.MalformedWeight): a frame that does not
	// parse, or is larger than its bound, on any meshinfer stream or topic.
	MalformedFrame
	// ProtocolViolation is an integrity debit (Params.MalformedWeight): a well-formed
	// message that breaks its protocol (tokens past max_tokens, a frame out of order, a
	// sync answer with an invalid vector, an announcement that rolls its own seq back).
	ProtocolViolation
)

func (e Event) String() string {
	switch e {
	case HeartbeatMissed:
		return "heartbeat_missed"
	case VerificationPassed:
		return "verification_passed"
	case VerificationFailed:
		return "verification_failed"
	case ForgedAnnouncement:
		return "forged_announcement"
	case MalformedFrame:
		return "malformed_frame"
	case ProtocolViolation:
		return "protocol_violation"
	default:
		return "unknown"
	}
}

// peerScore holds one peer's score counters, each in points unless stated, all aged to
// decayedAt. The three classes are kept apart so the availability floor can apply to
// availability and performance only. The fields a cached read touches come first.
type peerScore struct {
	// tick is the DecayInterval tick (see Store.tickLocked) of the last ageing; reads in the
	// same tick reuse the aged counters.
	tick int64
	// cacheEpoch is the yardstick epoch cacheScore and cachePerf were computed against; 0
	// (never a live epoch) marks them stale, which every change to a counter does.
	cacheEpoch            uint64
	cacheScore, cachePerf float64
	cacheLat              time.Duration // 2^perfLat seconds, 0 without hasLat

	decayedAt time.Time
	touched   time.Time // last event; drives Retain and eviction

	availPlus  float64 // [0, SuccessCap]
	availMinus float64 // [counterFloor, 0]

	perfConf float64 // aged sample count, [0, PerformanceSamples]
	perfLat  float64 // moving average of log2(latency in seconds)
	perfTput float64 // moving average of log2(tokens per second)
	hasLat   bool
	hasTput  bool

	integPlus  float64 // [0, VerifyPassedCap]
	integMinus float64 // [counterFloor, 0]

	reason    string    // what last changed the score (an outcome or event name)
	changedAt time.Time // when
}

// decayMemo remembers the decay factors of the last elapsed time. Reads at a regular
// cadence age every peer by the same dt, so a batch of 1,000 costs three Exp2 calls, not
// three thousand.
type decayMemo struct {
	dt                 time.Duration
	avail, perf, integ float64
	valid              bool
}

func (m *decayMemo) factors(p *Params, dt time.Duration) (avail, perf, integ float64) {
	if !m.valid || m.dt != dt {
		*m = decayMemo{
			dt:    dt,
			avail: decayFactor(dt, p.AvailabilityHalfLife),
			perf:  decayFactor(dt, p.PerformanceHalfLife),
			integ: decayFactor(dt, p.IntegrityHalfLife),
			valid: true,
		}
	}
	return m.avail, m.perf, m.integ
}

// age brings the counters to now; a now before decayedAt (a clock that stepped back) ages
// nothing.
func (ps *peerScore) age(p *Params, m *decayMemo, now time.Time) {
	dt := now.Sub(ps.decayedAt)
	if dt <= 0 {
		return
	}
	a, f, i := m.factors(p, dt)
	ps.availPlus = snap(ps.availPlus * a)
	ps.availMinus = snap(ps.availMinus * a)
	ps.perfConf = snap(ps.perfConf * f)
	ps.integPlus = snap(ps.integPlus * i)
	ps.integMinus = snap(ps.integMinus * i)
	ps.decayedAt = now
	ps.cacheEpoch = 0
}

// score is the node score formula (see the package doc), given rel = ps.perfRel.
func (ps *peerScore) score(p *Params, rel float64) float64 {
	v := NeutralScore + ps.availPlus + ps.availMinus + ps.integPlus
	v += p.PerformanceWeight * rel / p.PerformanceRange
	v = max(v, p.AvailabilityFloor) // availability and performance alone never exclude
	v += ps.integMinus
	return clampScore(v)
}

// disposable reports whether the entry can go without losing anything that matters: it is
// neutral, or untouched for Retain and free of integrity debit (which must outlive the
// peer's absence, or leaving would be a way to reset it).
func (ps *peerScore) disposable(p *Params, m *decayMemo, now time.Time) bool {
	ps.age(p, m, now)
	if ps.integMinus < 0 {
		return false
	}
	neutral := ps.availPlus == 0 && ps.availMinus == 0 && ps.perfConf == 0 && ps.integPlus == 0
	return neutral || now.Sub(ps.touched) >= p.Retain
}

// peerEventLocked ages peer's node score (creating it if needed) to now, applies fn, and
// marks it touched; a non-empty reason is kept as what last changed the score (LastChange).
// LocalTarget and the empty string have no node score.
func (s *Store) peerEventLocked(peer string, now time.Time, reason string, fn func(*peerScore)) {
	if peer == "" || peer == LocalTarget {
		return
	}
	e := s.entries[peer]
	if e == nil || !e.scored {
		s.makeRoomScoreLocked(now)
		e = s.entryLocked(peer)
		e.score = peerScore{decayedAt: now}
		e.scored = true
		s.nScores++
	}
	ps := &e.score
	ps.age(&s.p, &s.memo, now)
	ps.tick = s.tickLocked(now)
	fn(ps)
	ps.cacheEpoch = 0
	if now.After(ps.touched) {
		ps.touched = now
	}
	if reason != "" {
		ps.reason, ps.changedAt = reason, now
	}
}

// LastChange returns what last changed peer's score and when: an outcome of Record
// ("success", "timeout", "unavailable") or an Event's name. Performance samples adjust the
// score continuously and are not a reason. ok is false for a peer the store has no score
// for.
func (s *Store) LastChange(peer string) (reason string, at time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[peer]
	if e == nil || !e.scored || e.score.reason == "" {
		return "", time.Time{}, false
	}
	return e.score.reason, e.score.changedAt, true
}

// Observe records a heartbeat or integrity event for peer at now. Unknown events, the empty
// peer and LocalTarget change nothing.
func (s *Store) Observe(peer string, e Event, now time.Time) {
	var fn func(*peerScore)
	switch e {
	case HeartbeatMissed:
		fn = func(ps *peerScore) { ps.availMinus = max(ps.availMinus+s.p.HeartbeatMissedWeight, counterFloor) }
	case VerificationPassed:
		fn = func(ps *peerScore) { ps.integPlus = min(ps.integPlus+s.p.VerifyPassedWeight, s.p.VerifyPassedCap) }
	case VerificationFailed:
		fn = func(ps *peerScore) { ps.integMinus = max(ps.integMinus+s.p.VerifyFailedWeight, counterFloor) }
	case ForgedAnnouncement:
		fn = func(ps *peerScore) { ps.integMinus = max(ps.integMinus+s.p.ForgedWeight, counterFloor) }
	case MalformedFrame, ProtocolViolation:
		fn = func(ps *peerScore) { ps.integMinus = max(ps.integMinus+s.p.MalformedWeight, counterFloor) }
	default:
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peerEventLocked(peer, now, e.String(), fn)
}

// candidateLocked returns the Candidate for entry e as of now (Spare 1); a nil or unscored
// entry is a neutral peer at par. tick is s.tickLocked(now), computed once per call by the
// caller. It ages the score at most once per tick but never creates one.
func (s *Store) candidateLocked(e *entry, now time.Time, tick int64) Candidate {
	if e == nil || !e.scored {
		return Candidate{Score: NeutralScore, Performance: 1, Spare: 1}
	}
	ps := &e.score
	if ps.tick != tick {
		ps.age(&s.p, &s.memo, now)
		ps.tick = tick
	}
	if ps.cacheEpoch != s.ref.epoch {
		rel := ps.perfRel(&s.p, &s.ref)
		ps.cacheScore = ps.score(&s.p, rel)
		ps.cachePerf = 1
		if rel != 0 {
			ps.cachePerf = math.Exp2(rel)
		}
		ps.cacheLat = 0
		if ps.hasLat {
			ps.cacheLat = max(time.Duration(math.Exp2(ps.perfLat)*float64(time.Second)), 1)
		}
		ps.cacheEpoch = s.ref.epoch
	}
	c := Candidate{Score: ps.cacheScore, Performance: ps.cachePerf, Spare: 1}
	if ps.cacheLat > 0 {
		c.Latency, c.Confidence = ps.cacheLat, ps.confidence(&s.p)
	}
	return c
}

// tickLocked numbers now in DecayInterval steps since the first time the store saw. Score
// reads in one tick share one ageing; events always age exactly. Using a difference of
// times keeps the monotonic clock reading when the caller passes time.Now().
func (s *Store) tickLocked(now time.Time) int64 {
	if !s.baseSet {
		s.base, s.baseSet = now, true
	}
	return int64(now.Sub(s.base)) / max(int64(s.p.DecayInterval), 1)
}

// Score returns peer's node score as of now: finite, in [0, 100], 50 for a peer the store
// knows nothing about.
func (s *Store) Score(peer string, now time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.candidateLocked(s.entries[peer], now, s.tickLocked(now)).Score
}

// Excluded reports whether peer's score is below ExcludeBelow, which removes it from the
// candidate set.
func (s *Store) Excluded(peer string, now time.Time) bool {
	return s.Score(peer, now) < ExcludeBelow
}

// Candidates appends one Candidate per peer to dst, with Score and Performance from the
// store as of now and Spare set to 1 (unknown); the caller fills in spare capacity. One lock
// for the whole batch keeps a 1,000-candidate decision cheap.
func (s *Store) Candidates(peers []string, now time.Time, dst []Candidate) []Candidate {
	s.mu.Lock()
	defer s.mu.Unlock()
	tick := s.tickLocked(now)
	for _, peer := range peers {
		dst = append(dst, s.candidateLocked(s.entries[peer], now, tick))
	}
	return dst
}
