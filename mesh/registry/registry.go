// Package registry keeps the peers this node knows: each peer's latest verified capability
// vector, when it was last heard from, and whether it is directly connected.
//
// The registry is pure state with time passed in: it holds no goroutines, never reads the
// clock, and never does I/O. Its owner (mesh/announce) feeds it verified vectors and
// connection events and calls Sweep on a tick.
//
// Invariants:
//   - only vectors that passed caps.Verify and the seq check are ever stored (Put trusts its
//     caller to have verified; it still refuses a seq at or below the stored one);
//   - a peer not heard from for StaleAfter is reported stale, and removed by the Sweep after
//     ForgetAfter;
//   - at most Cap peers are held; past it the longest-silent peer is evicted;
//   - readers get deep copies: nothing handed out aliases internal state.
//
// It must not import transport, inference or node.
package registry

import (
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// DefaultCap bounds the number of peers held. 4096 vectors of at most 16 KiB is 64 MiB in the
// worst case, and far more peers than one node can usefully route to.
const DefaultCap = 4096

// Entry is what the registry knows of one peer. Entries are copies.
type Entry struct {
	Peer      peer.ID
	Vector    *caps.Vector
	FirstSeen time.Time // local clock: first verified vector
	LastSeen  time.Time // local clock: latest verified vector
	Connected bool      // a direct libp2p connection exists now
	Stale     bool      // not heard from for StaleAfter
}

// Age is how long ago the peer was last heard from.
func (e Entry) Age(now time.Time) time.Duration { return now.Sub(e.LastSeen) }

// Params sets the registry's timing and size.
type Params struct {
	// StaleAfter is how long a peer may stay silent before it is stale. The rule is two
	// missed heartbeats plus a grace second: 2×15 s + 1 s = 31 s by default.
	StaleAfter time.Duration
	// ForgetAfter is how long a peer may stay silent before it is removed. Default: twice
	// StaleAfter, so a stale peer stays visible on the console for a while.
	ForgetAfter time.Duration
	// Cap is the most peers held (DefaultCap when 0).
	Cap int
}

// ParamsForHeartbeat derives the default Params from a heartbeat interval.
func ParamsForHeartbeat(hb time.Duration) Params {
	stale := 2*hb + time.Second
	return Params{StaleAfter: stale, ForgetAfter: 2 * stale, Cap: DefaultCap}
}

// Registry is the set of known peers. Safe for concurrent use.
type Registry struct {
	params Params

	mu      sync.Mutex
	entries map[peer.ID]*entry
}

type entry struct {
	vec       *caps.Vector
	firstSeen time.Time
	lastSeen  time.Time
	connected bool
}

// New returns an empty registry.
func New(p Params) *Registry {
	if p.Cap <= 0 {
		p.Cap = DefaultCap
	}
	if p.ForgetAfter < p.StaleAfter {
		p.ForgetAfter = p.StaleAfter
	}
	return &Registry{params: p, entries: make(map[peer.ID]*entry)}
}

// Put stores a verified vector from its author p, heard at now. It returns false, changing
// nothing, when the registry already holds a vector with the same or a higher seq.
func (r *Registry) Put(p peer.ID, v *caps.Vector, now time.Time) bool {
	v = v.Clone()
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[p]
	if ok {
		if v.Seq <= e.vec.Seq {
			return false
		}
		e.vec, e.lastSeen = v, now
		return true
	}
	if len(r.entries) >= r.params.Cap {
		r.evictOneLocked()
	}
	r.entries[p] = &entry{vec: v, firstSeen: now, lastSeen: now}
	return true
}

// evictOneLocked removes the peer silent for longest.
func (r *Registry) evictOneLocked() {
	var victim peer.ID
	var oldest time.Time
	for id, e := range r.entries {
		if victim == "" || e.lastSeen.Before(oldest) {
			victim, oldest = id, e.lastSeen
		}
	}
	delete(r.entries, victim)
}

// SetConnected records whether a direct connection to p exists. Unknown peers are ignored:
// a connection alone, without a verified vector, does not make a peer known.
func (r *Registry) SetConnected(p peer.ID, connected bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.entries[p]; ok {
		e.connected = connected
	}
}

// Sweep removes peers silent for ForgetAfter and returns them.
func (r *Registry) Sweep(now time.Time) []peer.ID {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gone []peer.ID
	for id, e := range r.entries {
		if now.Sub(e.lastSeen) >= r.params.ForgetAfter {
			delete(r.entries, id)
			gone = append(gone, id)
		}
	}
	return gone
}

// Get returns the entry for p.
func (r *Registry) Get(p peer.ID, now time.Time) (Entry, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[p]
	if !ok {
		return Entry{}, false
	}
	return r.entryLocked(p, e, now), true
}

// Seq returns the seq of p's stored vector without copying it; hot paths (validation, sync)
// compare against it on every message.
func (r *Registry) Seq(p peer.ID) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[p]
	if !ok {
		return 0, false
	}
	return e.vec.Seq, true
}

// Entries returns every known peer, sorted by peer ID.
func (r *Registry) Entries(now time.Time) []Entry {
	r.mu.Lock()
	out := make([]Entry, 0, len(r.entries))
	for id, e := range r.entries {
		out = append(out, r.entryLocked(id, e, now))
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int {
		switch {
		case a.Peer < b.Peer:
			return -1
		case a.Peer > b.Peer:
			return 1
		}
		return 0
	})
	return out
}

// Len is the number of peers held.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}

func (r *Registry) entryLocked(id peer.ID, e *entry, now time.Time) Entry {
	return Entry{
		Peer:      id,
		Vector:    e.vec.Clone(),
		FirstSeen: e.firstSeen,
		LastSeen:  e.lastSeen,
		Connected: e.connected,
		Stale:     now.Sub(e.lastSeen) >= r.params.StaleAfter,
	}
}
