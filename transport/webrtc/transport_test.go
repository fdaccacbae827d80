package webrtc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// 1 MiB each way on the default engine (every interface, loopback included): identical
// bytes; the second stream is warm and the counters say so on both sides.
func TestEchoWarmAndCold(t *testing.T) {
	p := newPair(t, Config{}, Config{})
	p.b.SetStreamHandler(echo)
	ctx := context.Background()

	s, warm, err := p.a.OpenStream(ctx, p.hb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if warm {
		t.Fatal("first stream reported warm")
	}
	data := randomBytes(t, 1<<20)
	if got := roundTrip(t, s, data); !bytes.Equal(got, data) {
		t.Fatalf("echo differs: %d bytes back of %d", len(got), len(data))
	}
	s.Close()

	s2, warm, err := p.a.OpenStream(ctx, p.hb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if !warm {
		t.Fatal("second stream not warm")
	}
	small := randomBytes(t, 100)
	if got := roundTrip(t, s2, small); !bytes.Equal(got, small) {
		t.Fatal("warm echo differs")
	}
	s2.Close()

	st := p.a.Stats()
	if st.ColdSetups != 1 || st.WarmHits != 1 || st.Open != 1 || st.SetupFailures != 0 {
		t.Fatalf("offerer stats %+v, want 1 cold set-up, 1 warm hit, 1 open", st)
	}
	waitFor(t, "streams to end on both sides", func() bool {
		return p.a.Stats().Streams == 0 && p.b.Stats().Streams == 0
	})
	if st := p.b.Stats(); st.Accepted != 1 || st.Open != 1 {
		t.Fatalf("answerer stats %+v, want 1 accepted, 1 open", st)
	}
}

// Close delivers every byte written before it, then the remote reads io.EOF.
func TestCloseDeliversThenEOF(t *testing.T) {
	cfg := *loopbackEngine()
	p := newPair(t, cfg, cfg)
	type result struct {
		data []byte
		err  error
	}
	got := make(chan result, 1)
	p.b.SetStreamHandler(func(_ peer.ID, s Stream) {
		b, err := io.ReadAll(s)
		s.Close()
		got <- result{b, err}
	})
	s, _, err := p.a.OpenStream(context.Background(), p.hb.ID())
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(t, 1<<20)
	if _, err := s.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("remote read: %v, want a clean EOF", r.err)
	}
	if !bytes.Equal(r.data, data) {
		t.Fatalf("remote read %d bytes, want the %d written", len(r.data), len(data))
	}
	if _, err := s.Write([]byte("x")); err == nil {
		t.Fatal("write after Close succeeded")
	}
}

// Many streams at once on one PeerConnection, opened concurrently: one set-up, the
// others wait for it; every echo is identical.
func TestConcurrentStreamsOnePeerConnection(t *testing.T) {
	cfg := *loopbackEngine()
	p := newPair(t, cfg, cfg)
	p.b.SetStreamHandler(echo)
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			s, _, err := p.a.OpenStream(context.Background(), p.hb.ID())
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			data := randomBytes(t, 64<<10+i)
			if got := roundTrip(t, s, data); !bytes.Equal(got, data) {
				errs <- fmt.Errorf("stream %d: echo differs", i)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := p.a.Stats()
	if st.ColdSetups != 1 || st.Open != 1 {
		t.Fatalf("stats %+v, want one set-up and one peer connection for %d concurrent opens", st, n)
	}
}

// The answerer's PeerConnection serves streams it opens back to the offerer.
func TestAcceptedPeerConnectionOpensBack(t *testing.T) {
	cfg := *loopbackEngine()
	p := newPair(t, cfg, cfg)
	p.a.SetStreamHandler(echo)
	p.b.SetStreamHandler(echo)
	s, _, err := p.a.OpenStream(context.Background(), p.hb.ID())
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	waitFor(t, "answerer to keep the peer connection", func() bool { return p.b.Stats().Open == 1 })
	back, warm, err := p.b.OpenStream(context.Background(), p.ha.ID())
	if err != nil {
		t.Fatal(err)
	}
	if !warm {
		t.Fatal("stream back on the accepted peer connection not warm")
	}
	data := []byte("the other way")
	if got := roundTrip(t, back, data); !bytes.Equal(got, data) {
		t.Fatal("echo differs")
	}
	back.Close()
	if st := p.b.Stats(); st.ColdSetups != 0 || st.WarmHits != 1 {
		t.Fatalf("answerer stats %+v, want its stream warm with no set-up of its own", st)
	}
}

// A peer that does not speak the signaling protocol: ErrSignaling, nothing kept.
func TestOpenStreamPeerWithoutProtocol(t *testing.T) {
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	a := newTransport(t, ha, *loopbackEngine())
	_, _, err := a.OpenStream(context.Background(), hb.ID())
	if !errors.Is(err, ErrSignaling) {
		t.Fatalf("err %v, want ErrSignaling", err)
	}
	if st := a.Stats(); st.Open != 0 || st.SetupFailures != 1 {
		t.Fatalf("stats %+v, want nothing open and one failure", st)
	}
}

// A cancelled context passes through.
func TestOpenStreamContextError(t *testing.T) {
	cfg := *loopbackEngine()
	p := newPair(t, cfg, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := p.a.OpenStream(ctx, p.hb.ID()); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

// Close with streams open (and a handler blocked reading one) returns promptly; the
// streams fail, both Transports' goroutines are gone (TestMain's goleak).
func TestCloseWithOpenStreams(t *testing.T) {
	cfg := *loopbackEngine()
	p := newPair(t, cfg, cfg)
	handlerErr := make(chan error, 4)
	p.b.SetStreamHandler(func(_ peer.ID, s Stream) {
		_, err := io.ReadAll(s)
		handlerErr <- err
	})
	var streams []Stream
	for range 4 {
		s, _, err := p.a.OpenStream(context.Background(), p.hb.ID())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	waitFor(t, "the remote to count 4 streams", func() bool { return p.b.Stats().Streams == 4 })

	start := time.Now()
	if err := p.b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.a.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if err := p.a.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	for range 4 {
		if err := <-handlerErr; !errors.Is(err, ErrReset) {
			t.Fatalf("handler read: %v, want ErrReset", err)
		}
	}
	for _, s := range streams {
		if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrReset) {
			t.Fatalf("read after Close: %v, want ErrReset", err)
		}
	}
	if _, _, err := p.a.OpenStream(context.Background(), p.hb.ID()); !errors.Is(err, ErrClosed) {
		t.Fatalf("OpenStream after Close: %v, want ErrClosed", err)
	}
}

// With no stream handler, incoming streams are reset.
func TestNoHandlerResets(t *testing.T) {
	cfg := *loopbackEngine()
	p := newPair(t, cfg, cfg)
	s, _, err := p.a.OpenStream(context.Background(), p.hb.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Write([]byte("anyone?"))
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrReset) {
		t.Fatalf("read: %v, want ErrReset", err)
	}
}
