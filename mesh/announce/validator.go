package announce

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// highWaterCap bounds the per-peer seq table. Past it, entries whose last acceptance is older
// than highWaterKeep are evicted first (any record they could replay has expired by then),
// then the oldest.
const highWaterCap = 16384

// highWaterKeep is how long a seq high-water mark must be remembered: the longest a signed
// vector can stay valid (caps.MaxTTL) plus the clock skew a receiver tolerates.
const highWaterKeep = caps.MaxTTL + 2*caps.MaxClockSkew

// Counts of validation outcomes, for the console.
type Counts struct {
	Accepted uint64 `json:"accepted"`
	Rejected uint64 `json:"rejected"`
	Ignored  uint64 `json:"ignored"`
}

// validator checks incoming announcements. It keeps the per-peer seq high-water mark.
type validator struct {
	now func() time.Time
	// newer, when set, reports whether the registry holds a vector of p above seq; such a
	// message is a rollback even if it is above the high-water mark (vectors pulled by sync
	// do not raise the mark, see acceptSynced).
	newer func(p peer.ID, seq uint64) bool
	// admit, when set, reports whether the registry would take a vector of author handed
	// over by via (registry.Admit: a new identity is charged to via's budget). A vector it
	// would not take is Ignored, so it is not forwarded either.
	admit func(author, via peer.ID) bool

	accepted, rejected, ignored atomic.Uint64
	old                         oldShapeLog // warns about peers still on the caps/1 shape

	mu   sync.Mutex
	high map[peer.ID]mark
}

type mark struct {
	seq uint64
	at  time.Time // local time of acceptance
}

func newValidator(now func() time.Time) *validator {
	return &validator{now: now, high: make(map[peer.ID]mark)}
}

// Validate is a pubsub.ValidatorEx. On Accept it stores the decoded vector in
// msg.ValidatorData for the subscriber.
func (v *validator) Validate(_ context.Context, _ peer.ID, msg *pubsub.Message) pubsub.ValidationResult {
	res := v.check(msg)
	switch res {
	case pubsub.ValidationAccept:
		v.accepted.Add(1)
	case pubsub.ValidationReject:
		v.rejected.Add(1)
	default:
		v.ignored.Add(1)
	}
	return res
}

func (v *validator) check(msg *pubsub.Message) pubsub.ValidationResult {
	if len(msg.Data) > caps.MaxEncodedSize {
		log.Debugw("announcement rejected", "peer", msg.ReceivedFrom, "err", caps.ErrTooLarge)
		return pubsub.ValidationReject
	}
	now := v.now()
	vec, err := caps.Verify(msg.Data, now)
	if err != nil {
		if errors.Is(err, caps.ErrExpired) || errors.Is(err, caps.ErrClockSkew) {
			log.Debugw("announcement ignored", "peer", msg.ReceivedFrom, "err", err)
			return pubsub.ValidationIgnore
		}
		log.Debugw("announcement rejected", "peer", msg.ReceivedFrom, "err", err)
		if errors.Is(err, caps.ErrOldShape) {
			v.old.note(msg.GetFrom(), msg.ReceivedFrom, err, now)
		}
		return pubsub.ValidationReject
	}
	author := msg.GetFrom()
	if author.String() != vec.PeerID {
		log.Debugw("announcement rejected: author is not the vector's peer", "peer", author, "target", vec.PeerID)
		return pubsub.ValidationReject
	}
	if v.newer != nil && v.newer(author, vec.Seq) {
		return pubsub.ValidationIgnore
	}
	if v.admit != nil && !v.admit(author, msg.ReceivedFrom) {
		log.Debugw("announcement ignored: not admitted to the registry", "peer", msg.ReceivedFrom, "author", author)
		return pubsub.ValidationIgnore
	}
	if !v.advance(author, vec.Seq, now) {
		return pubsub.ValidationIgnore
	}
	msg.ValidatorData = vec
	return pubsub.ValidationAccept
}

// advance raises the high-water mark of p to seq and reports whether seq was above it.
func (v *validator) advance(p peer.ID, seq uint64, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if m, ok := v.high[p]; ok {
		if seq <= m.seq {
			return false
		}
	} else if len(v.high) >= highWaterCap {
		v.evictLocked(now)
	}
	v.high[p] = mark{seq: seq, at: now}
	return true
}

// seen reports whether seq is at or under p's high-water mark (a replay or a rollback),
// without changing it.
func (v *validator) seen(p peer.ID, seq uint64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	m, ok := v.high[p]
	return ok && seq <= m.seq
}

// raise lifts p's high-water mark to seq (a peer the registry forgot or found unreachable:
// its last vector must not come back through a sync answer).
func (v *validator) raise(p peer.ID, seq uint64, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if m, ok := v.high[p]; ok && m.seq >= seq {
		return
	}
	if _, ok := v.high[p]; !ok && len(v.high) >= highWaterCap {
		v.evictLocked(now)
	}
	v.high[p] = mark{seq: seq, at: now}
}

func (v *validator) evictLocked(now time.Time) {
	var oldest peer.ID
	var oldestAt time.Time
	for id, m := range v.high {
		if now.Sub(m.at) > highWaterKeep {
			delete(v.high, id)
			continue
		}
		if oldest == "" || m.at.Before(oldestAt) {
			oldest, oldestAt = id, m.at
		}
	}
	if len(v.high) >= highWaterCap {
		delete(v.high, oldest)
	}
}

func (v *validator) counts() Counts {
	return Counts{Accepted: v.accepted.Load(), Rejected: v.rejected.Load(), Ignored: v.ignored.Load()}
}
