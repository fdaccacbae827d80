// Package registry keeps the peers this node knows: each peer's latest verified capability
// vector, when it was last heard from, and whether it is directly connected.
//
// The registry is pure state with time passed in: it holds no goroutines, never reads the
// clock, and never does I/O. Its owner (mesh/announce) feeds it verified vectors and
// connection events and calls Sweep on a tick.
//
// A peer is pending until a direct connection to it has existed; only then is it contacted,
// and only contacted peers are routing candidates (the executor's rule) or served to others
// by caps-sync. Anyone can sign vectors of made-up identities; what one source can make the
// registry hold is bounded:
//   - a new identity handed over by anyone but its author (a GossipSub forwarder, a
//     caps-sync server) is charged to that source's budget (SourceBurst, then one per
//     SourceRefill); past it, it is refused (Admit, called before the vector is forwarded);
//   - at most PendingCap pending peers are held; a pending newcomer may displace only
//     another pending peer, so connected and contacted peers never make way for it;
//   - a pending peer whose contact failed is removed and refused for UnreachableFor.
//
// Invariants:
//   - only vectors that passed caps.Verify and the seq check are ever stored (Put trusts its
//     caller to have verified; it still refuses a seq at or below the stored one);
//   - a peer not heard from for StaleAfter is reported stale, and removed by the Sweep after
//     ForgetAfter;
//   - at most Cap peers are held, at most PendingCap of them pending;
//   - readers get deep copies of vectors: nothing handed out aliases mutable state (Wire's
//     byte slices are never modified once stored).
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

// Defaults of Params.
const (
	// DefaultCap bounds the number of peers held. 4096 vectors of at most 16 KiB is 64 MiB in
	// the worst case, and far more peers than one node can usefully route to.
	DefaultCap = 4096
	// DefaultPendingCap bounds the peers held before this node has been connected to them:
	// enough for the newcomers of a large mesh's heartbeat, small next to DefaultCap.
	DefaultPendingCap = 256
	// DefaultSourceBurst and DefaultSourceRefill rate-limit the new identities one peer may
	// hand this node (a GossipSub forwarder, a caps-sync server): 64 at once, then one per
	// 250 ms. A newcomer syncing from a 1,000-node mesh learns the rest from its other
	// neighbours and their heartbeats within a few minutes; a peer minting identities gets
	// 64 in, then 4 a second, each of them pending until a connection to it succeeds.
	DefaultSourceBurst  = 64
	DefaultSourceRefill = 250 * time.Millisecond
	// DefaultUnreachableFor is how long a peer that could not be contacted is refused.
	DefaultUnreachableFor = 2 * time.Minute
	// maxSources bounds the per-source budgets held; sources are connected peers.
	maxSources = 1024
)

// Entry is what the registry knows of one peer. Entries are copies.
type Entry struct {
	Peer      peer.ID
	Vector    *caps.Vector
	FirstSeen time.Time // local clock: first verified vector
	LastSeen  time.Time // local clock: latest verified vector
	Connected bool      // a direct libp2p connection exists now
	// Contacted: a direct connection to the peer has existed since it entered the registry.
	// Only contacted peers are routing candidates; the others are pending.
	Contacted bool
	Stale     bool // not heard from for StaleAfter
}

// Age is how long ago the peer was last heard from.
func (e Entry) Age(now time.Time) time.Duration { return now.Sub(e.LastSeen) }

// Params sets the registry's timing and size. Zero fields take the defaults.
type Params struct {
	// StaleAfter is how long a peer may stay silent before it is stale. The rule is two
	// missed heartbeats plus a grace second: 2×15 s + 1 s = 31 s by default.
	StaleAfter time.Duration
	// ForgetAfter is how long a peer may stay silent before it is removed. Default: twice
	// StaleAfter, so a stale peer stays visible on the console for a while.
	ForgetAfter time.Duration
	// Cap is the most peers held (DefaultCap when 0).
	Cap int
	// PendingCap is the most peers held that were never contacted (DefaultPendingCap).
	PendingCap int
	// SourceBurst and SourceRefill bound the new identities one source may hand over
	// (DefaultSourceBurst, DefaultSourceRefill).
	SourceBurst  int
	SourceRefill time.Duration
	// UnreachableFor is how long a peer whose contact failed is refused
	// (DefaultUnreachableFor).
	UnreachableFor time.Duration
}

// ParamsForHeartbeat derives the default Params from a heartbeat interval.
func ParamsForHeartbeat(hb time.Duration) Params {
	stale := 2*hb + time.Second
	return Params{StaleAfter: stale, ForgetAfter: 2 * stale}
}

func (p Params) withDefaults() Params {
	if p.Cap <= 0 {
		p.Cap = DefaultCap
	}
	if p.PendingCap <= 0 {
		p.PendingCap = DefaultPendingCap
	}
	p.PendingCap = min(p.PendingCap, p.Cap)
	if p.SourceBurst <= 0 {
		p.SourceBurst = DefaultSourceBurst
	}
	if p.SourceRefill <= 0 {
		p.SourceRefill = DefaultSourceRefill
	}
	if p.UnreachableFor <= 0 {
		p.UnreachableFor = DefaultUnreachableFor
	}
	if p.ForgetAfter < p.StaleAfter {
		p.ForgetAfter = p.StaleAfter
	}
	return p
}

// Heard is one verified vector as it reached this node.
type Heard struct {
	Vector *caps.Vector
	// Wire is the vector's signed wire form, kept to be served to peers as it came (caps-sync
	// never re-encodes). Optional; the registry keeps its own copy.
	Wire []byte
	// Via is the peer that handed it over: its author, a GossipSub forwarder or a caps-sync
	// server. A new identity from anyone but its author is charged to Via's budget.
	Via peer.ID
	// Connected: a direct connection to the author exists now.
	Connected bool
}

// Result says what Put or Admit did with a vector.
type Result int

const (
	Stored      Result = iota // stored: a new peer, or a higher seq of a known one
	Old                       // the registry holds this seq or a higher one
	OverBudget                // a new identity past its source's budget
	Unreachable               // a peer whose contact failed within UnreachableFor
	Full                      // no room: nothing the newcomer may displace
)

func (r Result) String() string {
	switch r {
	case Stored:
		return "stored"
	case Old:
		return "old"
	case OverBudget:
		return "over_budget"
	case Unreachable:
		return "unreachable"
	case Full:
		return "full"
	}
	return "unknown"
}

// Counts are the registry's refusals since it started, for the console.
type Counts struct {
	OverBudget  uint64 `json:"over_budget"`
	Unreachable uint64 `json:"unreachable"`
	Full        uint64 `json:"full"`
	Evicted     uint64 `json:"evicted"` // pending peers evicted to make room
}

// Registry is the set of known peers. Safe for concurrent use.
type Registry struct {
	params Params

	mu          sync.Mutex
	entries     map[peer.ID]*entry
	pending     int                   // entries not contacted
	sources     map[peer.ID]*bucket   // new-identity budgets by source
	unreachable map[peer.ID]time.Time // refused until
	counts      Counts
}

type entry struct {
	vec       *caps.Vector
	wire      []byte
	firstSeen time.Time
	lastSeen  time.Time
	connected bool
	contacted bool
	missed    int // heartbeats counted as missed since lastSeen (Overdue)
}

// bucket is a token bucket of new identities: tokens as of at.
type bucket struct {
	tokens float64
	at     time.Time
}

// New returns an empty registry.
func New(p Params) *Registry {
	return &Registry{
		params:      p.withDefaults(),
		entries:     make(map[peer.ID]*entry),
		sources:     make(map[peer.ID]*bucket),
		unreachable: make(map[peer.ID]time.Time),
	}
}

// Admit decides whether a vector of p handed over by h.Via may be stored, before its
// signature is checked or it is forwarded: a known peer or a connected one always may; a new
// identity from anyone but its author is charged to the source's budget. A refusal changes
// nothing. The GossipSub validator calls it, so that vectors this node would not store are
// not forwarded either.
func (r *Registry) Admit(p peer.ID, h Heard, now time.Time) Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.admitLocked(p, h, now)
}

func (r *Registry) admitLocked(p peer.ID, h Heard, now time.Time) Result {
	if _, ok := r.entries[p]; ok || h.Connected {
		return Stored
	}
	if until, ok := r.unreachable[p]; ok {
		if now.Before(until) {
			r.counts.Unreachable++
			return Unreachable
		}
		delete(r.unreachable, p)
	}
	if h.Via == p || h.Via == "" {
		return Stored
	}
	if !r.spendLocked(h.Via, now) {
		r.counts.OverBudget++
		return OverBudget
	}
	return Stored
}

// spendLocked takes one token of src's budget.
func (r *Registry) spendLocked(src peer.ID, now time.Time) bool {
	b, ok := r.sources[src]
	if !ok {
		if len(r.sources) >= maxSources && !r.pruneSourcesLocked(now) {
			return false
		}
		b = &bucket{tokens: float64(r.params.SourceBurst), at: now}
		r.sources[src] = b
	}
	if now.After(b.at) {
		b.tokens = min(float64(r.params.SourceBurst), b.tokens+float64(now.Sub(b.at))/float64(r.params.SourceRefill))
		b.at = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// pruneSourcesLocked drops the budgets that have refilled (the same as absent), and reports
// whether any room was made.
func (r *Registry) pruneSourcesLocked(now time.Time) bool {
	full := time.Duration(r.params.SourceBurst) * r.params.SourceRefill
	for src, b := range r.sources {
		if now.Sub(b.at) >= full {
			delete(r.sources, src)
		}
	}
	return len(r.sources) < maxSources
}

// Put stores a verified vector of its author p, heard at now. The caller has called Admit
// for it (which charged a new identity to its source); Put still refuses an unreachable
// peer, since one may have been marked since. It returns Old, changing nothing, when the
// registry already holds a vector with the same or a higher seq.
//
// Room: a new peer never contacted may only displace another such peer (the longest
// silent), and at most PendingCap of them are held; a connected newcomer may displace a
// pending peer, then the longest-silent peer not connected now. Connected peers are never
// displaced, and contacted ones never by a pending newcomer.
func (r *Registry) Put(p peer.ID, h Heard, now time.Time) Result {
	v := h.Vector.Clone()
	wire := slices.Clone(h.Wire)
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.entries[p]; ok {
		if v.Seq <= e.vec.Seq {
			return Old
		}
		e.vec, e.wire, e.lastSeen, e.missed = v, wire, now, 0
		if h.Connected {
			r.contactLocked(e)
		}
		return Stored
	}
	if until, ok := r.unreachable[p]; ok && now.Before(until) && !h.Connected {
		r.counts.Unreachable++
		return Unreachable
	}
	if !r.roomLocked(h.Connected) {
		r.counts.Full++
		return Full
	}
	e := &entry{vec: v, wire: wire, firstSeen: now, lastSeen: now}
	r.entries[p] = e
	r.pending++
	if h.Connected {
		r.contactLocked(e)
	}
	return Stored
}

// roomLocked makes room for one more peer, connected or pending, and reports whether there is.
func (r *Registry) roomLocked(connected bool) bool {
	if !connected && r.pending >= r.params.PendingCap {
		return r.evictLocked(func(e *entry) bool { return !e.contacted })
	}
	if len(r.entries) < r.params.Cap {
		return true
	}
	if r.evictLocked(func(e *entry) bool { return !e.contacted }) {
		return true
	}
	return connected && r.evictLocked(func(e *entry) bool { return !e.connected })
}

// evictLocked removes the longest-silent entry that may go, and reports whether there was one.
func (r *Registry) evictLocked(may func(*entry) bool) bool {
	var victim peer.ID
	var oldest time.Time
	for id, e := range r.entries {
		if may(e) && (victim == "" || e.lastSeen.Before(oldest)) {
			victim, oldest = id, e.lastSeen
		}
	}
	if victim == "" {
		return false
	}
	r.removeLocked(victim)
	r.counts.Evicted++
	return true
}

func (r *Registry) removeLocked(p peer.ID) {
	if e, ok := r.entries[p]; ok {
		if !e.contacted {
			r.pending--
		}
		delete(r.entries, p)
	}
}

func (r *Registry) contactLocked(e *entry) {
	e.connected = true
	if !e.contacted {
		e.contacted = true
		r.pending--
	}
}

// SetConnected records whether a direct connection to p exists. Unknown peers are ignored:
// a connection alone, without a verified vector, does not make a peer known. A connection
// makes a pending peer contacted, for good.
func (r *Registry) SetConnected(p peer.ID, connected bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[p]
	switch {
	case !ok:
	case connected:
		r.contactLocked(e)
	default:
		e.connected = false
	}
}

// Unreachable records that a pending peer could not be contacted: it is removed, and its
// vectors are refused for UnreachableFor unless it connects to this node. A contacted peer
// is left as it is (a later failure is the executor's and reputation's business).
func (r *Registry) Unreachable(p peer.ID, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.entries[p]; ok && e.contacted {
		return
	}
	r.removeLocked(p)
	if len(r.unreachable) >= r.params.Cap {
		for id, until := range r.unreachable {
			if !now.Before(until) {
				delete(r.unreachable, id)
			}
		}
		if len(r.unreachable) >= r.params.Cap {
			return // full of live refusals: this one is not remembered
		}
	}
	r.unreachable[p] = now.Add(r.params.UnreachableFor)
}

// Overdue counts the heartbeats contacted peers have missed: a peer heard from last at t
// has missed ⌊(now − t − grace) / every⌋ heartbeats. It returns, for each peer, how many
// more than the previous call counted (each missed heartbeat is reported once), and counts
// them. Pending peers are left out: a made-up identity must not earn a score entry.
func (r *Registry) Overdue(now time.Time, every, grace time.Duration) map[peer.ID]int {
	if every <= 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out map[peer.ID]int
	for id, e := range r.entries {
		late := now.Sub(e.lastSeen) - grace
		if !e.contacted || late < every {
			continue
		}
		if n := int(late / every); n > e.missed {
			if out == nil {
				out = make(map[peer.ID]int)
			}
			out[id] = n - e.missed
			e.missed = n
		}
	}
	return out
}

// Gone is a peer Sweep removed, with the seq of its last vector.
type Gone struct {
	Peer peer.ID
	Seq  uint64
}

// Sweep removes peers silent for ForgetAfter and returns them.
func (r *Registry) Sweep(now time.Time) []Gone {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gone []Gone
	for id, e := range r.entries {
		if now.Sub(e.lastSeen) >= r.params.ForgetAfter {
			gone = append(gone, Gone{Peer: id, Seq: e.vec.Seq})
			r.removeLocked(id)
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

// Pending reports whether p is held and was never contacted.
func (r *Registry) Pending(p peer.ID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[p]
	return ok && !e.contacted
}

// PendingPeers returns the peers held that were never contacted.
func (r *Registry) PendingPeers() []peer.ID {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]peer.ID, 0, r.pending)
	for id, e := range r.entries {
		if !e.contacted {
			out = append(out, id)
		}
	}
	return out
}

// ContactedModels returns the names of the models fresh contacted peers announce.
func (r *Registry) ContactedModels(now time.Time) map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]bool)
	for _, e := range r.entries {
		if e.contacted && now.Sub(e.lastSeen) < r.params.StaleAfter {
			for _, m := range e.vec.Models {
				out[m.Name] = true
			}
		}
	}
	return out
}

// OffersOtherModels reports whether p's vector announces a model not in offered.
func (r *Registry) OffersOtherModels(p peer.ID, offered map[string]bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[p]
	if !ok {
		return false
	}
	for _, m := range e.vec.Models {
		if !offered[m.Name] {
			return true
		}
	}
	return false
}

// Wire returns the signed wire forms of up to maxN fresh, contacted peers other than skip,
// at most maxBytes in all, as they were received. The slices are shared and must not be
// modified.
func (r *Registry) Wire(now time.Time, skip peer.ID, maxN, maxBytes int) [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]byte
	size := 0
	for id, e := range r.entries {
		if len(out) >= maxN {
			break
		}
		if id == skip || !e.contacted || e.wire == nil || now.Sub(e.lastSeen) >= r.params.StaleAfter {
			continue
		}
		if size+len(e.wire) > maxBytes {
			continue
		}
		size += len(e.wire)
		out = append(out, e.wire)
	}
	return out
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

// Len is the number of peers held, pending ones included.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}

// Counts returns the registry's refusals and evictions so far.
func (r *Registry) Counts() Counts {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts
}

func (r *Registry) entryLocked(id peer.ID, e *entry, now time.Time) Entry {
	return Entry{
		Peer:      id,
		Vector:    e.vec.Clone(),
		FirstSeen: e.firstSeen,
		LastSeen:  e.lastSeen,
		Connected: e.connected,
		Contacted: e.contacted,
		Stale:     now.Sub(e.lastSeen) >= r.params.StaleAfter,
	}
}
