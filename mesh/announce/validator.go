package announce

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/reputation"
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
	// observe, when set, records a misbehaving signed author in reputation.
	observe func(p peer.ID, e reputation.Event)

	accepted, rejected, ignored atomic.Uint64
	old                         oldShapeLog // warns about peers still on the caps/1 shape

	mu   sync.Mutex
	high map[peer.ID]mark
}

type mark struct {
	seq uint64
	at  time.Time // local time of acceptance
	env uint64    // the accepted GossipSub message's seqno (0: raised by a sweep or a drop)
	// envSeq is the vector seq that message env carried: seq may be raised past it by a
	// sweep or a drop, and the registry may hold a higher one from a sync answer, but only
	// (envSeq, env) are a pair the author signed.
	envSeq uint64
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
	// GossipSub checked the message's own signature (StrictSign): its author produced these
	// bytes, so a Reject below is the author's doing and is recorded against it.
	author := msg.GetFrom()
	if len(msg.Data) > caps.MaxEncodedSize {
		return v.reject(msg, author, reputation.MalformedFrame, caps.ErrTooLarge)
	}
	now := v.now()
	vec, err := caps.Verify(msg.Data, now)
	switch {
	case errors.Is(err, caps.ErrExpired) || errors.Is(err, caps.ErrClockSkew):
		log.Debugw("announcement ignored", "peer", msg.ReceivedFrom, "err", err)
		return pubsub.ValidationIgnore
	case errors.Is(err, caps.ErrOldShape):
		// An older version, not misbehaviour: refused with a warning, no penalty.
		log.Debugw("announcement rejected", "peer", msg.ReceivedFrom, "err", err)
		v.old.note(author, msg.ReceivedFrom, err, now)
		return pubsub.ValidationReject
	case errors.Is(err, caps.ErrBadSignature):
		return v.reject(msg, author, reputation.ForgedAnnouncement, err)
	case err != nil:
		return v.reject(msg, author, reputation.MalformedFrame, err)
	}
	if author.String() != vec.PeerID {
		return v.reject(msg, author, reputation.ForgedAnnouncement, errors.New("author is not the vector's peer"))
	}
	seqno := envelopeSeqno(msg)
	if v.newer != nil && v.newer(author, vec.Seq) {
		v.replayed(author, vec.Seq, seqno)
		return pubsub.ValidationIgnore
	}
	if v.admit != nil && !v.admit(author, msg.ReceivedFrom) {
		log.Debugw("announcement ignored: not admitted to the registry", "peer", msg.ReceivedFrom, "author", author)
		return pubsub.ValidationIgnore
	}
	if !v.advance(author, vec.Seq, seqno, now) {
		v.replayed(author, vec.Seq, seqno)
		return pubsub.ValidationIgnore
	}
	msg.ValidatorData = vec
	return pubsub.ValidationAccept
}

// reject logs and counts a Reject, and records it against the message's signed author.
func (v *validator) reject(msg *pubsub.Message, author peer.ID, e reputation.Event, err error) pubsub.ValidationResult {
	log.Debugw("announcement rejected", "peer", msg.ReceivedFrom, "author", author, "reason", e, "err", err)
	if v.observe != nil && author != "" {
		v.observe(author, e)
	}
	return pubsub.ValidationReject
}

// replayed handles a vector of seq seq, in the GossipSub message seqno, at or below the
// author's seq mark or the registry's. Whoever replays a whole GossipSub message cannot
// change its seqno (it is signed), so a message whose seqno is not above the author's
// latest accepted one is someone's replay: ignored, nobody penalized. A message the author
// signed afresh around a vector no newer than one it signed in an earlier message is the
// author rolling back its own seq: a protocol violation. Only that pair (envSeq, env) proves
// it: a message merely older than a vector a sync answer brought, or than a mark raised when
// the registry forgot the author, arrives late after a partition, and is only ignored.
func (v *validator) replayed(author peer.ID, seq, seqno uint64) {
	v.mu.Lock()
	m, ok := v.high[author]
	v.mu.Unlock()
	if ok && m.env != 0 && seqno > m.env && seq <= m.envSeq && v.observe != nil {
		log.Debugw("announcement ignored: author re-signed an old vector", "author", author)
		v.observe(author, reputation.ProtocolViolation)
	}
}

// envelopeSeqno is the GossipSub message's own sequence number (8 bytes, big-endian), or 0.
func envelopeSeqno(msg *pubsub.Message) uint64 {
	b := msg.GetSeqno()
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// advance raises the high-water mark of p to seq, accepted in the GossipSub message env,
// and reports whether seq was above it.
func (v *validator) advance(p peer.ID, seq, env uint64, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if m, ok := v.high[p]; ok {
		if seq <= m.seq {
			return false
		}
	} else if len(v.high) >= highWaterCap {
		v.evictLocked(now)
	}
	v.high[p] = mark{seq: seq, at: now, env: env, envSeq: seq}
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
	m, ok := v.high[p]
	if ok && m.seq >= seq {
		return
	}
	if !ok && len(v.high) >= highWaterCap {
		v.evictLocked(now)
	}
	v.high[p] = mark{seq: seq, at: now, env: m.env, envSeq: m.envSeq}
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
