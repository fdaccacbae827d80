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

// The per-author rate limit (docs/reliability.md F10): a token bucket for each signed
// author, kept with its seq high-water mark (so the same cap and eviction bound it). Each
// announcement the validator would accept takes a token; one that finds none is Ignored and
// counted as rate-limited, and changes no state: the mark stays where it was, so the next
// announcement in the author's own sequence is accepted once a token has come back. Ignore,
// not Reject: a relay that accepted the same message a moment earlier, when its own bucket
// for the author had a token, forwarded it honestly and must not be penalized by GossipSub.
//
// Without it, an identity that signs a fresh vector as fast as it can (each one valid, each
// one above the last seq) would have every one of them verified, stored, pushed to the
// registry and forwarded to the whole mesh: registry churn and mesh-wide amplification for
// the price of one key. With it, one identity moves the registry at most rateBurst times
// back to back and ratePerHeartbeat times per heartbeat after that.
const (
	// rateBurst is how many announcements of one author are accepted back to back. An
	// honest node can publish several within one heartbeat: at start, again when its first
	// peer joins, on a participation change, and when a stage range starts loading and
	// when it is warm (publishes are at least DefaultMinGap, 1 s, apart). Four lets such a
	// burst through; the heartbeat that follows brings whatever a dropped one said.
	rateBurst = 4
	// ratePerHeartbeat is how many announcements of one author are accepted per heartbeat in
	// the long run: a token comes back every Heartbeat/3, 5 s at the default 15 s (the
	// figure of F10: at most one accepted announcement per peer per 5 s). An honest node
	// publishes once per heartbeat plus its occasional changes. It assumes the nodes of a
	// mesh share one heartbeat, as they do by default; a node announcing three times faster
	// than this one's heartbeat is limited.
	ratePerHeartbeat = 3
)

// Counts of validation outcomes, for the console.
type Counts struct {
	Accepted uint64 `json:"accepted"`
	Rejected uint64 `json:"rejected"`
	Ignored  uint64 `json:"ignored"`
	// RateLimited counts the announcements ignored because their author had used up its
	// rate (also counted in Ignored).
	RateLimited uint64 `json:"rate_limited"`
}

// validator checks incoming announcements. It keeps the per-peer seq high-water mark.
type validator struct {
	now func() time.Time
	// self is this node: its own announcements, which pubsub validates when it publishes
	// them, are never rate-limited (it re-announces at once when a range loads or its
	// participation changes, and its own announcements are not a flood to defend against).
	self peer.ID
	// refill is how long one token of an author's rate takes to come back: the heartbeat
	// over ratePerHeartbeat.
	refill time.Duration
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

	accepted, rejected, ignored, limited atomic.Uint64
	old                                  oldShapeLog // warns about peers still on the caps/1 shape

	mu   sync.Mutex
	high map[peer.ID]mark
}

type mark struct {
	seq uint64
	at  time.Time // local time of acceptance
	env uint64    // the accepted GossipSub message's seqno (0: raised by a sweep or a drop)
	// tokens is what is left of the author's rate as of at (see rateBurst).
	tokens float64
	// envSeq is the vector seq that message env carried: seq may be raised past it by a
	// sweep or a drop, and the registry may hold a higher one from a sync answer, but only
	// (envSeq, env) are a pair the author signed.
	envSeq uint64
}

// tokensAt is what the author's rate holds at now: the tokens left at m.at, plus one per
// refill since, up to rateBurst. A clock that went back refills nothing.
func (m mark) tokensAt(now time.Time, refill time.Duration) float64 {
	if !now.After(m.at) || refill <= 0 {
		return m.tokens
	}
	return min(rateBurst, m.tokens+float64(now.Sub(m.at))/float64(refill))
}

// newValidator returns a validator whose per-author rate is ratePerHeartbeat announcements
// per heartbeat.
func newValidator(now func() time.Time, heartbeat time.Duration) *validator {
	return &validator{now: now, refill: heartbeat / ratePerHeartbeat, high: make(map[peer.ID]mark)}
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
	switch v.advance(author, vec.Seq, seqno, now) {
	case replay:
		v.replayed(author, vec.Seq, seqno)
		return pubsub.ValidationIgnore
	case rateLimited:
		v.limited.Add(1)
		log.Debugw("announcement ignored: author over its rate", "peer", msg.ReceivedFrom, "author", author)
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

// advanced is what advance did.
type advanced int

const (
	raised      advanced = iota // seq was above the mark, and the author had a token left
	replay                      // seq at or below the mark
	rateLimited                 // seq above the mark, but no token left
)

// advance raises the high-water mark of p to seq, accepted in the GossipSub message env,
// and takes one token of p's rate, when seq is above the mark and a token is left. Otherwise
// it changes nothing.
func (v *validator) advance(p peer.ID, seq, env uint64, now time.Time) advanced {
	v.mu.Lock()
	defer v.mu.Unlock()
	tokens := float64(rateBurst)
	if m, ok := v.high[p]; ok {
		if seq <= m.seq {
			return replay
		}
		if tokens = m.tokensAt(now, v.refill); tokens < 1 && p != v.self {
			return rateLimited
		}
	} else if len(v.high) >= highWaterCap {
		v.evictLocked(now)
	}
	v.high[p] = mark{seq: seq, at: now, env: env, envSeq: seq, tokens: max(tokens-1, 0)}
	return raised
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
	tokens := float64(rateBurst)
	if ok {
		tokens = m.tokensAt(now, v.refill)
	} else if len(v.high) >= highWaterCap {
		v.evictLocked(now)
	}
	v.high[p] = mark{seq: seq, at: now, env: m.env, envSeq: m.envSeq, tokens: tokens}
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
	return Counts{Accepted: v.accepted.Load(), Rejected: v.rejected.Load(), Ignored: v.ignored.Load(), RateLimited: v.limited.Load()}
}
