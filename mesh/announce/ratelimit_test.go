package announce

import (
	"encoding/binary"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pubsub_pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// TestRateLimitPerAuthor: each author's announcements take a token of its own bucket;
// past rateBurst they are ignored and counted without moving the seq mark, one token
// comes back every heartbeat/ratePerHeartbeat, and the bucket never holds more than
// rateBurst. Another author is unaffected.
func TestRateLimitPerAuthor(t *testing.T) {
	const heartbeat = 15 * time.Second
	refill := heartbeat / ratePerHeartbeat
	start := time.Now()
	now := start
	v := newValidator(func() time.Time { return now }, heartbeat)
	env := uint64(0)
	msg := func(key crypto.PrivKey, seq uint64) *pubsub.Message {
		id, _ := peer.IDFromPrivateKey(key)
		env++ // a fresh GossipSub message each time, as the author's publishes are
		return &pubsub.Message{Message: &pubsub_pb.Message{From: []byte(id),
			Seqno: binary.BigEndian.AppendUint64(nil, env), Data: signed(t, key, seq, start, caps.MaxTTL, nil)}}
	}
	a, b := newKey(t), newKey(t)
	aID, _ := peer.IDFromPrivateKey(a)
	check := func(what string, key crypto.PrivKey, seq uint64, want pubsub.ValidationResult) {
		t.Helper()
		if got := v.check(msg(key, seq)); got != want {
			t.Fatalf("%s (seq %d): %v, want %v", what, seq, got, want)
		}
	}

	seq := uint64(0)
	for range rateBurst {
		seq++
		check("within the burst", a, seq, pubsub.ValidationAccept)
	}
	for range 10 {
		check("past the burst", a, seq+1, pubsub.ValidationIgnore)
	}
	if got := v.limited.Load(); got != 10 {
		t.Fatalf("rate-limited count %d, want 10", got)
	}
	if v.seen(aID, seq+1) {
		t.Fatal("a rate-limited announcement raised the seq mark")
	}
	check("another author", b, 1, pubsub.ValidationAccept)

	// This node's own announcements are never limited: b is this node here.
	bID, _ := peer.IDFromPrivateKey(b)
	v.self = bID
	for s := range uint64(2 * rateBurst) {
		check("this node's own", b, 2+s, pubsub.ValidationAccept)
	}
	v.self = ""

	// Just short of one refill: still nothing. At one refill: exactly one more.
	now = start.Add(refill - time.Millisecond)
	check("before a token is back", a, seq+1, pubsub.ValidationIgnore)
	now = start.Add(refill)
	seq++
	check("one token back", a, seq, pubsub.ValidationAccept)
	check("only one", a, seq+1, pubsub.ValidationIgnore)

	// A long silence refills the bucket to rateBurst, not more.
	now = now.Add(10 * refill) // within the vectors' validity (caps.MaxTTL)
	for range rateBurst {
		seq++
		check("after a long silence", a, seq, pubsub.ValidationAccept)
	}
	check("past the refilled burst", a, seq+1, pubsub.ValidationIgnore)

	// A clock that goes back refills nothing.
	now = start
	check("clock went back", a, seq+1, pubsub.ValidationIgnore)
	if c := v.counts(); c.RateLimited != 14 || c.Ignored != 0 {
		// check bypasses Validate's counting of outcomes; only the rate-limited count is kept
		// by check itself.
		t.Fatalf("counts %+v, want 14 rate-limited", c)
	}
	t.Logf("figure F10: per author a burst of %d, then one per heartbeat/3; none refilled when the clock goes back", rateBurst)
}

// TestAnnouncementFloodIsRateLimited is F10's second attacker on real hosts: an identity
// publishing validly signed announcements, each above the last seq, as fast as it can. The
// victim (its clock held still, so no token comes back during the test however slow the
// machine) accepts rateBurst of them, ignores and counts the rest, keeps the registry at
// the last accepted seq, and records no penalty: the author broke no rule a relay could
// not also have broken honestly.
func TestAnnouncementFloodIsRateLimited(t *testing.T) {
	frozen := time.Now()
	r := newRigClock(t, 2*time.Minute, 0, func() time.Time { return frozen })
	const flood = 50
	// r.send returns every outcome in its window, the victim's validation of its own
	// announcements included (it may publish again when the attacker joins): a window holds
	// at least the attacker's outcome, and rate-limited ones are all the attacker's.
	limited := uint64(0)
	for seq := uint64(1); seq <= flood; seq++ {
		got := r.send(t, signed(t, r.attKey, seq, frozen, time.Minute, nil))
		limited += got.RateLimited
		switch {
		case seq <= rateBurst && (got.Accepted == 0 || got.RateLimited != 0):
			t.Fatalf("announcement %d within the burst: %+v, want accepted", seq, got)
		case seq > rateBurst && (got.RateLimited != 1 || got.Ignored != 1):
			t.Fatalf("announcement %d past the burst: %+v, want ignored as rate-limited", seq, got)
		}
	}
	if limited != flood-rateBurst {
		t.Fatalf("%d of %d announcements rate-limited, want %d", limited, flood, flood-rateBurst)
	}
	waitFor(t, "the last accepted vector in the registry", func() bool {
		s, ok := r.reg.Seq(r.attacker.ID())
		return ok && s == rateBurst
	})
	if reason, _, changed := r.rep.LastChange(r.attacker.ID().String()); changed {
		t.Fatalf("the rate-limited author was penalized (%s)", reason)
	}
	t.Logf("figure F10: of %d signed announcements of one identity (clock held) %d accepted, %d ignored as rate-limited, no penalty", flood, flood-int(limited), limited)
}
