package webrtc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/datachannel"
	"github.com/pion/webrtc/v4"
)

// Reasons a PeerConnection closes, as its streams' errors wrap them.
var (
	errConnLost = errors.New("peer connection failed or closed")
	errEvicted  = errors.New("peer connection evicted")
	errIdle     = errors.New("peer connection idle")
	errBadPeer  = errors.New("peer broke the data channel protocol")
	errReleased = errors.New("relayed peer connection released")
)

// peerConn is one PeerConnection to a peer, with the streams on it. A relayed one
// (AcceptRelayed, DialRelayed) has no peer ID (the empty ID) and is never in the pool: it
// is in t.relayed until closed.
type peerConn struct {
	t    *Transport
	peer peer.ID
	pc   *webrtc.PeerConnection

	// relayFirst, on a PeerConnection AcceptRelayed answers (else nil), receives the first
	// stream the client opens, in place of the stream handler; relayReady is closed once it
	// holds it. Later streams are reset.
	relayFirst chan *stream
	relayReady chan struct{}
	relayOnce  sync.Once

	connected chan struct{} // closed when ICE and DTLS connect
	failed    chan struct{} // closed when the PeerConnection fails, disconnects or closes
	done      chan struct{} // closed when close starts
	connOnce  sync.Once     // guards connected
	failOnce  sync.Once     // guards failed
	closeOnce sync.Once

	// Guarded by t.mu.
	dead     bool                 // failed or closing: no stream may be added
	retired  bool                 // failed to open a stream: serves no new one
	lastUsed time.Time            // a stream opened or ended (t.cfg.Now)
	streams  map[*stream]struct{} // not yet ended
	incoming int                  // streams in streams the remote opened (maxIncomingPerConn)
}

// newPeerConn makes a PeerConnection to p and wires its callbacks; relayIn routes its
// first incoming stream to relayFirst.
func (t *Transport) newPeerConn(p peer.ID, relayIn bool) (*peerConn, error) {
	pc, err := t.api.NewPeerConnection(webrtc.Configuration{ICEServers: t.cfg.ICEServers})
	if err != nil {
		return nil, fmt.Errorf("new peer connection: %w", err)
	}
	c := &peerConn{
		t: t, peer: p, pc: pc,
		connected: make(chan struct{}), failed: make(chan struct{}), done: make(chan struct{}),
		streams: make(map[*stream]struct{}),
	}
	if relayIn {
		c.relayFirst, c.relayReady = make(chan *stream, 1), make(chan struct{})
	}
	pc.OnConnectionStateChange(c.onState)
	pc.SCTP().OnClose(func(error) { c.lost() })
	pc.OnDataChannel(c.accept)
	return c, nil
}

// onState runs on a goroutine of pion's for each state change.
func (c *peerConn) onState(st webrtc.PeerConnectionState) {
	switch st {
	case webrtc.PeerConnectionStateConnected:
		c.connOnce.Do(func() { close(c.connected) })
	case webrtc.PeerConnectionStateFailed, webrtc.PeerConnectionStateDisconnected, webrtc.PeerConnectionStateClosed:
		c.lost()
	}
}

// lost drops a PeerConnection that failed, disconnected or closed: out of the pool at
// once, closed on a goroutine of the Transport's. During set-up, failed tells the set-up.
func (c *peerConn) lost() {
	c.failOnce.Do(func() { close(c.failed) })
	t := c.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if c.dead {
		return
	}
	c.dead = true
	t.removeLocked(c)
	t.goLocked(func() { c.close(errConnLost) })
}

// close closes the PeerConnection; its streams fail with ErrReset wrapping why. It returns
// once pion's goroutines for it have ended (a concurrent call waits for the first).
func (c *peerConn) close(why error) {
	c.closeOnce.Do(func() {
		t := c.t
		t.mu.Lock()
		c.dead = true
		t.removeLocked(c)
		streams := make([]*stream, 0, len(c.streams))
		for s := range c.streams {
			streams = append(streams, s)
		}
		t.mu.Unlock()
		close(c.done)
		err := fmt.Errorf("%w: %w", ErrReset, why)
		for _, s := range streams {
			s.shutdown(err)
		}
		if err := c.pc.GracefulClose(); err != nil {
			log.Debugw("close peer connection", "peer", c.peer, "err", err)
		}
		// Only now, so that Transport.Close, finding it still there, waits for this close.
		t.mu.Lock()
		delete(t.relayed, c)
		t.mu.Unlock()
	})
}

// closeAfter closes c when done with s, the one stream of a relayed PeerConnection: at
// once if s is still open (it fails with ErrReset), else once s has ended, when the
// remote has closed its side too or after drainTimeout, so that what s sent before its
// Close or Reset is delivered (closing the PeerConnection drops what SCTP still holds).
func (c *peerConn) closeAfter(s *stream, why error) {
	s.mu.Lock()
	ended := s.ended
	s.mu.Unlock()
	if ended {
		select {
		case <-s.released:
		case <-c.done:
		}
	}
	c.close(why)
}

// viewLocked returns what eviction needs to know of c. t.mu must be held.
func (c *peerConn) viewLocked() connView {
	return connView{peer: c.peer, streams: len(c.streams), lastUsed: c.lastUsed}
}

// openStream opens a new data channel on c and waits for it to open.
func (c *peerConn) openStream(ctx context.Context) (*stream, error) {
	dc, err := c.pc.CreateDataChannel("", nil)
	if err != nil {
		return nil, fmt.Errorf("create data channel: %w", err)
	}
	return c.awaitOpen(ctx, dc)
}

// awaitOpen waits for a data channel this side created to open, then detaches it. A
// detached channel opens as soon as its open message is queued (no round trip), once
// the SCTP association is up: on a PeerConnection this node answered, that may be a few
// round trips after it counts as connected, hence the ConnectTimeout bound.
func (c *peerConn) awaitOpen(ctx context.Context, dc *webrtc.DataChannel) (*stream, error) {
	opened := make(chan struct{})
	dc.OnOpen(func() { close(opened) })
	timer := time.NewTimer(c.t.cfg.ConnectTimeout)
	defer timer.Stop()
	select {
	case <-opened:
	case <-c.done:
		return nil, fmt.Errorf("%w: %w", ErrReset, errConnLost)
	case <-timer.C:
		dc.Close()
		return nil, fmt.Errorf("%w: data channel not open after %v", ErrSetupTimeout, c.t.cfg.ConnectTimeout)
	case <-ctx.Done():
		dc.Close()
		return nil, ctx.Err()
	}
	return c.attach(dc, false)
}

// attach detaches an open data channel and adds it to c as a stream. A channel the remote
// opened (incoming) must fit maxIncomingPerConn on c and maxStreams over the Transport, and
// is counted as an inbound stream of its peer in the host's resource manager until it ends;
// one that does not is closed at once.
func (c *peerConn) attach(dc *webrtc.DataChannel, incoming bool) (*stream, error) {
	rwc, err := dc.DetachWithDeadline()
	if err != nil {
		dc.Close()
		return nil, fmt.Errorf("detach data channel: %w", err)
	}
	raw, ok := rwc.(*datachannel.DataChannel)
	if !ok {
		rwc.Close()
		return nil, fmt.Errorf("detached data channel of type %T", rwc)
	}
	s := newStream(c, raw)
	t := c.t
	if incoming && t.h != nil {
		scope, err := t.h.Network().ResourceManager().OpenStream(c.peer, network.DirInbound)
		if err != nil {
			raw.Close()
			return nil, fmt.Errorf("%w: the resource manager refused it: %w", ErrTooManyStreams, err)
		}
		s.scope = scope
	}
	t.mu.Lock()
	if c.dead {
		t.mu.Unlock()
		s.done()
		raw.Close()
		return nil, fmt.Errorf("%w: %w", ErrReset, errConnLost)
	}
	if incoming && (c.incoming >= maxIncomingPerConn || t.streams >= maxStreams) {
		n, all := c.incoming, t.streams
		t.mu.Unlock()
		s.done()
		raw.Close()
		return nil, fmt.Errorf("%w: %d open on this connection (at most %d), %d in all (at most %d)",
			ErrTooManyStreams, n, maxIncomingPerConn, all, maxStreams)
	}
	if incoming {
		c.incoming++
		s.incoming = true
	}
	c.streams[s] = struct{}{}
	c.lastUsed = t.cfg.Now()
	t.streams++
	t.mu.Unlock()
	return s, nil
}

// release forgets an ended stream.
func (c *peerConn) release(s *stream) {
	t := c.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := c.streams[s]; !ok {
		return
	}
	delete(c.streams, s)
	if s.incoming {
		c.incoming--
	}
	c.lastUsed = t.cfg.Now()
	t.streams--
	s.done()
}

// accept takes a data channel the remote opened. It runs on pion's goroutine and must
// return promptly; the stream is handed over once the channel opens.
func (c *peerConn) accept(dc *webrtc.DataChannel) {
	if !dc.Ordered() || dc.MaxRetransmits() != nil || dc.MaxPacketLifeTime() != nil || dc.Label() != "" || dc.Protocol() != "" {
		log.Debugw("refused a data channel that is not a stream", "peer", c.peer)
		dc.Close()
		return
	}
	dc.OnOpen(func() {
		s, err := c.attach(dc, true)
		if err != nil {
			log.Debugw("incoming stream", "peer", c.peer, "err", err)
			return
		}
		if c.relayFirst == nil {
			c.t.dispatch(c.peer, s)
			return
		}
		first := false
		c.relayOnce.Do(func() {
			first = true
			c.relayFirst <- s // never blocks: room for one
			close(c.relayReady)
		})
		if !first {
			s.Reset()
		}
	})
}
