package infer

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// openStreams counts h's open streams to p speaking proto.
func openStreams(h host.Host, p peer.ID, proto protocol.ID) int {
	n := 0
	for _, c := range h.Network().ConnsToPeer(p) {
		for _, s := range c.GetStreams() {
			if s.Protocol() == proto {
				n++
			}
		}
	}
	return n
}

func (c *Client) pooledTo(p peer.ID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pool[p])
}

// generateSame runs req on the pair's server and checks the tokens against the backend's own.
func generateSame(t *testing.T, p pair, maxTokens int) {
	t.Helper()
	var local, remote []inference.Token
	if _, err := p.be.Generate(context.Background(), request(maxTokens), collect(&local)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.client.Generate(context.Background(), p.sh.ID(), request(maxTokens), collect(&remote)); err != nil {
		t.Fatal(err)
	}
	if len(remote) != len(local) {
		t.Fatalf("%d tokens, want %d", len(remote), len(local))
	}
	for i := range local {
		if local[i] != remote[i] {
			t.Fatalf("token %d: %+v, want %+v", i, remote[i], local[i])
		}
	}
}

// Requests one after another go on one stream (ReuseID), with the same answers.
func TestRequestsReuseOneStream(t *testing.T) {
	p := newPair(t, nil)
	for range 3 {
		generateSame(t, p, 12)
	}
	ch := p.client.h.ID()
	waitFor(t, "served 3", func() bool { return p.server.Stats().Served == 3 })
	if n := openStreams(p.sh, ch, ReuseID); n != 1 {
		t.Errorf("server side: %d open %s streams after 3 requests, want 1", n, ReuseID)
	}
	if n := p.client.pooledTo(p.sh.ID()); n != 1 {
		t.Errorf("client pool: %d streams, want 1", n)
	}
}

// A pooled stream the server closed while idle is found ended and the request goes again on
// a new stream: the caller sees no error.
func TestIdleSessionClosedByServerIsRetried(t *testing.T) {
	p := newPair(t, []ServerOption{WithSessionIdle(50 * time.Millisecond)})
	generateSame(t, p, 6)
	ch := p.client.h.ID()
	waitFor(t, "the server to close the idle stream", func() bool { return openStreams(p.sh, ch, ReuseID) == 0 })
	if n := p.client.pooledTo(p.sh.ID()); n != 1 {
		t.Fatalf("client pool: %d, want the stale stream still there", n)
	}
	generateSame(t, p, 6)
	// The server counts a request once its terminal frame is out: the client may be first.
	waitFor(t, "served 2", func() bool { st := p.server.Stats(); return st.Served == 2 && st.InFlight == 0 })
	if st := p.server.Stats(); st.ProtocolErrors != 0 || st.ClientDisconnected != 0 {
		t.Errorf("server stats %+v: want no protocol errors, no disconnects", st)
	}
}

// Close ends a session waiting for its next request at once, not after the idle time.
func TestServerCloseEndsIdleSessions(t *testing.T) {
	p := newPair(t, nil) // DefaultSessionIdle: a minute
	generateSame(t, p, 4)
	closed := make(chan struct{})
	go func() { p.server.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for the idle session")
	}
}

// A server that speaks only ID (an older node) is served one request per stream.
func TestOneShotServerStillServed(t *testing.T) {
	p := newPair(t, nil)
	p.sh.RemoveStreamHandler(ReuseID)
	// The client learns it through identify's push: until then its peerstore still lists
	// ReuseID and it would open one, lazily negotiated, which the server resets.
	waitFor(t, "the client to learn the server dropped ReuseID", func() bool {
		protos, err := p.client.h.Peerstore().SupportsProtocols(p.sh.ID(), ReuseID)
		return err == nil && len(protos) == 0
	})
	for range 2 {
		generateSame(t, p, 6)
	}
	if n := p.client.pooledTo(p.sh.ID()); n != 0 {
		t.Errorf("client pool: %d streams to a one-shot server, want 0", n)
	}
	waitFor(t, "served 2", func() bool { return p.server.Stats().Served == 2 })
}

// A client that sends its next request before the terminal frame breaks the protocol: the
// running request is cancelled and the stream reset.
func TestFrameBeforeTerminalIsProtocolError(t *testing.T) {
	ch, sh, gen, srv := blockingServer(t, 1)
	st, err := ch.NewStream(context.Background(), sh.ID(), ReuseID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Reset()
	body, err := EncodeRequest(request(8), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := frame.Write(st, body); err != nil {
		t.Fatal(err)
	}
	<-gen.started
	if err := frame.Write(st, body); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the protocol error", func() bool {
		s := srv.Stats()
		return s.ProtocolErrors == 1 && s.InFlight == 0 && openStreams(sh, ch.ID(), ReuseID) == 0
	})
}

// A peer this node never asks again (it left) does not keep its idle streams, nor its
// connection with them: every poolIdle, a put or take closes every peer's expired ones.
func TestPoolForgetsPeersNeverAskedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &Client{pool: map[peer.ID][]pooled{}}
		gone, other := &closeCounter{}, &closeCounter{}
		c.put("gone", gone)
		time.Sleep(poolIdle)
		c.put("other", other)
		if gone.closed != 1 || c.pooledTo("gone") != 0 {
			t.Fatalf("idle for %v, the stream of a peer never asked again: closed %d times, %d pooled; want closed, none", poolIdle, gone.closed, c.pooledTo("gone"))
		}
		if other.closed != 0 || c.pooledTo("other") != 1 {
			t.Fatalf("a fresh stream: closed %d times, %d pooled; want kept", other.closed, c.pooledTo("other"))
		}
	})
}

// closeCounter is a stream that only counts its closes.
type closeCounter struct {
	network.Stream
	closed int
}

func (s *closeCounter) Close() error {
	s.closed++
	return nil
}
