package webrtc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/webrtc/v4"
)

// SignalStream is what a signaling exchange needs of its stream: a libp2p stream, or any
// framed pipe (a coordinator's relay). network.Stream satisfies it.
type SignalStream interface {
	io.Reader
	io.Writer
	Close() error
	Reset() error
	SetDeadline(time.Time) error
	SetReadDeadline(time.Time) error
}

var _ SignalStream = network.Stream(nil)

// RelayConfig configures DialRelayed. Zero fields take the Transport defaults.
type RelayConfig struct {
	// ICEServers are the STUN and TURN servers ICE may use (default none: host candidates
	// only).
	ICEServers []webrtc.ICEServer
	// ConnectTimeout bounds the set-up: signaling, ICE, DTLS and SCTP
	// (DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// SettingEngine configures pion; nil means DefaultSettingEngine(). It is copied and
	// completed as Config.SettingEngine is.
	SettingEngine *webrtc.SettingEngine
}

// relayWhat names a relayed set-up in errors; it has no peer ID to name.
const relayWhat = "relayed webrtc set-up"

// AcceptRelayed answers an offer relayed over sig by the peer via (the coordinator) on a
// one-shot PeerConnection for a client that is not a libp2p peer, and returns the first data channel the client opens on it, as a
// Stream. The PeerConnection is not in the warm pool (not counted in MaxWarm, never reused for
// OpenStream, not given to the stream handler); release closes it (call it when done with the
// stream; idempotent). On success sig is left open with no deadline, positioned after the
// client's end-of-candidates message, so the caller can go on using it (e.g. write a final
// result frame); on failure sig is reset. The whole set-up is bounded by ConnectTimeout;
// errors wrap ErrSetupTimeout / ErrSignaling like OpenStream's.
//
// The set-up counts against MaxIncomingSetups with those signalled over SignalID, and
// against via's share of them (maxRelayedPerRelay): beyond either AcceptRelayed fails at
// once with ErrSignaling and ErrBusy. Without Config.Accept it fails at once with
// ErrSignaling and ErrNotAccepting. It fails with ErrClosed once the Transport is closed,
// and with ctx's error (wrapped) when ctx ends first.
//
// release lets a stream that was closed or reset finish first: it waits until the client
// has closed its side too (at most drainTimeout), so that the bytes written before Close
// reach the client. On a stream still open it closes the PeerConnection at once (the
// stream fails with ErrReset). Further streams the client opens on the PeerConnection are
// reset. Close closes it too.
func (t *Transport) AcceptRelayed(ctx context.Context, via peer.ID, sig SignalStream) (s Stream, release func(), err error) {
	if err := t.admitRelayed(via); err != nil {
		sig.Reset()
		if errors.Is(err, ErrBusy) || errors.Is(err, ErrNotAccepting) {
			return nil, nil, fmt.Errorf("%s: %w: %w", relayWhat, ErrSignaling, err)
		}
		return nil, nil, err
	}
	defer t.wg.Done()
	defer t.unadmitRelayed(via)

	deadline := time.Now().Add(t.cfg.ConnectTimeout)
	sctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stopOnClose := context.AfterFunc(t.ctx, cancel)
	defer stopOnClose()
	// Unblocks the reader when the set-up ends early (ctx, Close); stopped before sig is
	// handed back.
	stopReset := context.AfterFunc(sctx, func() { sig.Reset() })
	defer stopReset()

	c, st, offered, err := t.acceptRelayed(sctx, sig, deadline)
	if err == nil && !stopReset() {
		// The set-up ended (ctx, Close, deadline) as it succeeded: sig is being reset.
		err = fmt.Errorf("%w: set-up ended as it succeeded", ErrSignaling)
	}
	if err != nil {
		if c != nil {
			c.close(err)
		}
		sig.Reset()
		if offered && t.ctx.Err() == nil {
			t.setupFailures.Add(1)
		}
		return nil, nil, t.setupErr(ctx, deadline, relayWhat, err)
	}
	t.relayedAccepted.Add(1)
	return st, sync.OnceFunc(func() { c.closeAfter(st, errReleased) }), nil
}

// acceptRelayed runs AcceptRelayed's exchange on sig. offered reports whether a valid
// offer was read (the set-up counts as failed only after one); c is non-nil once made.
func (t *Transport) acceptRelayed(ctx context.Context, sig SignalStream, deadline time.Time) (c *peerConn, s *stream, offered bool, err error) {
	if err := sig.SetDeadline(deadline); err != nil {
		return nil, nil, false, fmt.Errorf("%w: %w", ErrSignaling, err)
	}
	r := newSignalReader(sig, true)
	offer, err := readOffer(r)
	if err != nil {
		return nil, nil, false, fmt.Errorf("%w: %w", ErrSignaling, err)
	}
	c, err = t.newRelayedConn(true)
	if err != nil {
		return nil, nil, true, err
	}
	if err := t.answer(ctx, c, sig, r, offer, true); err != nil {
		return c, nil, true, err
	}
	// relayReady is closed: the stream is there.
	return c, <-c.relayFirst, true, nil
}

// admitRelayed reserves a slot for a set-up relayed by via and counts it in wg.
func (t *Transport) admitRelayed(via peer.ID) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return ErrClosed
	case !t.cfg.Accept:
		return ErrNotAccepting
	case len(t.incoming)+t.relaySetups >= MaxIncomingSetups || t.relaying[via] >= maxRelayedPerRelay:
		return ErrBusy
	}
	t.relaySetups++
	t.relaying[via]++
	t.wg.Add(1)
	return nil
}

func (t *Transport) unadmitRelayed(via peer.ID) {
	t.mu.Lock()
	t.relaySetups--
	if t.relaying[via]--; t.relaying[via] == 0 {
		delete(t.relaying, via)
	}
	t.mu.Unlock()
}

// newRelayedConn makes a relayed PeerConnection (no peer ID, not in the pool) and
// registers it in t.relayed, where Close finds it; relayIn as for newPeerConn.
func (t *Transport) newRelayedConn(relayIn bool) (*peerConn, error) {
	c, err := t.newPeerConn("", relayIn)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	closed := t.closed
	if !closed {
		t.relayed[c] = struct{}{}
	}
	t.mu.Unlock()
	if closed {
		c.close(ErrClosed)
		return nil, ErrClosed
	}
	return c, nil
}

// DialRelayed sets up a PeerConnection as the offerer over sig (trickle ICE: the offer goes
// out at once) and returns a Stream on its data channel once it is open. Symmetric to
// AcceptRelayed: on success sig is left open with no deadline after the remote's end message;
// release closes the PeerConnection and waits for its goroutines (idempotent).
//
// On failure sig is reset; errors wrap ErrSetupTimeout or ErrSignaling, or ctx's error
// when ctx ends first. release lets a stream that was closed or reset finish first, as
// AcceptRelayed's does: it waits until the remote has closed its side too (at most
// drainTimeout). Streams the remote opens on the PeerConnection are reset.
func DialRelayed(ctx context.Context, sig SignalStream, cfg RelayConfig) (s Stream, release func(), err error) {
	// A Transport of its own, with no host, owns the PeerConnection and its goroutines;
	// its Close is release's last step.
	t, err := assemble(nil, Config{ICEServers: cfg.ICEServers, ConnectTimeout: cfg.ConnectTimeout, SettingEngine: cfg.SettingEngine})
	if err != nil {
		sig.Reset()
		return nil, nil, fmt.Errorf("%s: %w", relayWhat, err)
	}
	deadline := time.Now().Add(t.cfg.ConnectTimeout)
	sctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stopReset := context.AfterFunc(sctx, func() { sig.Reset() })
	defer stopReset()

	st, err := t.dialRelayed(sctx, sig, deadline)
	if err == nil && !stopReset() {
		err = fmt.Errorf("%w: set-up ended as it succeeded", ErrSignaling)
	}
	if err != nil {
		err = t.setupErr(ctx, deadline, relayWhat, err) // before Close, which would read as ErrClosed
		sig.Reset()
		t.Close()
		return nil, nil, err
	}
	return st, sync.OnceFunc(func() {
		st.c.closeAfter(st, errReleased)
		t.Close()
	}), nil
}

// dialRelayed runs DialRelayed's exchange on sig.
func (t *Transport) dialRelayed(ctx context.Context, sig SignalStream, deadline time.Time) (*stream, error) {
	if err := sig.SetDeadline(deadline); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSignaling, err)
	}
	c, err := t.newRelayedConn(false)
	if err != nil {
		return nil, err
	}
	s, err := t.offer(ctx, c, sig, true)
	if err != nil {
		c.close(err)
		return nil, err
	}
	return s, nil
}
