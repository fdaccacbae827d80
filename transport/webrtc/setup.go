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

	"github.com/meshinfer/meshinfer/internal/frame"
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
	what := "webrtc set-up with " + p.String()
	st, err := t.h.NewStream(network.WithAllowLimitedConn(sctx, "webrtc signaling"), p, SignalID)
	if err != nil {
		return nil, nil, t.setupErr(ctx, deadline, what, fmt.Errorf("%w: open signaling stream: %w", ErrSignaling, err))
	}
	stopReset := context.AfterFunc(sctx, func() { st.Reset() })
	defer stopReset()
	if err := st.SetDeadline(deadline); err != nil {
		st.Reset()
		return nil, nil, fmt.Errorf("%w: %w", ErrSignaling, err)
	}
	c, err := t.newPeerConn(p, false)
	if err != nil {
		st.Reset()
		return nil, nil, err
	}
	s, err := t.offer(sctx, c, st, false)
	if err != nil {
		t.violated(p, err)
		c.close(err)
		return nil, nil, t.setupErr(ctx, deadline, what, err)
	}
	return c, s, nil
}

// offer runs the offerer's side of the exchange on st (relayed: see negotiation).
func (t *Transport) offer(ctx context.Context, c *peerConn, st SignalStream, relayed bool) (*stream, error) {
	// The first stream's channel, made before the offer so that the offer carries the
	// data channel (SCTP) section.
	dc, err := c.pc.CreateDataChannel("", nil)
	if err != nil {
		st.Reset()
		return nil, fmt.Errorf("create data channel: %w", err)
	}
	opened := make(chan struct{})
	dc.OnOpen(func() { close(opened) })

	n := newNegotiation(c.pc, st, newSignalReader(st, relayed), true, relayed)
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
	if err = n.finish(err); err != nil {
		return nil, err
	}
	return c.attach(dc, false)
}

// setupErr classifies a failed set-up (what names it in the error): the caller's context,
// Close, the set-up deadline (which may reach the stream before the context), or err
// itself.
func (t *Transport) setupErr(ctx context.Context, deadline time.Time, what string, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", what, ctx.Err())
	case t.ctx.Err() != nil:
		return ErrClosed
	case !time.Now().Before(deadline):
		return fmt.Errorf("%s: %w (%v)", what, ErrSetupTimeout, t.cfg.ConnectTimeout)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// handleSignal answers a set-up a peer offers.
func (t *Transport) handleSignal(st network.Stream) {
	from := st.Conn().RemotePeer()
	if t.admit(from) != nil {
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
		log.Debugw("bad webrtc offer", "peer", from, "err", fmt.Errorf("%w: %w", ErrSignaling, err))
		t.violated(from, err)
		st.Reset()
		return
	}
	c, err := t.newPeerConn(from, false)
	if err != nil {
		log.Warnw("answer webrtc set-up", "peer", from, "err", err)
		st.Reset()
		return
	}
	if err := t.answer(ctx, c, st, r, offer, false); err != nil {
		t.violated(from, err)
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

// admit reserves a slot for an incoming set-up from p and counts it in wg. It fails with
// ErrClosed, or ErrBusy when MaxIncomingSetups set-ups (relayed ones included) or one
// from p are under way: a peer's share of the slots is one.
func (t *Transport) admit(p peer.ID) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	if _, busy := t.incoming[p]; busy || len(t.incoming)+t.relaySetups >= MaxIncomingSetups {
		return ErrBusy
	}
	t.incoming[p] = struct{}{}
	t.wg.Add(1)
	return nil
}

func (t *Transport) unadmit(p peer.ID) {
	t.mu.Lock()
	delete(t.incoming, p)
	t.mu.Unlock()
}

// offerMsg is a checked offer: its SDP, less the candidates this node refuses, and how
// many candidate lines it had (they count against MaxCandidates).
type offerMsg struct {
	desc       webrtc.SessionDescription
	candidates int
}

// readOffer reads and checks the first message of an incoming exchange, before any
// PeerConnection is made for it.
func readOffer(r frameSource) (offerMsg, error) {
	body, err := r.Next()
	if err != nil {
		return offerMsg{}, err
	}
	m, err := decodeSignal(body)
	if err != nil {
		return offerMsg{}, err
	}
	if m.typ != sigOffer {
		return offerMsg{}, fmt.Errorf("%w: first message of type %#x, want an offer", errSignalMessage, m.typ)
	}
	sdp, n, err := sanitizeSDP(m.text, MaxCandidates)
	if err != nil {
		return offerMsg{}, fmt.Errorf("offer: %w", err)
	}
	desc := webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: sdp}
	if _, err := desc.Unmarshal(); err != nil {
		return offerMsg{}, fmt.Errorf("%w: offer: %w", errSignalMessage, err)
	}
	return offerMsg{desc: desc, candidates: n}, nil
}

// answer runs the answerer's side of the exchange on st, the offer already read from r.
// The set-up is done when ICE and DTLS connect; relayed, when the client's first data
// channel has arrived (see negotiation).
func (t *Transport) answer(ctx context.Context, c *peerConn, st SignalStream, r frameSource, offer offerMsg, relayed bool) error {
	n := newNegotiation(c.pc, st, r, false, relayed)
	n.got = offer.candidates
	ready := c.connected
	if relayed {
		ready = c.relayReady
	}
	err := c.pc.SetRemoteDescription(offer.desc)
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
		err = n.run(ctx, ready, c.failed)
	}
	return n.finish(err)
}

// negotiation trickles candidates both ways on a signaling stream once the descriptions
// are under way.
//
// A relayed negotiation (AcceptRelayed, DialRelayed) leaves the stream to its caller on
// success, so it must neither close it nor read past the remote's end: its reader reads
// frames without reading ahead (signalReader) and stops by itself after the end; the
// set-up succeeds only once the PeerConnection is ready, the remote's end has been read
// and the local end sent (at ready at the latest: later candidates serve no purpose).
// Since the remote does not close the stream either, its end of stream before its end
// message, or a failed write, is a failure.
type negotiation struct {
	pc      *webrtc.PeerConnection
	st      SignalStream
	offerer bool
	relayed bool

	cands      chan *webrtc.ICECandidate // gathered by pion; nil ends them
	in         chan inbound              // from the reader; closed at a clean end of stream
	stop       chan struct{}             // closed by finish: the reader stops
	readerDone chan struct{}

	sent, got                  int // candidates; got counts the remote's embedded ones too
	sentEnd, gotEnd, gotAnswer bool
	writeErr                   error // the first failed write: nothing more is sent
}

// inbound is a message, or the error that ended reading.
type inbound struct {
	m   sigMsg
	err error
}

// newNegotiation starts collecting local candidates (before the local description is
// set) and reading remote messages from r.
func newNegotiation(pc *webrtc.PeerConnection, st SignalStream, r frameSource, offerer, relayed bool) *negotiation {
	n := &negotiation{
		pc: pc, st: st, offerer: offerer, relayed: relayed,
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
	// Ends at the end of the stream, on an error, when finish stops it, or (relayed)
	// after the remote's end.
	go n.read(r)
	return n
}

func (n *negotiation) read(r frameSource) {
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
		if n.relayed && in.m.typ == sigEnd {
			return // what follows the end is the caller's
		}
	}
}

// run sends local candidates and applies remote messages until ready (the PeerConnection
// is usable; relayed, also the ends exchanged), failed, or ctx ends.
func (n *negotiation) run(ctx context.Context, ready, failed <-chan struct{}) error {
	isReady := false
	for {
		if isReady && (!n.relayed || n.gotEnd) {
			return nil
		}
		select {
		case <-ready:
			isReady, ready = true, nil
			if n.relayed {
				n.send(nil) // the remote waits for the end
			}
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
				switch {
				case n.relayed:
					return fmt.Errorf("%w: stream ended before the end of candidates", ErrSignaling)
				case n.offerer && !n.gotAnswer:
					return fmt.Errorf("%w: stream ended before the answer", ErrSignaling)
				}
				continue
			}
			err := in.err
			if err == nil {
				err = n.apply(in.m)
			}
			if err != nil {
				if !n.relayed {
					select {
					case <-ready:
						return nil
					default:
					}
				}
				return fmt.Errorf("%w: %w", ErrSignaling, err)
			}
		}
		if n.relayed && n.writeErr != nil {
			return fmt.Errorf("%w: %w", ErrSignaling, n.writeErr)
		}
	}
}

// send sends a local candidate, or end for nil. A failed write stops sending: the remote
// has closed the stream (it is connected) or the set-up fails by its deadline.
func (n *negotiation) send(c *webrtc.ICECandidate) {
	if n.writeErr != nil || n.sentEnd {
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
		n.writeErr = fmt.Errorf("send: %w", err)
	}
}

// apply applies a remote message, checking the order of the exchange.
func (n *negotiation) apply(m sigMsg) error {
	described := !n.offerer || n.gotAnswer // the answerer read the offer before starting
	switch {
	case m.typ == sigAnswer && n.offerer && !n.gotAnswer:
		n.gotAnswer = true
		sdp, embedded, err := sanitizeSDP(m.text, MaxCandidates-n.got)
		if err != nil {
			return fmt.Errorf("answer: %w", err)
		}
		n.got += embedded
		if err := n.pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: sdp}); err != nil {
			return fmt.Errorf("answer: %w", err)
		}
		return nil
	case m.typ == sigCandidate && described && !n.gotEnd:
		if n.got++; n.got > MaxCandidates {
			return fmt.Errorf("%w: over %d candidates", errSignalMessage, MaxCandidates)
		}
		// A candidate refused by the address rules (checkCandidate), or one pion cannot
		// use (a family we do not gather), is skipped, not fatal: the others may do.
		if err := checkCandidate(m.text); err != nil {
			log.Debugw("dropped a remote candidate", "err", err)
			return nil
		}
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

// finish ends the exchange whose outcome is err and returns it, or the error of ending it.
// On success it closes the stream gracefully, or, relayed, leaves it open with no
// deadline, positioned after the remote's end (the reader stopped there by itself). On
// failure it resets the stream. It returns once the reader has stopped.
func (n *negotiation) finish(err error) error {
	close(n.stop)
	switch {
	case err != nil:
		n.st.Reset()
		<-n.readerDone
		return err
	case n.relayed:
		<-n.readerDone
		if err := n.st.SetDeadline(time.Time{}); err != nil {
			n.st.Reset()
			return fmt.Errorf("%w: clear deadline: %w", ErrSignaling, err)
		}
		return nil
	}
	n.st.SetReadDeadline(time.Now()) // unblocks the reader
	<-n.readerDone
	n.st.Close()
	return nil
}
