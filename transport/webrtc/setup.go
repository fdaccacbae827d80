package webrtc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/webrtc/v4"

	"github.com/meshinfer/meshinfer/transport/frame"
)

// dial sets up a PeerConnection to p as the offerer and returns it with its first stream,
// whose data channel's opening marks the set-up done (ICE, DTLS and SCTP up).
func (t *Transport) dial(ctx context.Context, p peer.ID) (*peerConn, *stream, error) {
	deadline := time.Now().Add(t.cfg.ConnectTimeout)
	sctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	stopOnClose := context.AfterFunc(t.ctx, cancel)
	defer stopOnClose()

	// Signaling may cross a relayed (limited) connection: a few KiB, after which the media
	// path is direct. That is how two NATed peers with STUN servers meet.
	st, err := t.h.NewStream(network.WithAllowLimitedConn(sctx, "webrtc signaling"), p, SignalID)
	if err != nil {
		return nil, nil, t.setupErr(ctx, deadline, p, fmt.Errorf("%w: open signaling stream: %w", ErrSignaling, err))
	}
	stopReset := context.AfterFunc(sctx, func() { st.Reset() })
	defer stopReset()
	if err := st.SetDeadline(deadline); err != nil {
		st.Reset()
		return nil, nil, fmt.Errorf("%w: %w", ErrSignaling, err)
	}
	c, err := t.newPeerConn(p)
	if err != nil {
		st.Reset()
		return nil, nil, err
	}
	s, err := t.offer(sctx, c, st)
	if err != nil {
		c.close(err)
		return nil, nil, t.setupErr(ctx, deadline, p, err)
	}
	return c, s, nil
}

// offer runs the offerer's side of the exchange on st.
func (t *Transport) offer(ctx context.Context, c *peerConn, st network.Stream) (*stream, error) {
	// The first stream's channel, made before the offer so that the offer carries the
	// data channel (SCTP) section.
	dc, err := c.pc.CreateDataChannel("", nil)
	if err != nil {
		st.Reset()
		return nil, fmt.Errorf("create data channel: %w", err)
	}
	opened := make(chan struct{})
	dc.OnOpen(func() { close(opened) })

	n := newNegotiation(c.pc, st, frame.NewReader(st, maxSignalFrame), true)
	offer, err := c.pc.CreateOffer(nil)
	if err == nil {
		err = c.pc.SetLocalDescription(offer)
	}
	if err == nil {
		if err = frame.Write(st, encodeSignal(sigOffer, offer.SDP)); err != nil {
			err = fmt.Errorf("%w: send offer: %w", ErrSignaling, err)
		}
	}
	if err == nil {
		err = n.run(ctx, opened, c.failed)
	}
	n.finish(err == nil)
	if err != nil {
		return nil, err
	}
	return c.attach(dc)
}

// setupErr classifies a failed outgoing set-up: the caller's context, Close, the set-up
// deadline (which may reach the stream before the context), or err itself.
func (t *Transport) setupErr(ctx context.Context, deadline time.Time, p peer.ID, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("webrtc set-up with %s: %w", p, ctx.Err())
	case t.ctx.Err() != nil:
		return ErrClosed
	case !time.Now().Before(deadline):
		return fmt.Errorf("webrtc set-up with %s: %w (%v)", p, ErrSetupTimeout, t.cfg.ConnectTimeout)
	}
	return fmt.Errorf("webrtc set-up with %s: %w", p, err)
}

// handleSignal answers a set-up a peer offers.
func (t *Transport) handleSignal(st network.Stream) {
	from := st.Conn().RemotePeer()
	if !t.admit(from) {
		st.Reset()
		return
	}
	defer t.wg.Done()
	defer t.unadmit(from)

	// Deadline first: the whole set-up must finish within ConnectTimeout.
	deadline := time.Now().Add(t.cfg.ConnectTimeout)
	if err := st.SetDeadline(deadline); err != nil {
		st.Reset()
		return
	}
	ctx, cancel := context.WithDeadline(t.ctx, deadline)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()

	r := frame.NewReader(st, maxSignalFrame)
	offer, err := readOffer(r)
	if err != nil {
		log.Debugw("bad webrtc offer", "peer", from, "err", err)
		st.Reset()
		return
	}
	c, err := t.newPeerConn(from)
	if err != nil {
		log.Warnw("answer webrtc set-up", "peer", from, "err", err)
		st.Reset()
		return
	}
	if err := t.answer(ctx, c, st, r, offer); err != nil {
		c.close(err)
		if t.ctx.Err() == nil {
			t.setupFailures.Add(1)
			log.Debugw("answer webrtc set-up", "peer", from, "err", err)
		}
		return
	}
	t.mu.Lock()
	ok := t.addLocked(c)
	t.mu.Unlock()
	if !ok {
		c.close(ErrClosed)
		return
	}
	t.accepted.Add(1)
}

// admit reserves a slot for an incoming set-up from p and counts it in wg.
func (t *Transport) admit(p peer.ID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, busy := t.incoming[p]; busy || t.closed || len(t.incoming) >= MaxIncomingSetups {
		return false
	}
	t.incoming[p] = struct{}{}
	t.wg.Add(1)
	return true
}

func (t *Transport) unadmit(p peer.ID) {
	t.mu.Lock()
	delete(t.incoming, p)
	t.mu.Unlock()
}

// readOffer reads and checks the first message of an incoming exchange, before any
// PeerConnection is made for it.
func readOffer(r *frame.Reader) (webrtc.SessionDescription, error) {
	body, err := r.Next()
	if err != nil {
		return webrtc.SessionDescription{}, err
	}
	m, err := decodeSignal(body)
	if err != nil {
		return webrtc.SessionDescription{}, err
	}
	if m.typ != sigOffer {
		return webrtc.SessionDescription{}, fmt.Errorf("%w: first message of type %#x, want an offer", errSignalMessage, m.typ)
	}
	desc := webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: m.text}
	if _, err := desc.Unmarshal(); err != nil {
		return webrtc.SessionDescription{}, fmt.Errorf("%w: offer: %w", errSignalMessage, err)
	}
	return desc, nil
}

// answer runs the answerer's side of the exchange on st, the offer already read from r.
func (t *Transport) answer(ctx context.Context, c *peerConn, st network.Stream, r *frame.Reader, offer webrtc.SessionDescription) error {
	n := newNegotiation(c.pc, st, r, false)
	err := c.pc.SetRemoteDescription(offer)
	if err != nil {
		err = fmt.Errorf("%w: offer: %w", ErrSignaling, err)
	}
	var answer webrtc.SessionDescription
	if err == nil {
		answer, err = c.pc.CreateAnswer(nil)
	}
	if err == nil {
		err = c.pc.SetLocalDescription(answer)
	}
	if err == nil {
		if err = frame.Write(st, encodeSignal(sigAnswer, answer.SDP)); err != nil {
			err = fmt.Errorf("%w: send answer: %w", ErrSignaling, err)
		}
	}
	if err == nil {
		err = n.run(ctx, c.connected, c.failed)
	}
	n.finish(err == nil)
	return err
}

// negotiation trickles candidates both ways on a signaling stream once the descriptions
// are under way.
type negotiation struct {
	pc      *webrtc.PeerConnection
	st      network.Stream
	offerer bool

	cands      chan *webrtc.ICECandidate // gathered by pion; nil ends them
	in         chan inbound              // from the reader; closed at a clean end of stream
	stop       chan struct{}             // closed by finish: the reader stops
	readerDone chan struct{}

	sent, got                           int  // candidates
	sentEnd, gotEnd, gotAnswer, writeOK bool // writeOK false once a write failed
}

// inbound is a message, or the error that ended reading.
type inbound struct {
	m   sigMsg
	err error
}

// newNegotiation starts collecting local candidates (before the local description is
// set) and reading remote messages from r.
func newNegotiation(pc *webrtc.PeerConnection, st network.Stream, r *frame.Reader, offerer bool) *negotiation {
	n := &negotiation{
		pc: pc, st: st, offerer: offerer, writeOK: true,
		cands: make(chan *webrtc.ICECandidate, MaxCandidates+1),
		in:    make(chan inbound), stop: make(chan struct{}), readerDone: make(chan struct{}),
	}
	var gathered atomic.Int32
	pc.OnICECandidate(func(c *webrtc.ICECandidate) {
		// The channel holds MaxCandidates and the end; later ones are dropped.
		if c != nil && gathered.Add(1) > MaxCandidates {
			return
		}
		select {
		case n.cands <- c:
		default:
		}
	})
	go n.read(r) // ends at the end of the stream, on an error, or when finish stops it
	return n
}

func (n *negotiation) read(r *frame.Reader) {
	defer close(n.readerDone)
	for {
		body, err := r.Next()
		if errors.Is(err, io.EOF) {
			close(n.in)
			return
		}
		var in inbound
		if err != nil {
			in.err = err
		} else {
			in.m, in.err = decodeSignal(body)
		}
		select {
		case n.in <- in:
		case <-n.stop:
			return
		}
		if in.err != nil {
			return
		}
	}
}

// run sends local candidates and applies remote messages until ready (the PeerConnection
// is usable), failed, or ctx ends.
func (n *negotiation) run(ctx context.Context, ready, failed <-chan struct{}) error {
	for {
		select {
		case <-ready:
			return nil
		case <-failed:
			return fmt.Errorf("%w: ice or dtls failed", ErrSetupTimeout)
		case <-ctx.Done():
			return ctx.Err()
		case c := <-n.cands:
			n.send(c)
		case in, ok := <-n.in:
			if !ok {
				// The remote closed the stream: it is connected, or gives up and will reset.
				n.in = nil
				if n.offerer && !n.gotAnswer {
					return fmt.Errorf("%w: stream ended before the answer", ErrSignaling)
				}
				continue
			}
			err := in.err
			if err == nil {
				err = n.apply(in.m)
			}
			if err != nil {
				select {
				case <-ready:
					return nil
				default:
				}
				return fmt.Errorf("%w: %w", ErrSignaling, err)
			}
		}
	}
}

// send sends a local candidate, or end for nil. A failed write stops sending: the remote
// has closed the stream (it is connected) or the set-up fails by its deadline.
func (n *negotiation) send(c *webrtc.ICECandidate) {
	if !n.writeOK || n.sentEnd {
		return
	}
	var body []byte
	if c == nil {
		n.sentEnd = true
		body = encodeSignal(sigEnd, "")
	} else {
		line := c.ToJSON().Candidate
		if line == "" || len(line) > MaxCandidate || n.sent >= MaxCandidates {
			return
		}
		n.sent++
		body = encodeSignal(sigCandidate, line)
	}
	if err := frame.Write(n.st, body); err != nil {
		n.writeOK = false
	}
}

// apply applies a remote message, checking the order of the exchange.
func (n *negotiation) apply(m sigMsg) error {
	described := !n.offerer || n.gotAnswer // the answerer read the offer before starting
	switch {
	case m.typ == sigAnswer && n.offerer && !n.gotAnswer:
		n.gotAnswer = true
		if err := n.pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: m.text}); err != nil {
			return fmt.Errorf("answer: %w", err)
		}
		return nil
	case m.typ == sigCandidate && described && !n.gotEnd:
		if n.got++; n.got > MaxCandidates {
			return fmt.Errorf("%w: over %d candidates", errSignalMessage, MaxCandidates)
		}
		// A candidate pion cannot use (an mDNS name, a family we do not gather) is
		// skipped, not fatal: the others may do.
		if err := n.pc.AddICECandidate(webrtc.ICECandidateInit{Candidate: m.text}); err != nil {
			log.Debugw("skipped remote candidate", "err", err)
		}
		return nil
	case m.typ == sigEnd && described && !n.gotEnd:
		n.gotEnd = true
		return nil
	}
	return fmt.Errorf("%w: unexpected message of type %#x", errSignalMessage, m.typ)
}

// finish ends the exchange: a graceful close of the stream when the set-up succeeded, a
// reset when it failed. It returns once the reader has stopped.
func (n *negotiation) finish(ok bool) {
	close(n.stop)
	if ok {
		n.st.SetReadDeadline(time.Now()) // unblocks the reader
		<-n.readerDone
		n.st.Close()
		return
	}
	n.st.Reset()
	<-n.readerDone
}
