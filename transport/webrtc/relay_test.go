package webrtc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/multiformats/go-varint"
	"github.com/pion/webrtc/v4"
	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/internal/frame"
)

// relayTestID is the protocol of relayPipe's stream.
const relayTestID = protocol.ID("/meshinfer/test/relay/1.0.0")

// relayPipe joins two SignalStreams back to back: the ends of a libp2p stream from ha to
// hb, standing in for the client's WebSocket to the coordinator and the coordinator's
// stream to P, with real deadlines and resets. The server end arrives on the channel once
// the client has written (libp2p may negotiate the protocol with the first write).
func relayPipe(t testing.TB, ha, hb host.Host) (client network.Stream, server <-chan network.Stream) {
	t.Helper()
	srv := make(chan network.Stream, 1)
	hb.SetStreamHandler(relayTestID, func(st network.Stream) {
		t.Cleanup(func() { st.Reset() })
		srv <- st
	})
	st, err := ha.NewStream(context.Background(), hb.ID(), relayTestID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Reset() })
	return st, srv
}

// recv returns the next value of ch, failing the test after 10 s without one.
func recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting on a channel")
	}
	var zero T
	return zero
}

type dialResult struct {
	s       Stream
	release func()
	err     error
	dur     time.Duration
}

// dialAsync runs DialRelayed on its own goroutine, which ends when DialRelayed returns
// (within cfg's ConnectTimeout); the test receives its result.
func dialAsync(sig SignalStream, cfg RelayConfig) <-chan dialResult {
	out := make(chan dialResult, 1)
	go func() {
		start := time.Now()
		s, release, err := DialRelayed(context.Background(), sig, cfg)
		out <- dialResult{s, release, err, time.Since(start)}
	}()
	return out
}

func loopbackRelayConfig() RelayConfig {
	return RelayConfig{SettingEngine: loopbackEngine().SettingEngine}
}

// relayedPair is a relayed set-up's two streams, their releases and the signaling ends.
type relayedPair struct {
	cs, ps         Stream // the client's, P's
	crel, prel     func()
	client, server network.Stream
}

// newRelayedPair sets up a stream from a client on ha (DialRelayed, no Transport) to p
// (AcceptRelayed) with signaling relayed over a stream between ha and hb. Then each side
// writes one more frame on its signaling stream and the other reads it: P's frame goes
// out as soon as AcceptRelayed returns, possibly before the client has read P's end, so
// it shows that DialRelayed read nothing past the end.
func newRelayedPair(t testing.TB, p *Transport, ha, hb host.Host) relayedPair {
	t.Helper()
	client, server := relayPipe(t, ha, hb)
	dialed := dialAsync(client, loopbackRelayConfig())
	r := relayedPair{client: client, server: recv(t, server)}
	var err error
	r.ps, r.prel, err = p.AcceptRelayed(context.Background(), ha.ID(), r.server)
	if err != nil {
		t.Fatal("accept:", err)
	}
	t.Cleanup(r.prel)
	if err := frame.Write(r.server, []byte("result from P")); err != nil {
		t.Fatal("write on sig after accept:", err)
	}
	d := recv(t, dialed)
	if d.err != nil {
		t.Fatal("dial:", d.err)
	}
	t.Cleanup(d.release)
	r.cs, r.crel = d.s, d.release

	if got, err := frame.NewReader(client, 64).Next(); err != nil || string(got) != "result from P" {
		t.Fatalf("client read on sig after dial: %q, %v", got, err)
	}
	if err := frame.Write(client, []byte("from the client")); err != nil {
		t.Fatal("write on sig after dial:", err)
	}
	if got, err := frame.NewReader(r.server, 64).Next(); err != nil || string(got) != "from the client" {
		t.Fatalf("P read on sig after accept: %q, %v", got, err)
	}
	return r
}

// A relayed set-up gives a stream like any other: 256 KiB echoed back identical (P closes
// and releases at once after echoing: release lets the tail reach the client). Both
// signaling ends stay usable and positioned after the ends. The relayed PeerConnection is
// counted apart from the pool and gone after release.
func TestRelayedEcho(t *testing.T) {
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	p := newTransport(t, hb, accepting())
	r := newRelayedPair(t, p, ha, hb)

	if st := p.Stats(); st.RelayedAccepted != 1 || st.Relayed != 1 || st.Open != 0 || st.Accepted != 0 || st.SetupFailures != 0 {
		t.Fatalf("stats %+v, want one relayed accept, outside the pool", st)
	}
	echoed := make(chan error, 1)
	go func() { // ends when the client's fin arrives or its stream fails
		_, err := io.Copy(r.ps, r.ps)
		r.ps.Close()
		r.prel()
		echoed <- err
	}()
	data := randomBytes(t, 256<<10)
	if got := roundTrip(t, r.cs, data); !bytes.Equal(got, data) {
		t.Fatalf("echo differs: %d bytes back of %d", len(got), len(data))
	}
	r.cs.Close()
	r.crel()
	if err := recv(t, echoed); err != nil {
		t.Fatal("echo:", err)
	}
	waitFor(t, "the relayed peer connection and its stream to go", func() bool {
		st := p.Stats()
		return st.Relayed == 0 && st.Streams == 0
	})
	r.crel() // idempotent
	r.prel()
}

// With ICE blocked on the client, DialRelayed fails with ErrSetupTimeout at
// ConnectTimeout, AcceptRelayed fails too, and nothing is left on either side.
func TestRelayedICEBlocked(t *testing.T) {
	// Registered first, so it runs after every other cleanup: hosts, Transport, streams.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	const timeout = time.Second
	cfg := accepting()
	cfg.ConnectTimeout = timeout
	p := newTransport(t, hb, cfg)
	blocked := DefaultSettingEngine()
	blocked.SetIPFilter(func(net.IP) bool { return false })

	client, server := relayPipe(t, ha, hb)
	dialed := dialAsync(client, RelayConfig{SettingEngine: blocked, ConnectTimeout: timeout})
	_, _, aerr := p.AcceptRelayed(context.Background(), ha.ID(), recv(t, server))
	d := recv(t, dialed)
	if !errors.Is(d.err, ErrSetupTimeout) {
		t.Fatalf("dial: %v, want ErrSetupTimeout", d.err)
	}
	if d.dur < timeout || d.dur > timeout+time.Second {
		t.Fatalf("dial failed after %v, want ConnectTimeout (%v)", d.dur, timeout)
	}
	if !errors.Is(aerr, ErrSetupTimeout) && !errors.Is(aerr, ErrSignaling) {
		t.Fatalf("accept: %v, want a set-up failure", aerr)
	}
	if st := p.Stats(); st.Relayed != 0 || st.RelayedAccepted != 0 || st.SetupFailures != 1 || st.Streams != 0 {
		t.Fatalf("stats %+v, want one failure and nothing kept", st)
	}
}

// A relayed offer that breaks the protocol resets the signaling stream and leaves no
// PeerConnection; one that fails after a valid offer counts as a failed set-up.
func TestRelayedViolationsReset(t *testing.T) {
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	p := newTransport(t, hb, accepting())
	garbage := frame.Append(nil, encodeSignal(0x09, "hello"))
	for _, tc := range []struct {
		name    string
		send    []byte
		failure bool // counted in SetupFailures
	}{
		{"garbage type", garbage, false},
		{"oversized frame", append(varint.ToUvarint(1<<20), make([]byte, 64)...), false},
		{"answer instead of an offer", frame.Append(nil, encodeSignal(sigAnswer, "v=0")), false},
		{"offer that is not SDP", frame.Append(nil, encodeSignal(sigOffer, "not an sdp")), false},
		{"garbage after the offer", append(frame.Append(nil, encodeSignal(sigOffer, testOffer(t))), garbage...), true},
		{"end before the offer", frame.Append(nil, encodeSignal(sigEnd, "")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := p.Stats().SetupFailures
			client, server := relayPipe(t, ha, hb)
			client.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := client.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			_, _, err := p.AcceptRelayed(context.Background(), ha.ID(), recv(t, server))
			if !errors.Is(err, ErrSignaling) {
				t.Fatalf("accept: %v, want ErrSignaling", err)
			}
			if _, err := io.ReadAll(client); err == nil || errors.Is(err, io.EOF) || isTimeout(err) {
				t.Fatalf("client read: %v, want the stream reset", err)
			}
			st := p.Stats()
			if st.Relayed != 0 || st.RelayedAccepted != 0 || st.Open != 0 {
				t.Fatalf("stats %+v, want no peer connection", st)
			}
			if got := st.SetupFailures - before; got != 0 && !tc.failure || got != 1 && tc.failure {
				t.Fatalf("%d set-up failures counted, want failure %v", got, tc.failure)
			}
		})
	}
}

// testOffer returns the SDP of a real offer with a data channel.
func testOffer(t testing.TB) string {
	t.Helper()
	api := webrtc.NewAPI(webrtc.WithSettingEngine(*loopbackEngine().SettingEngine))
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, err := pc.CreateDataChannel("", nil); err != nil {
		t.Fatal(err)
	}
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	return offer.SDP
}

// Close with a relayed stream open returns promptly; the stream fails on both sides, and
// AcceptRelayed fails after it.
func TestCloseWithRelayedStream(t *testing.T) {
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	p := newTransport(t, hb, accepting())
	r := newRelayedPair(t, p, ha, hb)
	if _, err := r.cs.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(r.ps, buf); err != nil {
		t.Fatal(err)
	}
	readErr := make(chan error, 1)
	go func() { // ends when Close breaks the stream
		_, err := r.ps.Read(buf)
		readErr <- err
	}()

	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if err := recv(t, readErr); !errors.Is(err, ErrReset) {
		t.Fatalf("P's read: %v, want ErrReset", err)
	}
	if _, err := r.ps.Write([]byte("x")); !errors.Is(err, ErrReset) {
		t.Fatalf("P's write after Close: %v, want ErrReset", err)
	}
	r.cs.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.cs.Read(buf); !errors.Is(err, ErrReset) {
		t.Fatalf("client's read: %v, want ErrReset", err)
	}
	if st := p.Stats(); st.Relayed != 0 || st.Streams != 0 {
		t.Fatalf("stats %+v after Close, want nothing", st)
	}
	r.prel() // after Close: returns at once

	client, server := relayPipe(t, ha, hb)
	client.Write(frame.Append(nil, encodeSignal(sigOffer, "v=0")))
	if _, _, err := p.AcceptRelayed(context.Background(), ha.ID(), recv(t, server)); !errors.Is(err, ErrClosed) {
		t.Fatalf("accept after Close: %v, want ErrClosed", err)
	}
}

// signalReader reads exactly one frame per Next, leaving the next byte unread, and
// refuses what frame.Reader refuses.
func TestSignalReader(t *testing.T) {
	in := append(frame.Append(nil, []byte("first")), frame.Append(nil, []byte("second"))...)
	br := bytes.NewReader(in)
	sr := newSignalReader(br, true)
	got, err := sr.Next()
	if err != nil || string(got) != "first" {
		t.Fatalf("first frame: %q, %v", got, err)
	}
	if rest := in[len(in)-br.Len():]; !bytes.Equal(rest, frame.Append(nil, []byte("second"))) {
		t.Fatalf("left %q unread, want exactly the second frame", rest)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"clean end", nil, io.EOF},
		{"over the maximum", frame.Append(nil, make([]byte, maxSignalFrame+1)), frame.ErrTooLarge},
		{"non-minimal varint", []byte{0x81, 0x00}, frame.ErrMalformed},
		{"truncated body", []byte{0x05, 'a'}, io.ErrUnexpectedEOF},
		{"truncated length", []byte{0x80}, io.ErrUnexpectedEOF},
	} {
		if _, err := newSignalReader(bytes.NewReader(tc.in), true).Next(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// signalReader reads what frame.Reader reads: the same frames, then the same kind of
// error.
func FuzzSignalReader(f *testing.F) {
	f.Add(frame.Append(frame.Append(nil, []byte("a")), nil))
	f.Add([]byte{0x81, 0x00})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add(frame.Append(nil, make([]byte, maxSignalFrame+1)))
	f.Fuzz(func(t *testing.T, in []byte) {
		want := frame.NewReader(bytes.NewReader(in), maxSignalFrame)
		got := newSignalReader(bytes.NewReader(in), true)
		for {
			wb, werr := want.Next()
			gb, gerr := got.Next()
			if !bytes.Equal(wb, gb) {
				t.Fatalf("frame %q, frame.Reader read %q", gb, wb)
			}
			if (werr == nil) != (gerr == nil) {
				t.Fatalf("err %v, frame.Reader's %v", gerr, werr)
			}
			if werr != nil {
				for _, e := range []error{io.EOF, io.ErrUnexpectedEOF, frame.ErrTooLarge, frame.ErrMalformed} {
					if errors.Is(werr, e) != errors.Is(gerr, e) {
						t.Fatalf("err %v, frame.Reader's %v", gerr, werr)
					}
				}
				return
			}
		}
	})
}

// Relayed set-ups share MaxIncomingSetups: with that many stalled inside their offer (by
// enough relaying peers, each at its share), one more, relayed by yet another peer, fails
// at once with ErrBusy; cancelling the caller's context ends the stalled ones with its
// error.
func TestRelayedBusyAndCancel(t *testing.T) {
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	cfg := accepting()
	cfg.ConnectTimeout = time.Minute // the stalled set-ups outlast the test
	p := newTransport(t, hb, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stalled := make(chan error, MaxIncomingSetups)
	for i := range MaxIncomingSetups {
		via := peer.ID(fmt.Sprint("relay ", i/maxRelayedPerRelay))
		sig := stalledRelay(t, ha, hb)
		go func() { // ends when cancel resets sig
			_, _, err := p.AcceptRelayed(ctx, via, sig)
			stalled <- err
		}()
		recv(t, sig.reading)
	}
	client, server := relayPipe(t, ha, hb)
	client.Write(frame.Append(nil, encodeSignal(sigOffer, testOffer(t))))
	if _, _, err := p.AcceptRelayed(ctx, "another relay", recv(t, server)); !errors.Is(err, ErrBusy) || !errors.Is(err, ErrSignaling) {
		t.Fatalf("accept over the limit: %v, want ErrBusy", err)
	}
	cancel()
	for range MaxIncomingSetups {
		if err := recv(t, stalled); !errors.Is(err, context.Canceled) {
			t.Fatalf("stalled accept: %v, want context.Canceled", err)
		}
	}
	if st := p.Stats(); st != (Stats{}) {
		t.Fatalf("stats %+v, want untouched", st)
	}
}
