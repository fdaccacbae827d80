package webrtc

import (
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// streamPair opens a stream from a to b and returns both ends.
func streamPair(t *testing.T, p pair) (local, remote Stream) {
	t.Helper()
	accepted := make(chan Stream, 1)
	p.b.SetStreamHandler(func(_ peer.ID, s Stream) { accepted <- s })
	s, _, err := p.a.OpenStream(context.Background(), p.hb.ID())
	if err != nil {
		t.Fatal(err)
	}
	// The remote learns of a data channel when its first message arrives.
	if _, err := s.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	var r Stream
	select {
	case r = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("no stream accepted")
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Reset(); r.Reset() })
	return s, r
}

// Reset reaches the remote as an error that is not io.EOF, after the data sent before
// it; the remote's writes fail too from then on.
func TestResetSeenByRemote(t *testing.T) {
	cfg := *loopbackEngine()
	local, remote := streamPair(t, newPair(t, cfg, cfg))
	if _, err := local.Write([]byte("before")); err != nil {
		t.Fatal(err)
	}
	if err := local.Reset(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 6)
	if _, err := io.ReadFull(remote, got); err != nil || string(got) != "before" {
		t.Fatalf("read %q, %v: want the data sent before the reset", got, err)
	}
	_, err := remote.Read(make([]byte, 1))
	if err == nil || errors.Is(err, io.EOF) || !errors.Is(err, ErrReset) {
		t.Fatalf("remote read after reset: %v, want ErrReset", err)
	}
	if _, err := remote.Write([]byte("x")); !errors.Is(err, ErrReset) {
		t.Fatalf("remote write after reading the reset: %v, want ErrReset", err)
	}
	if _, err := local.Read(make([]byte, 1)); !errors.Is(err, ErrReset) {
		t.Fatalf("local read after Reset: %v, want ErrReset", err)
	}
	if _, err := local.Write([]byte("x")); !errors.Is(err, ErrReset) {
		t.Fatalf("local write after Reset: %v, want ErrReset", err)
	}
}

// CloseWrite is a half close: the remote reads EOF and can still answer.
func TestCloseWriteHalfClose(t *testing.T) {
	cfg := *loopbackEngine()
	local, remote := streamPair(t, newPair(t, cfg, cfg))
	if err := local.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("remote read after CloseWrite: %v, want io.EOF", err)
	}
	if _, err := remote.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	remote.Close()
	got, err := io.ReadAll(local)
	if err != nil || string(got) != "answer" {
		t.Fatalf("read %q, %v: want the answer then EOF", got, err)
	}
	if _, err := local.Write([]byte("x")); err == nil {
		t.Fatal("write after CloseWrite succeeded")
	}
}

// A read deadline fails a pending Read with a timeout; the stream works on after it is
// moved.
func TestReadDeadline(t *testing.T) {
	cfg := *loopbackEngine()
	local, remote := streamPair(t, newPair(t, cfg, cfg))
	start := time.Now()
	local.SetReadDeadline(start.Add(100 * time.Millisecond))
	_, err := local.Read(make([]byte, 1))
	var te interface{ Timeout() bool }
	if !errors.As(err, &te) || !te.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a timeout", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 2*time.Second {
		t.Fatalf("deadline fired after %v, want 100 ms", d)
	}
	// A deadline in the past fails at once.
	local.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := local.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past deadline: %v", err)
	}
	local.SetReadDeadline(time.Time{})
	if _, err := remote.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(local, got); err != nil || string(got) != "late" {
		t.Fatalf("read after clearing the deadline: %q, %v", got, err)
	}
}

// A Write blocked by flow control (the remote does not read) fails at its deadline.
func TestWriteDeadlineUnderFlowControl(t *testing.T) {
	cfg := *loopbackEngine()
	local, _ := streamPair(t, newPair(t, cfg, cfg))
	start := time.Now()
	local.SetWriteDeadline(start.Add(500 * time.Millisecond))
	n, err := local.Write(make([]byte, 16<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write: %d bytes, %v; want a timeout", n, err)
	}
	// What went out before the deadline is the remote's receive window plus our queue
	// (about 2 MiB), less under load; never all of it.
	if n == 0 || n >= 16<<20 {
		t.Fatalf("wrote %d bytes before the deadline, want some and not all", n)
	}
	if d := time.Since(start); d < 500*time.Millisecond || d > 3*time.Second {
		t.Fatalf("deadline fired after %v, want 500 ms", d)
	}
}

// Data channel messages that break the protocol reset the stream.
func TestStreamProtocolViolation(t *testing.T) {
	cfg := *loopbackEngine()
	local, remote := streamPair(t, newPair(t, cfg, cfg))
	raw := local.(*stream).dc
	if _, err := raw.WriteDataChannel([]byte{0x07, 1, 2}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Read(make([]byte, 8)); !errors.Is(err, ErrReset) {
		t.Fatalf("read of an unknown message type: %v, want ErrReset", err)
	}
	if _, err := local.Read(make([]byte, 8)); !errors.Is(err, ErrReset) {
		t.Fatalf("violator's read: %v, want ErrReset from the remote's reset", err)
	}
}
