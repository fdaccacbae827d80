package webrtc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/multiformats/go-varint"

	"github.com/meshinfer/meshinfer/internal/frame"
)

func TestDecodeSignal(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
		ok   bool
	}{
		{"offer", encodeSignal(sigOffer, "v=0"), true},
		{"answer at the bound", encodeSignal(sigAnswer, strings.Repeat("a", MaxSDP)), true},
		{"answer over the bound", encodeSignal(sigAnswer, strings.Repeat("a", MaxSDP+1)), false},
		{"candidate", encodeSignal(sigCandidate, "candidate:1 1 udp 2130706431 127.0.0.1 5000 typ host"), true},
		{"candidate over the bound", encodeSignal(sigCandidate, strings.Repeat("c", MaxCandidate+1)), false},
		{"end", encodeSignal(sigEnd, ""), true},
		{"end with a body", encodeSignal(sigEnd, "x"), false},
		{"empty offer", encodeSignal(sigOffer, ""), false},
		{"empty frame", nil, false},
		{"unknown type", encodeSignal(0x09, "x"), false},
		{"not UTF-8", encodeSignal(sigCandidate, "\xff\xfe"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := decodeSignal(tc.body)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok %v", err, tc.ok)
			}
			if err == nil && !bytes.Equal(encodeSignal(m.typ, m.text), tc.body) {
				t.Fatal("decode does not round-trip")
			}
		})
	}
}

func FuzzDecodeSignal(f *testing.F) {
	f.Add(encodeSignal(sigOffer, "v=0\r\n"))
	f.Add(encodeSignal(sigCandidate, "candidate:1 1 udp 1 127.0.0.1 1 typ host"))
	f.Add(encodeSignal(sigEnd, ""))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := decodeSignal(body)
		if err != nil {
			return
		}
		switch m.typ {
		case sigOffer, sigAnswer:
			if m.text == "" || len(m.text) > MaxSDP {
				t.Fatalf("description of %d bytes accepted", len(m.text))
			}
		case sigCandidate:
			if m.text == "" || len(m.text) > MaxCandidate {
				t.Fatalf("candidate of %d bytes accepted", len(m.text))
			}
		case sigEnd:
			if m.text != "" {
				t.Fatal("end with a body accepted")
			}
		default:
			t.Fatalf("type %#x accepted", m.typ)
		}
		if !bytes.Equal(encodeSignal(m.typ, m.text), body) {
			t.Fatal("decode does not round-trip")
		}
	})
}

// A raw signaling stream that breaks the protocol is reset, and leaves the answerer as it
// was: no PeerConnection, no counter moved.
func TestSignalingViolationsReset(t *testing.T) {
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	b := newTransport(t, hb, accepting())
	hugeLen := varint.ToUvarint(1 << 20)
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"oversized frame", append(hugeLen, make([]byte, 64)...)},
		{"garbage type", frame.Append(nil, encodeSignal(0x09, "hello"))},
		{"candidate before the offer", frame.Append(nil, encodeSignal(sigCandidate, "candidate:1 1 udp 1 127.0.0.1 1 typ host"))},
		{"answer instead of an offer", frame.Append(nil, encodeSignal(sigAnswer, "v=0"))},
		{"offer that is not SDP", frame.Append(nil, encodeSignal(sigOffer, "not an sdp"))},
		{"empty frame", frame.Append(nil, nil)},
		{"non-minimal varint", []byte{0x81, 0x00}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			waitSetupsDone(t, b)
			st, err := ha.NewStream(context.Background(), hb.ID(), SignalID)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Reset()
			st.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := st.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadAll(st); err == nil || errors.Is(err, io.EOF) || isTimeout(err) {
				t.Fatalf("read: %v, want the stream reset", err)
			}
			if st := b.Stats(); st != (Stats{}) {
				t.Fatalf("stats %+v, want untouched", st)
			}
		})
	}
}

// One set-up per remote peer at a time: a second signaling stream from the same peer is
// reset at once, while the first (stalled inside its offer) waits for its deadline.
func TestSignalingOneSetupPerPeer(t *testing.T) {
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	cfg := accepting()
	cfg.ConnectTimeout = time.Second
	b := newTransport(t, hb, cfg)

	first := openStalled(t, ha, hb)
	waitFor(t, "the first set-up to be admitted", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.incoming) == 1
	})
	start := time.Now()
	second := openStalled(t, ha, hb)
	if _, err := second.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("second stream read: %v, want a reset", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("second set-up refused after %v, want at once", d)
	}
	// The stalled one is reset by its deadline.
	if _, err := first.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("stalled stream read: %v, want a reset at ConnectTimeout", err)
	}
	if st := b.Stats(); st != (Stats{}) {
		t.Fatalf("stats %+v, want untouched", st)
	}
}

// openStalled opens a signaling stream from one host to the other and sends half a frame.
func openStalled(t *testing.T, from, to host.Host) network.Stream {
	t.Helper()
	st, err := from.NewStream(context.Background(), to.ID(), SignalID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Reset() })
	st.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := st.Write(varint.ToUvarint(100)); err != nil {
		t.Fatal(err)
	}
	return st
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// What the offerer makes of answerers that misbehave: a bad answer or a reset is
// ErrSignaling, silence is ErrSetupTimeout at ConnectTimeout; no PeerConnection is kept.
func TestOffererAgainstBadAnswerers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  func(st network.Stream)
		want    error
		timeout bool
	}{
		{"garbage answer", func(st network.Stream) {
			frame.Write(st, encodeSignal(sigAnswer, "not an sdp"))
			io.Copy(io.Discard, st)
		}, ErrSignaling, false},
		{"candidate before the answer", func(st network.Stream) {
			frame.Write(st, encodeSignal(sigCandidate, "candidate:1 1 udp 1 127.0.0.1 1 typ host"))
			io.Copy(io.Discard, st)
		}, ErrSignaling, false},
		{"reset", func(st network.Stream) { st.Reset() }, ErrSignaling, false},
		{"closed before the answer", func(st network.Stream) { st.Close() }, ErrSignaling, false},
		{"silent", func(st network.Stream) { io.Copy(io.Discard, st) }, ErrSetupTimeout, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ha, hb := newHost(t), newHost(t)
			connect(t, ha, hb)
			hb.SetStreamHandler(SignalID, func(st network.Stream) {
				defer st.Reset()
				if _, err := frame.NewReader(st, maxSignalFrame).Next(); err != nil {
					return
				}
				tc.answer(st)
			})
			const timeout = 2 * time.Second
			cfg := *loopbackEngine()
			cfg.ConnectTimeout = timeout
			a := newTransport(t, ha, cfg)
			start := time.Now()
			_, _, err := a.OpenStream(context.Background(), hb.ID())
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			// A bad answer fails at once, silence at ConnectTimeout.
			if d := time.Since(start); tc.timeout && (d < timeout || d > 2*timeout) || !tc.timeout && d > timeout/2 {
				t.Fatalf("failed after %v", d)
			}
			if st := a.Stats(); st.Open != 0 || st.SetupFailures != 1 {
				t.Fatalf("stats %+v, want nothing open and one failure", st)
			}
		})
	}
}
