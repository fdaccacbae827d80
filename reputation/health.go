package reputation

import (
	"cmp"
	"slices"
	"time"
)

// LocalTarget is the serving target that stands for this node's own inference backend. Peer
// IDs are multihashes in base58 or base32, so they never equal it. The local target has
// health (cooldown, penalty) but no node score.
const LocalTarget = "local"

// Target is one way to serve a model: a peer (its peer ID string) or LocalTarget.
type Target struct {
	Model string
	Peer  string
}

// Outcome is how one attempt against a target ended, as the router saw it.
type Outcome uint8

// Outcomes. Only Timeout and Unavailable are health signals; the rest say nothing about
// the target and leave it untouched.
const (
	// Success clears an active cooldown and reduces the residual penalty by
	// Params.SuccessPenaltyFactor.
	Success Outcome = iota + 1
	// Timeout is a retryable failure: cooldown (exponential per failure in a row, capped;
	// failures while cooling do not add to it) and a local penalty.
	Timeout
	// Unavailable (dial failed, stream reset, peer gone) is treated exactly like Timeout.
	Unavailable
	// ContextOverflow means the request did not fit the model: no penalty.
	ContextOverflow
	// Rejected means admission said no (paused, overloaded, policy): no penalty.
	Rejected
	// ClientDisconnected means our own client went away: no penalty.
	ClientDisconnected
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Timeout:
		return "timeout"
	case Unavailable:
		return "unavailable"
	case ContextOverflow:
		return "context_overflow"
	case Rejected:
		return "rejected"
	case ClientDisconnected:
		return "client_disconnected"
	default:
		return "unknown"
	}
}

// RouteMode says how a request chose its model, which decides what Order does when every
// candidate is cooling.
type RouteMode uint8

const (
	// Explicit: the request named the model. If every candidate is cooling, Order returns
	// them all so the model stays reachable.
	Explicit RouteMode = iota + 1
	// Auto: the router chose the model. If every candidate is cooling, Order returns none so
	// the router can try another model or tier.
	Auto
)

func (m RouteMode) String() string {
	switch m {
	case Explicit:
		return "explicit"
	case Auto:
		return "auto"
	default:
		return "unknown"
	}
}

// targetHealth is the state of one (model, target) pair. An entry exists only while it
// carries something: a cooldown, a penalty, or a streak that may still grow.
type targetHealth struct {
	penalty       float64   // points >= 0, aged to decayedAt
	decayedAt     time.Time // when penalty was last aged
	cooldownUntil time.Time // cooling while now is before it; never moves back in a streak
	lastFailure   time.Time
	streak        int       // retryable failures in a row, a burst while cooling once; <= maxStreak
	touched       time.Time // last Record; orders eviction
}

// TargetState is a copy of one target's health as of a given time.
type TargetState struct {
	Cooling       bool
	CooldownUntil time.Time // zero when no cooldown was set in the current streak
	Penalty       float64   // points, aged to the query time
	Streak        int       // retryable failures in a row (those while cooling count once)
	LastFailure   time.Time // the latest retryable failure (zero: none)
}

func (h *targetHealth) cooling(now time.Time) bool { return now.Before(h.cooldownUntil) }

// penaltyAt returns the penalty aged to now without changing h.
func (h *targetHealth) penaltyAt(p *Params, now time.Time) float64 {
	if h.penalty == 0 {
		return 0
	}
	v := h.penalty * decayFactor(now.Sub(h.decayedAt), p.PenaltyHalfLife)
	if v < p.FailurePenalty*penaltyClearFraction {
		return 0
	}
	return v
}

// agePenalty stores the penalty aged to now.
func (h *targetHealth) agePenalty(p *Params, now time.Time) {
	h.penalty = h.penaltyAt(p, now)
	if now.After(h.decayedAt) {
		h.decayedAt = now
	}
}

// streakLive reports whether a new failure would extend the current streak.
func (h *targetHealth) streakLive(p *Params, now time.Time) bool {
	return h.streak > 0 && now.Sub(h.lastFailure) <= p.StreakReset
}

// idle reports whether h carries nothing as of now and can be dropped.
func (h *targetHealth) idle(p *Params, now time.Time) bool {
	return !h.cooling(now) && h.penaltyAt(p, now) == 0 && !h.streakLive(p, now)
}

// disposable reports whether Prune may drop h as of now: it carries nothing, or no attempt
// on it has been recorded for Retain and it is not cooling. What such a record still
// carries is a residual penalty of a target nobody has tried since, usually a peer that
// left: kept past Retain it would outlive the peer's node score, and the store would
// remember a peer it has otherwise forgotten (docs/reliability.md F19). With the default
// parameters the largest penalty decays to nothing in about 32 min, within the hour of
// Retain, so this only matters when Retain is shorter.
func (h *targetHealth) disposable(p *Params, now time.Time) bool {
	return h.idle(p, now) || !h.cooling(now) && now.Sub(h.touched) >= p.Retain
}

// cooldown returns the cooldown for the n-th failure in a row (n >= 1):
// CooldownBase·2^(n-1), capped at CooldownMax.
func cooldown(p *Params, n int) time.Duration {
	d := p.CooldownBase
	for i := 1; i < n && d < p.CooldownMax; i++ {
		d *= 2
	}
	return min(d, p.CooldownMax)
}

// Record applies the outcome of one attempt against target at now. Success and failures on
// a peer target also feed that peer's node score (availability class); LocalTarget has no
// node score. Outcomes that are not health signals, unknown outcomes and an empty Peer
// change nothing.
func (s *Store) Record(target Target, o Outcome, now time.Time) {
	if target.Peer == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch o {
	case Success:
		if h := s.healthLocked(target); h != nil {
			h.touched = now
			h.streak = 0
			h.cooldownUntil = time.Time{}
			h.agePenalty(&s.p, now)
			h.penalty *= s.p.SuccessPenaltyFactor
			if h.penalty < s.p.FailurePenalty*penaltyClearFraction {
				h.penalty = 0
			}
			if h.idle(&s.p, now) {
				s.deleteHealthLocked(target.Model, target.Peer)
			}
		}
		s.peerEventLocked(target.Peer, now, o.String(), func(ps *peerScore) {
			ps.availPlus = min(ps.availPlus+s.p.SuccessWeight, s.p.SuccessCap)
		})
	case Timeout, Unavailable:
		h := s.healthForWriteLocked(target, now)
		h.touched = now
		h.agePenalty(&s.p, now)
		if !h.streakLive(&s.p, now) {
			h.streak = 0
			h.cooldownUntil = time.Time{}
		}
		// A failure while cooling is one of the attempts that were under way when the first
		// failed: the incident is counted once (doc.go, layer 1). Also, a caller whose
		// clock stepped back does not shorten a running cooldown.
		if !h.cooling(now) {
			h.streak = min(h.streak+1, maxStreak)
			h.cooldownUntil = now.Add(cooldown(&s.p, h.streak))
		}
		if now.After(h.lastFailure) {
			h.lastFailure = now
		}
		h.penalty = min(h.penalty+s.p.FailurePenalty, s.p.PenaltyCap)
		// h points into the entry's slice: done with it before anything else can change it.
		s.peerEventLocked(target.Peer, now, o.String(), func(ps *peerScore) {
			ps.availMinus = max(ps.availMinus+s.p.FailureWeight, counterFloor)
		})
	}
}

// healthLocked returns target's health record, or nil. The pointer is valid until the next
// change to the store.
func (s *Store) healthLocked(target Target) *targetHealth {
	if e := s.entries[target.Peer]; e != nil {
		return e.find(target.Model)
	}
	return nil
}

// healthForWriteLocked returns target's health record, creating it (and making room) if
// needed. The pointer is valid until the next change to the store.
func (s *Store) healthForWriteLocked(target Target, now time.Time) *targetHealth {
	if h := s.healthLocked(target); h != nil {
		return h
	}
	s.makeRoomTargetLocked(now)
	e := s.entryLocked(target.Peer)
	e.health = append(e.health, modelHealth{model: target.Model, targetHealth: targetHealth{decayedAt: now}})
	s.nTargets++
	return &e.health[len(e.health)-1].targetHealth
}

// TargetHealth returns a copy of target's health as of now, and false if the store holds
// nothing about it (a clean target).
func (s *Store) TargetHealth(target Target, now time.Time) (TargetState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.healthLocked(target)
	if h == nil {
		return TargetState{}, false
	}
	return TargetState{
		Cooling:       h.cooling(now),
		CooldownUntil: h.cooldownUntil,
		Penalty:       h.penaltyAt(&s.p, now),
		Streak:        h.streak,
		LastFailure:   h.lastFailure,
	}, true
}

// penalized is a kept candidate carrying a penalty, listed in the given order: its index
// in the input and its Candidate.
type penalized struct {
	index int
	cand  Candidate
}

// byPenalty is what sorting the penalized candidates moves: the penalty and the slot of
// the candidate in the penalized list. The list is in the given order, so slot also breaks
// ties as Order promises. Sixteen bytes and no pointers keep the sort cheap: moving whole
// penalized records (with the penalty, 48 bytes) took twice as long.
type byPenalty struct {
	penalty float64
	slot    int
}

// Order returns the candidates (serving targets for model) in the order they should be
// tried. It never modifies candidates.
//
//   - Cooling targets are dropped when at least one non-cooling candidate remains.
//   - The rest are ordered by local penalty, lowest first, keeping the given order among
//     equals, so a target just out of cooldown sits behind clean ones until it has proved
//     itself again.
//   - If every candidate is cooling, Explicit returns a copy of candidates in their given
//     order (the model stays reachable) and Auto returns an empty slice (the router should
//     pick another model or tier rather than retry a target known to be cooling). Any mode
//     other than Explicit behaves as Auto.
func (s *Store) Order(model string, candidates []string, mode RouteMode, now time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx, _ := s.rankLocked(model, candidates, mode, now, s.indices[:0], nil, false)
	out := make([]string, 0, len(idx))
	for _, i := range idx {
		out = append(out, candidates[i])
	}
	s.keepIndices(idx)
	return out
}

// Rank is Order and Candidates in one pass. It appends the ordered targets to order and,
// aligned with them, one Candidate each to cands (Score and Performance as of now, Spare 1
// for the caller to fill in), ready for Select. It is the cheap way to make a routing
// decision: one lock, one lookup per candidate, and no allocation once the caller reuses
// its slices. LocalTarget has no node score and appears as a neutral peer (score 50,
// performance 1).
func (s *Store) Rank(model string, candidates []string, mode RouteMode, now time.Time, order []string, cands []Candidate) ([]string, []Candidate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx, cands := s.rankLocked(model, candidates, mode, now, s.indices[:0], cands, true)
	for _, i := range idx {
		order = append(order, candidates[i])
	}
	s.keepIndices(idx)
	return order, cands
}

// RankIndices is Rank for a caller that keeps its own data alongside candidates: instead
// of the ordered targets it appends their indices in candidates to idx (candidates[idx[j]]
// is what Rank would put at order[j]), so the caller matches the result back to its data
// without looking keys up. cands is filled exactly as Rank fills it, and the store counts
// the ordering in Stats the same way.
func (s *Store) RankIndices(model string, candidates []string, mode RouteMode, now time.Time, idx []int, cands []Candidate) ([]int, []Candidate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rankLocked(model, candidates, mode, now, idx, cands, true)
}

// keepIndices keeps idx's memory for the next Order or Rank, unless it grew past
// MaxEntries (a caller with that many candidates is rare; never keep more than that).
func (s *Store) keepIndices(idx []int) {
	if cap(idx) <= s.p.MaxEntries {
		s.indices = idx[:0]
	}
}

// rankLocked appends to idx the index in candidates of each target kept, in the order of
// Order, and, when withScores, its Candidate to dst.
func (s *Store) rankLocked(model string, candidates []string, mode RouteMode, now time.Time, idx []int, dst []Candidate, withScores bool) ([]int, []Candidate) {
	// Clean candidates keep their given order and go first; penalized ones follow, sorted
	// by penalty with ties in given order. That is a stable sort by penalty in one pass plus
	// a sort of the (usually few) penalized ones, skipped when they already are in order.
	pens, keys := s.scratch[:0], s.sortKeys[:0]
	defer func() {
		// Only candidates with a health record land here, so the buffers stay within
		// MaxEntries unless a caller repeats candidates; never keep more than that.
		if cap(pens) <= s.p.MaxEntries && cap(keys) <= s.p.MaxEntries {
			s.scratch, s.sortKeys = pens[:0], keys[:0]
		}
	}()
	var tick int64
	if withScores {
		tick = s.tickLocked(now)
	}
	cooling := 0
	unsorted := false // keys, appended in given order, are not in order of penalty
	for i, c := range candidates {
		e := s.entries[c]
		var pen float64
		var failed time.Time
		if e != nil {
			if h := e.find(model); h != nil {
				if h.cooling(now) {
					cooling++
					continue
				}
				pen, failed = h.penaltyAt(&s.p, now), h.lastFailure
			}
		}
		var cand Candidate
		if withScores {
			cand = s.candidateLocked(e, now, tick)
			cand.Penalty, cand.LastFailure = pen, failed
		}
		if pen == 0 {
			idx = append(idx, i)
			if withScores {
				dst = append(dst, cand)
			}
			continue
		}
		if n := len(keys); n > 0 && keys[n-1].penalty > pen {
			unsorted = true
		}
		keys = append(keys, byPenalty{penalty: pen, slot: len(pens)})
		pens = append(pens, penalized{index: i, cand: cand})
	}
	if cooling == len(candidates) && cooling > 0 {
		s.counters.routesAllCooling++
		if mode != Explicit {
			return idx, dst
		}
		for i, c := range candidates {
			idx = append(idx, i)
			if withScores {
				cand := s.candidateLocked(s.entries[c], now, tick)
				cand.Cooling = true
				dst = append(dst, cand)
			}
		}
		return idx, dst
	}
	if cooling > 0 {
		s.counters.routesCoolingSkipped++
	}
	if unsorted {
		slices.SortFunc(keys, func(a, b byPenalty) int {
			if c := cmp.Compare(a.penalty, b.penalty); c != 0 {
				return c
			}
			return cmp.Compare(a.slot, b.slot)
		})
	}
	for _, k := range keys {
		p := &pens[k.slot]
		idx = append(idx, p.index)
		if withScores {
			dst = append(dst, p.cand)
		}
	}
	return idx, dst
}
