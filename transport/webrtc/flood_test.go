package webrtc

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// A peer that opens data channel after data channel on one PeerConnection gets at most
// maxIncomingPerConn of them served at once; the rest are closed as they open, and each
// served one counts as an inbound stream of that peer in the host's resource manager
// (issue 19, finding 1: 4,000 channels used to raise a node's memory by 280 MB).
func TestDataChannelFloodIsCapped(t *testing.T) {
	cfg := *loopbackEngine()
	p := newPair(t, cfg, cfg)
	release := make(chan struct{})
	var served atomic.Int64
	var handlers sync.WaitGroup
	p.b.SetStreamHandler(func(_ peer.ID, s Stream) {
		handlers.Add(1)
		defer handlers.Done()
		served.Add(1)
		<-release // hold every stream open, as a peer that never finishes its requests
		s.Reset()
	})
	var readers sync.WaitGroup
	var once sync.Once
	stop := func() { // the served streams end, then their readers and handlers
		once.Do(func() { close(release) })
		readers.Wait()
		handlers.Wait()
	}
	defer stop()

	const flood = 3 * maxIncomingPerConn
	var refused atomic.Int64
	for range flood {
		readers.Go(func() {
			s, _, err := p.a.OpenStream(context.Background(), p.hb.ID())
			if err != nil {
				refused.Add(1)
				return
			}
			// A refused channel is closed by the other side as it opens: its read ends at
			// once. A served one ends when the test releases it (counted by the handler).
			var b [1]byte
			if _, err := s.Read(b[:]); err != nil {
				select {
				case <-release:
				default:
					refused.Add(1)
				}
			}
			s.Reset()
		})
	}
	waitFor(t, "every opened stream served or refused", func() bool {
		return served.Load()+refused.Load() >= flood && served.Load() >= maxIncomingPerConn
	})
	if n := served.Load(); n != maxIncomingPerConn {
		t.Fatalf("%d streams served at once from one PeerConnection, want %d", n, maxIncomingPerConn)
	}
	var inbound int
	p.hb.Network().ResourceManager().ViewPeer(p.ha.ID(), func(s network.PeerScope) error {
		inbound = s.Stat().NumStreamsInbound
		return nil
	})
	if inbound < maxIncomingPerConn {
		t.Fatalf("the resource manager sees %d inbound streams of the flooding peer, want at least %d", inbound, maxIncomingPerConn)
	}
	if st := p.b.Stats(); st.Streams > maxIncomingPerConn {
		t.Fatalf("%d streams open on the flooded side, want at most %d", st.Streams, maxIncomingPerConn)
	}
	stop()
}
