package webrtc

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

func TestEvictions(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for _, tc := range []struct {
		name          string
		cs            []connView
		keep, max, pp int
		want          []int
	}{
		{"within bounds", []connView{{"a", 0, at(1)}, {"b", 0, at(2)}}, 1, 2, 2, nil},
		{"least recently used idle first", []connView{{"a", 0, at(5)}, {"b", 0, at(1)}, {"c", 0, at(9)}}, 2, 2, 2, []int{1}},
		{"idle before busy", []connView{{"a", 3, at(1)}, {"b", 0, at(5)}, {"c", 0, at(9)}}, 2, 2, 2, []int{1}},
		{"busy when all are", []connView{{"a", 1, at(5)}, {"b", 2, at(1)}, {"c", 1, at(9)}}, 2, 2, 2, []int{1}},
		{"never keep", []connView{{"a", 0, at(5)}, {"b", 0, at(1)}}, 1, 1, 2, []int{0}},
		{"per peer", []connView{{"a", 0, at(1)}, {"a", 0, at(2)}, {"b", 0, at(0)}, {"a", 0, at(3)}}, 3, 8, 2, []int{0}},
		{"per peer then total", []connView{{"a", 0, at(1)}, {"a", 0, at(2)}, {"b", 0, at(0)}, {"a", 0, at(3)}}, 3, 2, 2, []int{0, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := evictions(tc.cs, tc.keep, tc.max, tc.pp); !slices.Equal(got, tc.want) {
				t.Fatalf("evictions %v, want %v", got, tc.want)
			}
		})
	}
}

// A peer's share of the pool: two (one each way) in a pool of 8 or more, one in a smaller
// one, so that it never holds more than a quarter of a pool of 4 or more.
func TestWarmShare(t *testing.T) {
	for maxWarm, want := range map[int]int{1: 1, 2: 1, 4: 1, 7: 1, 8: 2, 16: 2, 64: 2} {
		if got := warmShare(maxWarm); got != want {
			t.Errorf("warmShare(%d) = %d, want %d", maxWarm, got, want)
		}
	}
}

func TestIdleExpired(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		c    connView
		now  time.Time
		want bool
	}{
		{connView{streams: 0, lastUsed: t0}, t0.Add(time.Minute - time.Nanosecond), false},
		{connView{streams: 0, lastUsed: t0}, t0.Add(time.Minute), true},
		{connView{streams: 1, lastUsed: t0}, t0.Add(time.Hour), false},
	} {
		if got := idleExpired(tc.c, tc.now, time.Minute); got != tc.want {
			t.Errorf("idleExpired(%+v, +%v) = %v", tc.c, tc.now.Sub(t0), got)
		}
	}
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// A PeerConnection with no open stream for IdleClose is closed by the sweep (the remote
// sees it go); one with a stream open is kept however long.
func TestIdleClose(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	cfg := *loopbackEngine()
	cfg.IdleClose, cfg.Now = time.Minute, clock.Now
	p := newPair(t, cfg, *loopbackEngine())
	p.b.SetStreamHandler(echo)

	s, _, err := p.a.OpenStream(context.Background(), p.hb.ID())
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, s, []byte("ping"))
	clock.Advance(time.Hour)
	p.a.sweep()
	if st := p.a.Stats(); st.Open != 1 || st.IdleClosed != 0 {
		t.Fatalf("stats %+v: a peer connection with an open stream was closed", st)
	}
	s.Close()
	waitFor(t, "the stream to end", func() bool { return p.a.Stats().Streams == 0 })

	clock.Advance(time.Minute - time.Second)
	p.a.sweep()
	if st := p.a.Stats(); st.Open != 1 {
		t.Fatalf("stats %+v: closed before IdleClose", st)
	}
	clock.Advance(time.Second)
	p.a.sweep()
	if st := p.a.Stats(); st.Open != 0 || st.IdleClosed != 1 {
		t.Fatalf("stats %+v, want the idle peer connection closed and counted", st)
	}
	waitFor(t, "the remote to drop its side", func() bool { return p.b.Stats().Open == 0 })

	// The next stream sets up again.
	s, warm, err := p.a.OpenStream(context.Background(), p.hb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if warm {
		t.Fatal("stream after the idle close reported warm")
	}
	s.Close()
}

// Beyond MaxWarm the least recently used PeerConnection is closed.
func TestMaxWarmEvicts(t *testing.T) {
	ha, hb, hc := newHost(t), newHost(t), newHost(t)
	connect(t, ha, hb)
	connect(t, ha, hc)
	cfg := *loopbackEngine()
	cfg.MaxWarm = 1
	a := newTransport(t, ha, cfg)
	b, c := newTransport(t, hb, accepting()), newTransport(t, hc, accepting())
	b.SetStreamHandler(echo)
	c.SetStreamHandler(echo)
	for _, to := range []peer.ID{hb.ID(), hc.ID()} {
		s, _, err := a.OpenStream(context.Background(), to)
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, s, []byte("x"))
		s.Close()
		waitFor(t, "the stream to end", func() bool { return a.Stats().Streams == 0 })
	}
	if st := a.Stats(); st.Open != 1 || st.Evicted != 1 || st.ColdSetups != 2 {
		t.Fatalf("stats %+v, want one kept, one evicted", st)
	}
	waitFor(t, "the evicted peer to drop its side", func() bool { return b.Stats().Open == 0 })
	if _, warm, err := a.OpenStream(context.Background(), hc.ID()); err != nil || !warm {
		t.Fatalf("stream to the kept peer: warm %v, %v", warm, err)
	}
}

// A PeerConnection whose remote goes away is dropped at once, its streams broken.
func TestRemoteCloseDropsPeerConnection(t *testing.T) {
	cfg := *loopbackEngine()
	p := newPair(t, cfg, cfg)
	p.b.SetStreamHandler(func(_ peer.ID, s Stream) { s.Read(make([]byte, 1)) })
	s, _, err := p.a.OpenStream(context.Background(), p.hb.ID())
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte("x"))
	waitFor(t, "the remote to keep it", func() bool { return p.b.Stats().Open == 1 })
	p.b.Close()
	waitFor(t, "the peer connection to be dropped", func() bool {
		st := p.a.Stats()
		return st.Open == 0 && st.Streams == 0
	})
	if _, err := s.Read(make([]byte, 1)); err == nil {
		t.Fatal("read on a stream of a closed peer connection succeeded")
	}
}
