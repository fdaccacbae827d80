package bwprobe

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newHost(t testing.TB) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func connect(t testing.TB, a, b host.Host) {
	t.Helper()
	if err := a.Connect(context.Background(), peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatal(err)
	}
}

// probePair is a client host and a server host on loopback, connected, each with its
// estimator; the server is closed when the test ends.
func probePair(t *testing.T, sopts ...ServerOption) (ch, sh host.Host, cest, sest *bandwidth.Estimator, s *Server) {
	t.Helper()
	ch, sh = newHost(t), newHost(t)
	connect(t, ch, sh)
	cest, sest = bandwidth.New(), bandwidth.New()
	s = NewServer(sh, sest, sopts...)
	t.Cleanup(func() { s.Close() })
	return ch, sh, cest, sest, s
}

// A probe between two real hosts moves DefaultProbeBytes each way and gives the client a
// Down and an Up sample of the server, and the server a Down sample of the client. Measure
// right after probes no more: the samples are fresh.
func TestProbeMeasuresBothWays(t *testing.T) {
	ch, sh, cest, sest, s := probePair(t)
	c := NewClient(ch, cest)
	ctx := context.Background()
	est, err := c.Measure(ctx, sh.ID())
	if err != nil {
		t.Fatal(err)
	}
	if est.Down.Samples != 1 || est.Up.Samples != 1 || est.Down.BytesPerSec <= 0 || est.Up.BytesPerSec <= 0 {
		t.Fatalf("after a probe: %+v, want one sample each way", est)
	}
	if st := s.Stats(); st.Served != 1 || st.Refused != 0 {
		t.Fatalf("server stats %+v, want one probe served", st)
	}
	if got, ok := sest.Get(ch.ID().String()); !ok || got.Down.Samples != 1 || got.Up.Samples != 0 {
		t.Fatalf("server's estimate of the client %+v, want one Down sample", got)
	}
	again, err := c.Measure(ctx, sh.ID())
	if err != nil || again != est {
		t.Fatalf("Measure right after: %+v, %v; want %+v without a probe", again, err, est)
	}
	if st := s.Stats(); st.Served != 1 {
		t.Fatalf("Measure with fresh samples probed again: %+v", st)
	}
}

// A probe over MaxProbeBytes is refused before any payload moves (invalid_request), and
// nothing is measured.
func TestProbeOversizedRefused(t *testing.T) {
	ch, sh, cest, sest, s := probePair(t)
	c := NewClient(ch, cest, WithProbeBytes(MaxProbeBytes/2+1))
	_, err := c.Probe(context.Background(), sh.ID())
	if inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Fatalf("probe of %d bytes each way: %v, want invalid_request", MaxProbeBytes/2+1, err)
	}
	if st := s.Stats(); st.Refused != 1 || st.Served != 0 {
		t.Fatalf("server stats %+v, want one refusal", st)
	}
	if _, ok := cest.Get(sh.ID().String()); ok {
		t.Fatal("the client measured a refused probe")
	}
	if _, ok := sest.Get(ch.ID().String()); ok {
		t.Fatal("the server measured a refused probe")
	}
}

// The limits, on real hosts: a client probes a peer once per ProbeInterval (the second
// probe opens no stream); a server answers one peer once per ServeInterval (another
// client on the same host is refused with overloaded); a server refuses what its
// admission refuses, with its code.
func TestProbeRateLimited(t *testing.T) {
	ch, sh, cest, _, s := probePair(t)
	ctx := context.Background()
	c := NewClient(ch, cest)
	if _, err := c.Probe(ctx, sh.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Probe(ctx, sh.ID()); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("second probe at once: %v, want ErrRateLimited", err)
	}
	if st := s.Stats(); st.Served != 1 || st.Refused != 0 {
		t.Fatalf("server stats %+v: the client's limit must refuse before any stream", st)
	}
	other := NewClient(ch, bandwidth.New()) // its own limits, the same peer
	if _, err := other.Probe(ctx, sh.ID()); inference.CodeOf(err) != inference.CodeOverloaded {
		t.Fatalf("a probe from the same peer within ServeInterval: %v, want overloaded", err)
	}
	if st := s.Stats(); st.Served != 1 || st.Refused != 1 {
		t.Fatalf("server stats %+v, want one served and one refused", st)
	}

	pch, psh, pest, _, _ := probePair(t, WithAdmission(func(peer.ID) error {
		return inference.Errorf(inference.CodePolicyPaused, "paused")
	}))
	if _, err := NewClient(pch, pest).Probe(ctx, psh.ID()); inference.CodeOf(err) != inference.CodePolicyPaused {
		t.Fatalf("a probe of a paused server: %v, want policy_paused", err)
	}
}

// A client that breaks the protocol is reset, and one that sends nothing past its
// request's deadline too; neither costs the server a probe slot afterwards.
func TestServerResetsBadClients(t *testing.T) {
	ch, sh, cest, _, s := probePair(t)
	ctx := context.Background()
	for _, body := range [][]byte{
		{0x09},                         // not a request
		{frameRequest, 0x80, 0x00, 1},  // a non-minimal varint
		append(encodeRequest(1, 1), 0), // trailing bytes
	} {
		st, err := ch.NewStream(ctx, sh.ID(), ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := frame.Write(st, body); err != nil {
			t.Fatal(err)
		}
		st.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := frame.ReadOne(st, MaxAnswerFrame); err == nil {
			t.Fatalf("request %x was answered, want a reset", body)
		}
		st.Reset()
	}
	if st := s.Stats(); st.Served != 0 || st.Refused != 0 {
		t.Fatalf("server stats %+v after bad requests, want none served or refused", st)
	}
	// The limits are untouched: a good probe goes through.
	if _, err := NewClient(ch, cest).Probe(ctx, sh.ID()); err != nil {
		t.Fatalf("a probe after bad requests: %v", err)
	}
}
