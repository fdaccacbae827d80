package reputation

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Store holds target health and node scores for one process. It is safe for concurrent use;
// every method takes the current time, and nothing happens between calls.
type Store struct {
	p Params // validated in New, never written again

	mu sync.Mutex
	// entries maps a serving target (peer ID or LocalTarget) to everything known about it,
	// so a routing decision costs one lookup per candidate. An entry exists only while it
	// holds a health record or a node score.
	entries  map[string]*entry
	nTargets int         // health records across entries, <= p.MaxEntries
	nScores  int         // entries holding a node score, <= p.MaxEntries
	ref      perfRef     // yardstick over peers' performance averages
	memo     decayMemo   // decay factors of the last elapsed time
	scratch  []penalized // reused by rankLocked, capacity <= p.MaxEntries
	sortKeys []byPenalty // reused by rankLocked, capacity <= p.MaxEntries
	indices  []int       // reused by Order and Rank, capacity <= p.MaxEntries
	base     time.Time   // origin of DecayInterval ticks: the first time the store saw
	baseSet  bool
	counters counters // monotonic, reported by Stats
}

// entry is what the store knows about one serving target. A routing decision reads health,
// scored and the head of score (see peerScore) for every candidate: they come first, within
// 64 bytes, so that the read touches one or two cache lines of the entry rather than three.
type entry struct {
	health []modelHealth // one per model with state; usually none or one
	scored bool
	score  peerScore // meaningful only when scored
}

// modelHealth is the health of one (model, target) pair.
type modelHealth struct {
	model string
	targetHealth
}

// find returns the health record for model, or nil.
func (e *entry) find(model string) *targetHealth {
	for i := range e.health {
		if e.health[i].model == model {
			return &e.health[i].targetHealth
		}
	}
	return nil
}

// counters are the monotonic counts behind Stats.
type counters struct {
	routesPenalized      uint64
	routesCoolingSkipped uint64
	routesAllCooling     uint64
	evictedTargets       uint64
	evictedPeers         uint64
}

// New validates p and returns an empty store.
func New(p Params) (*Store, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Store{p: p, entries: make(map[string]*entry), ref: perfRef{epoch: 1}}, nil
}

// Params returns the parameters the store was built with.
func (s *Store) Params() Params { return s.p }

// Stats is a snapshot for the console. PenalizedTargets and RoutesPenalized appear under
// routing_affinity.target_reputation in /api/status.
type Stats struct {
	// PenalizedTargets counts (model, target) records still carrying a penalty, cooling or
	// not.
	PenalizedTargets int `json:"penalized_targets"`
	// RoutesPenalized counts routing decisions whose attempt order put a penalized target
	// behind a clean one; the router counts them (CountPenalizedRoute), since only it knows
	// which order it applied.
	RoutesPenalized uint64 `json:"routes_penalized"`
	// CoolingTargets counts (model, target) records in cooldown now.
	CoolingTargets int `json:"cooling_targets"`
	// RoutesCoolingSkipped counts orderings that dropped at least one cooling candidate.
	RoutesCoolingSkipped uint64 `json:"routes_cooling_skipped"`
	// RoutesAllCooling counts orderings in which every candidate was cooling.
	RoutesAllCooling uint64 `json:"routes_all_cooling"`
	// Targets is the number of health records and Peers the number of node scores, each
	// at most MaxEntries.
	Targets int `json:"targets"`
	Peers   int `json:"peers"`
	// ExcludedPeers counts scored peers below ExcludeBelow now.
	ExcludedPeers int `json:"excluded_peers"`
	// EvictedTargets and EvictedPeers count records dropped because their kind was full.
	EvictedTargets uint64 `json:"evicted_targets"`
	EvictedPeers   uint64 `json:"evicted_peers"`
	// MaxEntries is the cap of each kind.
	MaxEntries int `json:"max_entries"`
}

// CountPenalizedRoute counts one routing decision whose attempt order put a penalized
// target behind a clean one (Stats.RoutesPenalized).
func (s *Store) CountPenalizedRoute() {
	s.mu.Lock()
	s.counters.routesPenalized++
	s.mu.Unlock()
}

// Stats returns counters and gauges as of now. It walks every entry, so call it for the
// console, not per request.
func (s *Store) Stats(now time.Time) Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		RoutesPenalized:      s.counters.routesPenalized,
		RoutesCoolingSkipped: s.counters.routesCoolingSkipped,
		RoutesAllCooling:     s.counters.routesAllCooling,
		Targets:              s.nTargets,
		Peers:                s.nScores,
		EvictedTargets:       s.counters.evictedTargets,
		EvictedPeers:         s.counters.evictedPeers,
		MaxEntries:           s.p.MaxEntries,
	}
	tick := s.tickLocked(now)
	for _, e := range s.entries {
		for i := range e.health {
			h := &e.health[i].targetHealth
			if h.penaltyAt(&s.p, now) > 0 {
				st.PenalizedTargets++
			}
			if h.cooling(now) {
				st.CoolingTargets++
			}
		}
		if e.scored && s.candidateLocked(e, now, tick).Score < ExcludeBelow {
			st.ExcludedPeers++
		}
	}
	return st
}

// Forget drops everything known about peer: its node score and its health for every model.
// It is for operators and tests; disconnecting never calls it, so scores survive reconnects.
func (s *Store) Forget(peer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[peer]
	if e == nil {
		return
	}
	s.nTargets -= len(e.health)
	e.health = nil
	s.deleteScoreLocked(peer, e)
}

// Knows reports whether the store holds anything about peer: a node score, or a health
// record for some model. A peer that left is forgotten once it knows nothing of it.
func (s *Store) Knows(peer string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries[peer] != nil
}

// Prune drops what carries no information as of now: health records with no cooldown,
// penalty or live streak, or untouched for Params.Retain and not cooling, and node scores
// that are neutral, or untouched for Params.Retain without an integrity debit. So a peer
// that left is forgotten Retain after its last event, unless it owes an integrity debit.
// It returns how many records went. The owner calls it from its maintenance tick (node
// does, every heartbeat); the store also prunes on its own when a kind is full.
func (s *Store) Prune(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pruneTargetsLocked(now) + s.pruneScoresLocked(now)
}

func (s *Store) pruneTargetsLocked(now time.Time) int {
	n := 0
	for peer, e := range s.entries {
		kept := e.health[:0]
		for _, mh := range e.health {
			if mh.disposable(&s.p, now) {
				n++
				continue
			}
			kept = append(kept, mh)
		}
		clear(e.health[len(kept):]) // drop references to model names
		e.health = kept
		s.dropIfEmptyLocked(peer, e)
	}
	s.nTargets -= n
	return n
}

func (s *Store) pruneScoresLocked(now time.Time) int {
	n := 0
	for peer, e := range s.entries {
		if e.scored && e.score.disposable(&s.p, &s.memo, now) {
			s.deleteScoreLocked(peer, e)
			n++
		}
	}
	s.recomputeRefLocked()
	return n
}

// deleteHealthLocked drops the health record of (model, peer), if any.
func (s *Store) deleteHealthLocked(model, peer string) {
	e := s.entries[peer]
	if e == nil {
		return
	}
	for i := range e.health {
		if e.health[i].model == model {
			last := len(e.health) - 1
			e.health[i] = e.health[last]
			e.health[last] = modelHealth{}
			e.health = e.health[:last]
			s.nTargets--
			s.dropIfEmptyLocked(peer, e)
			return
		}
	}
}

// deleteScoreLocked drops peer's node score and its share of the performance yardstick.
func (s *Store) deleteScoreLocked(peer string, e *entry) {
	if e.scored {
		s.ref.add(&e.score, -1)
		s.ref.publish()
		e.score = peerScore{}
		e.scored = false
		s.nScores--
	}
	s.dropIfEmptyLocked(peer, e)
}

func (s *Store) dropIfEmptyLocked(peer string, e *entry) {
	if len(e.health) == 0 && !e.scored {
		delete(s.entries, peer)
	}
}

// recomputeRefLocked rebuilds the yardstick sums from scratch, discarding any drift the
// incremental updates accumulated.
func (s *Store) recomputeRefLocked() {
	s.ref.sumLat, s.ref.sumTput, s.ref.nLat, s.ref.nTput = 0, 0, 0, 0
	for _, e := range s.entries {
		if e.scored {
			s.ref.add(&e.score, +1)
		}
	}
	s.ref.publish()
}

// evictBatch is how many extra records an eviction removes beyond the one it must, as a
// fraction of the cap (1/64): a full store under churn then sorts its records once per 64
// insertions instead of on every insertion.
func evictBatch(maxEntries int) int { return maxEntries / 64 }

// Usefulness classes for eviction; lower classes go first.
const (
	classIdle     = iota // carries nothing: safe to drop
	classOrdinary        // some residual state
	classSticky          // cooling target, or a peer with an integrity debit
)

type victim struct {
	peer, model string // model is unused for node scores
	class       int
	touched     time.Time
}

func byUsefulness(a, b victim) int {
	if c := cmp.Compare(a.class, b.class); c != 0 {
		return c
	}
	return a.touched.Compare(b.touched)
}

// makeRoomTargetLocked ensures one more health record fits.
func (s *Store) makeRoomTargetLocked(now time.Time) {
	if s.nTargets < s.p.MaxEntries {
		return
	}
	if s.pruneTargetsLocked(now); s.nTargets < s.p.MaxEntries {
		return
	}
	vs := make([]victim, 0, s.nTargets)
	for peer, e := range s.entries {
		for i := range e.health {
			mh := &e.health[i]
			class := classOrdinary
			if mh.cooling(now) {
				class = classSticky
			}
			vs = append(vs, victim{peer: peer, model: mh.model, class: class, touched: mh.touched})
		}
	}
	slices.SortFunc(vs, byUsefulness)
	k := min(len(vs), s.nTargets-s.p.MaxEntries+1+evictBatch(s.p.MaxEntries))
	for _, v := range vs[:k] {
		s.deleteHealthLocked(v.model, v.peer)
	}
	s.counters.evictedTargets += uint64(k)
}

// makeRoomScoreLocked ensures one more node score fits.
func (s *Store) makeRoomScoreLocked(now time.Time) {
	if s.nScores < s.p.MaxEntries {
		return
	}
	if s.pruneScoresLocked(now); s.nScores < s.p.MaxEntries {
		return
	}
	vs := make([]victim, 0, s.nScores)
	for peer, e := range s.entries {
		if !e.scored {
			continue
		}
		class := classOrdinary
		if e.score.integMinus < 0 {
			class = classSticky
		}
		vs = append(vs, victim{peer: peer, class: class, touched: e.score.touched})
	}
	slices.SortFunc(vs, byUsefulness)
	k := min(len(vs), s.nScores-s.p.MaxEntries+1+evictBatch(s.p.MaxEntries))
	for _, v := range vs[:k] {
		s.deleteScoreLocked(v.peer, s.entries[v.peer])
	}
	s.counters.evictedPeers += uint64(k)
}

// entryLocked returns peer's entry, creating an empty one if needed. The caller must give
// it a health record or a score before unlocking.
func (s *Store) entryLocked(peer string) *entry {
	e := s.entries[peer]
	if e == nil {
		e = &entry{}
		s.entries[peer] = e
	}
	return e
}
