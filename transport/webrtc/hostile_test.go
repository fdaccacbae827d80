package webrtc

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-varint"

	"github.com/meshinfer/meshinfer/internal/frame"
)

// Tests of what a hostile peer can make a node do with WebRTC signaling (issue 19): set up
// without the node's consent, take every set-up slot.

// readGate is a SignalStream that reports its first Read: the set-up holding it has been
// admitted and reads the offer.
type readGate struct {
	SignalStream
	once    sync.Once
	reading chan struct{}
}

func gate(st SignalStream) *readGate {
	return &readGate{SignalStream: st, reading: make(chan struct{})}
}

func (g *readGate) Read(p []byte) (int, error) {
	g.once.Do(func() { close(g.reading) })
	return g.SignalStream.Read(p)
}

// A node without Accept answers no set-up: a peer's OpenStream fails at once with
// ErrSignaling (the protocol is not supported) and AcceptRelayed with ErrNotAccepting. It
// still sets up paths of its own.
func TestNotAccepting(t *testing.T) {
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	b := newTransport(t, hb, *loopbackEngine()) // Accept off
	b.SetStreamHandler(echo)
	a := newTransport(t, ha, accepting())
	a.SetStreamHandler(echo)
	if _, _, err := a.OpenStream(context.Background(), hb.ID()); !errors.Is(err, ErrSignaling) {
		t.Fatalf("set-up to a node not accepting: %v, want ErrSignaling", err)
	}
	for _, proto := range hb.Mux().Protocols() {
		if proto == SignalID {
			t.Fatalf("%s registered on a node not accepting", SignalID)
		}
	}
	client, server := relayPipe(t, ha, hb)
	client.Write(frame.Append(nil, encodeSignal(sigOffer, testOffer(t))))
	if _, _, err := b.AcceptRelayed(context.Background(), ha.ID(), recv(t, server)); !errors.Is(err, ErrNotAccepting) || !errors.Is(err, ErrSignaling) {
		t.Fatalf("relayed set-up on a node not accepting: %v, want ErrNotAccepting", err)
	}
	if st := b.Stats(); st.Accepted != 0 || st.Relayed != 0 || st.Open != 0 {
		t.Fatalf("stats %+v, want nothing accepted", st)
	}

	s, warm, err := b.OpenStream(context.Background(), ha.ID())
	if err != nil || warm {
		t.Fatalf("b's set-up to a: warm %v, %v", warm, err)
	}
	if got := roundTrip(t, s, []byte("there")); string(got) != "there" {
		t.Fatalf("echo %q", got)
	}
	s.Close()
}

// A peer that opens MaxIncomingSetups signaling streams at once, each with a valid offer
// it then lets stall, holds one set-up slot: its other streams are reset at once, and a
// second peer still sets up a path while the first holds its slot.
func TestSetupFloodFromOnePeer(t *testing.T) {
	hf, hb, hc := newHost(t), newHost(t), newHost(t)
	connect(t, hf, hb)
	connect(t, hc, hb)
	cfg := accepting()
	cfg.ConnectTimeout = time.Minute // the flooder's held set-up outlasts the test
	b := newTransport(t, hb, cfg)
	b.SetStreamHandler(echo)
	offer := frame.Append(nil, encodeSignal(sigOffer, testOffer(t)))
	flood := func() (answered, reset int) {
		streams := make([]network.Stream, MaxIncomingSetups)
		for i := range streams {
			st, err := hf.NewStream(context.Background(), hb.ID(), SignalID)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Reset() })
			st.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := st.Write(offer); err != nil {
				t.Fatal(err)
			}
			streams[i] = st
		}
		for _, st := range streams {
			// An admitted set-up answers; a refused one is reset before reading the offer.
			body, err := frame.NewReader(st, maxSignalFrame).Next()
			switch {
			case err == nil && body[0] == sigAnswer:
				answered++
			case err != nil && !isTimeout(err) && !errors.Is(err, io.EOF):
				reset++
			default:
				t.Fatalf("flood stream: %q, %v", body, err)
			}
		}
		return answered, reset
	}
	if answered, reset := flood(); answered != 1 || reset != MaxIncomingSetups-1 {
		t.Fatalf("flood of %d set-ups from one peer: %d answered, %d reset; want 1 and the rest reset", MaxIncomingSetups, answered, reset)
	}
	c := newTransport(t, hc, *loopbackEngine())
	s, _, err := c.OpenStream(context.Background(), hb.ID())
	if err != nil {
		t.Fatal("second peer's set-up during the flood:", err)
	}
	if got := roundTrip(t, s, []byte("still here")); string(got) != "still here" {
		t.Fatalf("echo %q", got)
	}
	s.Close()
}

// One relaying peer holds at most maxRelayedPerRelay relayed set-ups: with that many of
// its own stalled, one more from it fails at once with ErrBusy, while a set-up relayed by
// another peer, and one over SignalID, still succeed.
func TestRelayedShareOfOneRelay(t *testing.T) {
	ha, hb, hc := newHost(t), newHost(t), newHost(t)
	connect(t, ha, hb)
	connect(t, hc, hb)
	cfg := accepting()
	cfg.ConnectTimeout = time.Minute // the stalled set-ups outlast the test
	p := newTransport(t, hb, cfg)
	p.SetStreamHandler(echo)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const flooder = peer.ID("flooding coordinator")
	stalled := make(chan error, maxRelayedPerRelay)
	for range maxRelayedPerRelay {
		sig := stalledRelay(t, ha, hb)
		go func() { // ends when cancel resets sig
			_, _, err := p.AcceptRelayed(ctx, flooder, sig)
			stalled <- err
		}()
		recv(t, sig.reading)
	}
	client, server := relayPipe(t, ha, hb)
	client.Write(frame.Append(nil, encodeSignal(sigOffer, testOffer(t))))
	if _, _, err := p.AcceptRelayed(ctx, flooder, recv(t, server)); !errors.Is(err, ErrBusy) || !errors.Is(err, ErrSignaling) {
		t.Fatalf("accept over the relay's share: %v, want ErrBusy", err)
	}

	r := newRelayedPair(t, p, ha, hb) // relayed by ha
	if _, err := r.cs.Write([]byte("relayed")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len("relayed"))
	if _, err := io.ReadFull(r.ps, buf); err != nil || string(buf) != "relayed" {
		t.Fatalf("relayed stream read %q, %v", buf, err)
	}
	c := newTransport(t, hc, *loopbackEngine())
	s, _, err := c.OpenStream(context.Background(), hb.ID())
	if err != nil {
		t.Fatal("set-up over SignalID while a relay floods:", err)
	}
	if got := roundTrip(t, s, []byte("direct")); string(got) != "direct" {
		t.Fatalf("echo %q", got)
	}
	s.Close()
	cancel()
	for range maxRelayedPerRelay {
		if err := recv(t, stalled); !errors.Is(err, context.Canceled) {
			t.Fatalf("stalled accept: %v, want context.Canceled", err)
		}
	}
}

// stalledRelay returns the server end of a relay pipe whose client sent half a frame,
// gated to report when a set-up reads it.
func stalledRelay(t *testing.T, ha, hb host.Host) *readGate {
	t.Helper()
	client, server := relayPipe(t, ha, hb)
	if _, err := client.Write(varint.ToUvarint(100)); err != nil { // half a frame
		t.Fatal(err)
	}
	return gate(recv(t, server))
}
