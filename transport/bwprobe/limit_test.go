package bwprobe

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/internal/window"
)

// The client's limits: a peer once per ProbeInterval, ProbeBurst probes per ProbeWindow in
// all; the remembered peers are bounded.
func TestClientLimits(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewClient(nil, bandwidth.New(), WithClientClock(func() time.Time { return now }))
	p := func(i int) peer.ID { return peer.ID(fmt.Sprint("peer", i)) }
	if !c.allow(p(0)) || c.allow(p(0)) {
		t.Fatal("a peer probed twice at once")
	}
	for i := 1; i < ProbeBurst; i++ {
		if !c.allow(p(i)) {
			t.Fatalf("probe %d of the window refused", i+1)
		}
	}
	if c.allow(p(ProbeBurst)) {
		t.Fatalf("probe %d within a window of %d allowed", ProbeBurst+1, ProbeBurst)
	}
	now = now.Add(ProbeWindow)
	if !c.allow(p(ProbeBurst)) {
		t.Fatal("a new window refused a new peer")
	}
	if c.allow(p(ProbeBurst)) {
		t.Fatal("a peer probed twice at once in a new window")
	}
	now = now.Add(ProbeInterval)
	if !c.allow(p(0)) {
		t.Fatal("a peer not probed again after ProbeInterval")
	}

	s := window.Keyed[peer.ID]{Length: ProbeInterval, Max: 1, Cap: maxPeersRemembered} // as the client's
	for i := range maxPeersRemembered {
		if !s.Allow(p(i), now) {
			t.Fatalf("peer %d not due", i)
		}
		s.Add(p(i), now)
	}
	if s.Allow(p(-1), now) {
		t.Fatal("a new peer due with every remembered peer's interval running")
	}
	if !s.Allow(p(-1), now.Add(ProbeInterval)) || s.Len() != 0 {
		t.Fatalf("once their intervals are over: %d peers still remembered", s.Len())
	}
}

// The server's admission: the bounds first, then the admission hook, then one probe at a
// time per peer, one start per ServeInterval per peer, MaxServing at once.
func TestServerLimits(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	paused := false
	s := newServer(bandwidth.New(), WithClock(func() time.Time { return now }), WithAdmission(func(peer.ID) error {
		if paused {
			return inference.Errorf(inference.CodePolicyPaused, "paused")
		}
		return nil
	}))
	defer s.Close()
	p := func(i int) peer.ID { return peer.ID(fmt.Sprint("peer", i)) }
	for _, tc := range []struct{ up, down uint64 }{{MaxProbeBytes + 1, 0}, {0, MaxProbeBytes + 1}, {MaxProbeBytes, 1}, {1 << 63, 1 << 63}} {
		if code := s.acquire(p(0), tc.up, tc.down); code != inference.CodeInvalidRequest {
			t.Fatalf("(%d, %d): %q, want invalid_request", tc.up, tc.down, code)
		}
	}
	paused = true
	if code := s.acquire(p(0), 1, 1); code != inference.CodePolicyPaused {
		t.Fatalf("paused: %q, want policy_paused", code)
	}
	paused = false
	if code := s.acquire(p(0), DefaultProbeBytes, DefaultProbeBytes); code != "" {
		t.Fatalf("first probe: %q", code)
	}
	if code := s.acquire(p(0), 1, 1); code != inference.CodeOverloaded {
		t.Fatalf("a second at once from the same peer: %q, want overloaded", code)
	}
	s.release(p(0))
	if code := s.acquire(p(0), 1, 1); code != inference.CodeOverloaded {
		t.Fatalf("again within ServeInterval: %q, want overloaded", code)
	}
	for i := 1; i < MaxServing; i++ {
		if code := s.acquire(p(i), 1, 1); code != "" {
			t.Fatalf("probe %d at once: %q", i, code)
		}
	}
	now = now.Add(ServeInterval)
	if code := s.acquire(p(0), 1, 1); code != "" {
		t.Fatalf("after ServeInterval, with %d running: %q", MaxServing-1, code)
	}
	if code := s.acquire(p(MaxServing), 1, 1); code != inference.CodeOverloaded {
		t.Fatalf("probe %d at once: %q, want overloaded", MaxServing+1, code)
	}
}

// The server's bounds on a stream: a request must come within RequestTimeout; a refused
// request's payload is never read (the client sent it anyway).
func TestServerBoundsOnTheStream(t *testing.T) {
	fast := func() float64 { return 100 * mbit }
	synctest.Test(t, func(t *testing.T) {
		s := newServer(bandwidth.New())
		defer s.Close()
		_, b := newLink(fast, fast, time.Millisecond, 0, 1)
		began := time.Now()
		if err := s.serve("client", b); err == nil || time.Since(began) != RequestTimeout {
			t.Fatalf("no request: %v after %v, want an error after %v", err, time.Since(began), RequestTimeout)
		}

		a, b := newLink(fast, fast, time.Millisecond, 0, 3)
		const payload = 16 * linkChunk
		a.Write(frame.Append(nil, encodeRequest(MaxProbeBytes, 1)))
		a.Write(make([]byte, payload))
		if err := s.serve("client", b); err != nil {
			t.Fatal(err)
		}
		if left := len(b.in.q)*linkChunk + len(b.in.pending); left != payload {
			t.Fatalf("the server read %d payload bytes of a refused probe", payload-left)
		}
		if st := s.Stats(); st.Refused != 1 {
			t.Fatalf("stats %+v, want one refusal", st)
		}
	})
}
