package mux

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
)

// waitLimit bounds every wait on a condition in these tests: far above what any of them
// needs on a loaded machine under -race, so that reaching it means the condition never came.
const waitLimit = 5 * time.Second

// waitFor polls cond until it holds, failing the test after waitLimit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitLimit, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitBlocked waits until a goroutine is parked (in a select or a channel receive) inside
// fn, as runtime.Stack names it.
func waitBlocked(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	waitFor(t, "a goroutine blocked in "+fn, func() bool {
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(stacks, "\n\n") {
			header, _, _ := strings.Cut(g, "\n")
			parked := strings.Contains(header, "[select") || strings.Contains(header, "[chan receive")
			if parked && strings.Contains(g, fn) {
				return true
			}
		}
		return false
	})
}

// tcpPair returns both ends of a loopback TCP connection, closed at cleanup.
func tcpPair(t testing.TB) (dialer, listener net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialer, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dialer.Close() })
	listener, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close() })
	return dialer, listener
}

// connPair returns two Conns over loopback TCP, closed (and their goroutines waited for)
// at cleanup.
func connPair(t *testing.T, tr *Transport) (dialer, listener *Conn) {
	t.Helper()
	d, l := tcpPair(t)
	dialer, listener = newConn(d, false, tr), newConn(l, true, tr)
	t.Cleanup(func() { dialer.Close() })
	t.Cleanup(func() { listener.Close() })
	return dialer, listener
}

// rawPeer returns a listener-side Conn and the raw dialer end facing it, on which a test
// writes hand-built frames (so the raw side opens odd stream IDs).
func rawPeer(t *testing.T, tr *Transport) (*Conn, net.Conn) {
	t.Helper()
	raw, l := tcpPair(t)
	c := newConn(l, true, tr)
	t.Cleanup(func() { c.Close() })
	return c, raw
}

// frame builds one frame: its header, then payload.
func frame(typ, flags byte, id, length uint32, payload []byte) []byte {
	b := make([]byte, hdrSize, hdrSize+len(payload))
	putHeader(b, typ, flags, id, length)
	return append(b, payload...)
}

func sendFrame(t *testing.T, w io.Writer, typ, flags byte, id, length uint32, payload []byte) {
	t.Helper()
	if _, err := w.Write(frame(typ, flags, id, length, payload)); err != nil {
		t.Fatalf("writing frame type %d flags %#x stream %d: %v", typ, flags, id, err)
	}
}

// header is a decoded frame header.
type header struct {
	typ, flags byte
	id, length uint32
}

// readFrames reads frames from raw until it fails, which must be the remote's close (not
// our read deadline), and returns their headers.
func readFrames(t *testing.T, raw net.Conn) []header {
	t.Helper()
	raw.SetReadDeadline(time.Now().Add(waitLimit))
	var got []header
	var h [hdrSize]byte
	for {
		if _, err := io.ReadFull(raw, h[:]); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("raw side still open after %v", waitLimit)
			}
			return got
		}
		f := header{typ: h[0], flags: h[1], id: binary.BigEndian.Uint32(h[2:]), length: binary.BigEndian.Uint32(h[6:])}
		if f.typ == typeData {
			if _, err := io.CopyN(io.Discard, raw, int64(f.length)); err != nil {
				return got
			}
		}
		got = append(got, f)
	}
}

// open opens a stream on c, failing the test after waitLimit.
func open(t *testing.T, c *Conn) network.MuxedStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	s, err := c.OpenStream(ctx)
	if err != nil {
		t.Fatalf("OpenStream: %v", err)
	}
	return s
}

// accept accepts a stream on c, failing the test after waitLimit.
func accept(t *testing.T, c *Conn) network.MuxedStream {
	t.Helper()
	type result struct {
		s   network.MuxedStream
		err error
	}
	ch := make(chan result, 1)
	// Ends when a stream arrives or c closes (at the latest at cleanup).
	go func() {
		s, err := c.AcceptStream()
		ch <- result{s, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("AcceptStream: %v", r.err)
		}
		return r.s
	case <-time.After(waitLimit):
		t.Fatalf("no stream accepted within %v", waitLimit)
		return nil
	}
}

// streamPair opens a stream on a and accepts it on b.
func streamPair(t *testing.T, a, b *Conn) (opened, accepted network.MuxedStream) {
	t.Helper()
	opened = open(t, a)
	return opened, accept(t, b)
}

// TestProtocolViolationClosesConn proves each protocol error of the doc closes the
// connection, fails its streams with an error wrapping network.ErrReset and closes the
// socket.
func TestProtocolViolationClosesConn(t *testing.T) {
	full := make([]byte, MaxPayload)
	for _, tc := range []struct {
		name string
		send func(t *testing.T, raw net.Conn)
	}{
		{"payload over MaxPayload, header only", func(t *testing.T, raw net.Conn) {
			sendFrame(t, raw, typeData, 0, 1, MaxPayload+1, nil)
		}},
		{"data beyond credit", func(t *testing.T, raw net.Conn) {
			for range Window / MaxPayload {
				sendFrame(t, raw, typeData, 0, 1, MaxPayload, full)
			}
			sendFrame(t, raw, typeData, 0, 1, 1, []byte{0})
		}},
		{"unknown frame type", func(t *testing.T, raw net.Conn) {
			sendFrame(t, raw, typeGoAway+1, 0, 1, 0, nil)
		}},
		{"unknown flag bit", func(t *testing.T, raw net.Conn) {
			sendFrame(t, raw, typeWindow, 0x10, 1, 0, nil)
		}},
		{"SYN twice", func(t *testing.T, raw net.Conn) {
			sendFrame(t, raw, typeWindow, flagSYN, 1, 0, nil)
		}},
		{"SYN with the conn's parity", func(t *testing.T, raw net.Conn) {
			sendFrame(t, raw, typeWindow, flagSYN, 2, 0, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, raw := rawPeer(t, &Transport{KeepAlive: -1})
			sendFrame(t, raw, typeWindow, flagSYN, 1, 0, nil)
			s := accept(t, c)

			tc.send(t, raw)
			waitFor(t, "the conn to close", c.IsClosed)

			if err := c.closeErr(); !errors.Is(err, errProtocol) || !errors.Is(err, network.ErrReset) {
				t.Errorf("conn closed with %v; want a protocol violation wrapping network.ErrReset", err)
			}
			// Read first: it waits until the stream is failed, which comes after IsClosed
			// (TestClosedConnFailsStreamWrites checks Write right at IsClosed).
			s.SetReadDeadline(time.Now().Add(waitLimit))
			if _, err := io.Copy(io.Discard, s); !errors.Is(err, network.ErrReset) {
				t.Errorf("stream Read after the violation: %v; want network.ErrReset", err)
			}
			if _, err := s.Write([]byte("x")); !errors.Is(err, network.ErrReset) {
				t.Errorf("stream Write after the violation: %v; want network.ErrReset", err)
			}
			readFrames(t, raw) // fails the test unless the raw side reads EOF or an error
		})
	}
}

// gatedClose holds its Close until released, to freeze a Conn in the middle of shutdown.
type gatedClose struct {
	net.Conn
	closing     chan struct{} // closed when Close is entered
	release     chan struct{} // closed to let Close go on
	closingOnce sync.Once
}

func (g *gatedClose) Close() error {
	g.closingOnce.Do(func() { close(g.closing) })
	<-g.release
	return g.Conn.Close()
}

// TestClosedConnFailsStreamWrites proves that once a Conn starts shutting down (its socket
// being closed), a stream's Write fails with network.ErrReset instead of writing to the
// socket, and that IsClosed reports true once the shutdown is through.
func TestClosedConnFailsStreamWrites(t *testing.T) {
	raw, l := tcpPair(t)
	g := &gatedClose{Conn: l, closing: make(chan struct{}), release: make(chan struct{})}
	c := newConn(g, true, &Transport{KeepAlive: -1})
	t.Cleanup(func() { c.Close() })
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(g.release) }) }
	t.Cleanup(release) // runs before c.Close, which waits for the shutdown held here

	sendFrame(t, raw, typeWindow, flagSYN, 1, 0, nil)
	s := accept(t, c)
	sendFrame(t, raw, typeGoAway+1, 0, 0, 0, nil) // a protocol violation: c shuts down

	select {
	case <-g.closing:
	case <-time.After(waitLimit):
		t.Fatal("the conn did not close its socket")
	}
	_, err := s.Write([]byte("x"))
	release()
	if !errors.Is(err, network.ErrReset) {
		t.Errorf("Write on a stream of a closing conn: %v; want network.ErrReset", err)
	}
	waitFor(t, "IsClosed after the shutdown", c.IsClosed)
	if _, err := s.Write([]byte("x")); !errors.Is(err, network.ErrReset) {
		t.Errorf("Write on a stream of a closed conn: %v; want network.ErrReset", err)
	}
}

// TestResetCarriesCode proves ResetWithError's code reaches the remote's Read (Remote true)
// and the local Write reports it too (Remote false).
func TestResetCarriesCode(t *testing.T) {
	a, b := connPair(t, &Transport{KeepAlive: -1})
	sa, sb := streamPair(t, a, b)

	if err := sa.ResetWithError(0x42); err != nil {
		t.Fatalf("ResetWithError: %v", err)
	}

	sb.SetReadDeadline(time.Now().Add(waitLimit))
	_, err := sb.Read(make([]byte, 1))
	var se *network.StreamError
	if !errors.As(err, &se) || se.ErrorCode != 0x42 || !se.Remote {
		t.Errorf("remote Read: %v; want a remote StreamError with code 0x42", err)
	}
	if !errors.Is(err, network.ErrReset) {
		t.Errorf("remote Read: %v does not wrap network.ErrReset", err)
	}

	_, err = sa.Write([]byte("x"))
	if !errors.As(err, &se) || se.ErrorCode != 0x42 || se.Remote {
		t.Errorf("local Write: %v; want a local StreamError with code 0x42", err)
	}
}

// TestFlowControlBlocksWriter proves a writer sends exactly one window to a reader that
// reads nothing, times out at its write deadline, and goes on once the reader has read.
func TestFlowControlBlocksWriter(t *testing.T) {
	a, b := connPair(t, &Transport{KeepAlive: -1})
	w, r := streamPair(t, a, b)

	w.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := w.Write(make([]byte, 2*Window))
	if n != Window {
		t.Errorf("Write sent %d bytes before its deadline; want exactly the window, %d", n, Window)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write: %v; want os.ErrDeadlineExceeded", err)
	}
	var timeout interface{ Timeout() bool }
	if !errors.As(err, &timeout) || !timeout.Timeout() {
		t.Errorf("Write error %v does not report Timeout()", err)
	}

	r.SetReadDeadline(time.Now().Add(waitLimit))
	if _, err := io.ReadFull(r, make([]byte, n)); err != nil {
		t.Fatalf("reading the window: %v", err)
	}
	// Having read a window, the reader has granted more than half of it back.
	w.SetWriteDeadline(time.Now().Add(waitLimit))
	if _, err := w.Write(make([]byte, Window/2)); err != nil {
		t.Fatalf("Write after the reader read: %v", err)
	}
	if _, err := io.ReadFull(r, make([]byte, Window/2)); err != nil {
		t.Fatalf("reading the second write: %v", err)
	}
}

// TestCloseReadReturnsCredit proves that after CloseRead the remote can write many windows
// without stalling, and the reader's Read fails.
func TestCloseReadReturnsCredit(t *testing.T) {
	a, b := connPair(t, &Transport{KeepAlive: -1})
	w, r := streamPair(t, a, b)

	if err := r.CloseRead(); err != nil {
		t.Fatalf("CloseRead: %v", err)
	}
	w.SetWriteDeadline(time.Now().Add(waitLimit))
	if n, err := w.Write(make([]byte, 4*Window)); n != 4*Window || err != nil {
		t.Fatalf("Write to a stream closed for reading: %d bytes, %v; want %d, nil", n, err, 4*Window)
	}
	if n, err := r.Read(make([]byte, 1)); err == nil || err == io.EOF {
		t.Errorf("Read after CloseRead: %d bytes, %v; want a non-EOF error", n, err)
	}
}

// TestAcceptBacklogBlocksOpener proves OpenStream blocks once AcceptBacklog streams wait
// for the remote's AcceptStream, and goes on when one is accepted.
func TestAcceptBacklogBlocksOpener(t *testing.T) {
	a, b := connPair(t, &Transport{KeepAlive: -1})
	for range AcceptBacklog {
		open(t, a)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := a.OpenStream(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("OpenStream over the backlog: %v; want context.DeadlineExceeded", err)
	}

	accept(t, b)
	open(t, a)
}

// TestResetBeforeAcceptKeepsBacklogPromise proves that a stream its opener reset before the
// remote accepted it does not get a later stream reset for a full backlog: the doc says a
// busy acceptor slows openers down instead of resetting their streams.
func TestResetBeforeAcceptKeepsBacklogPromise(t *testing.T) {
	a, b := connPair(t, &Transport{KeepAlive: -1})
	var first network.MuxedStream
	for i := range AcceptBacklog {
		s := open(t, a)
		if i == 0 {
			first = s
		}
	}
	first.Reset()

	// OpenStream may block until the acceptor runs (then it fails here and is retried
	// below with the acceptor running) or return at once.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	extra, err := a.OpenStream(ctx)
	cancel()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("OpenStream: %v", err)
	}
	if err == nil {
		// Let b take extra's SYN in before anything is accepted: b answers a ping sent
		// after it only once it has handled it.
		before := a.frames.Load()
		a.control(typePing, flagSYN, 0, 0)
		waitFor(t, "b to answer a ping", func() bool { return a.frames.Load() > before })
	}

	// The acceptor answers "ok" on every stream it accepts; it ends when b closes.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			s, err := b.AcceptStream()
			if err != nil {
				return
			}
			s.Write([]byte("ok"))
			s.CloseWrite()
		}
	}()
	t.Cleanup(func() {
		b.Close()
		<-done
	})

	if extra == nil {
		extra = open(t, a)
	}
	extra.SetReadDeadline(time.Now().Add(waitLimit))
	got, err := io.ReadAll(extra)
	if err != nil || string(got) != "ok" {
		t.Fatalf("stream opened after a reset one read %q, %v; want it accepted and answered", got, err)
	}
}

// TestKeepAliveClosesSilentConn proves a Conn pings a remote that sends nothing and closes
// after three silent intervals.
func TestKeepAliveClosesSilentConn(t *testing.T) {
	c, raw := rawPeer(t, &Transport{KeepAlive: 20 * time.Millisecond})
	waitFor(t, "the conn to close", c.IsClosed)

	pings := 0
	for _, f := range readFrames(t, raw) {
		if f.typ == typePing && f.flags == flagSYN {
			pings++
		}
	}
	if pings == 0 {
		t.Error("the conn closed without pinging")
	}
}

// TestKeepAliveKeepsLiveConn proves two live Conns with a short keep-alive answer each
// other's pings and stay open.
func TestKeepAliveKeepsLiveConn(t *testing.T) {
	const ka = 20 * time.Millisecond
	a, b := connPair(t, &Transport{KeepAlive: ka})
	// A fixed observation window: staying open is the absence of an event, so there is no
	// condition to wait on. Ten intervals is over three times the closing silence.
	time.Sleep(10 * ka)
	if a.IsClosed() || b.IsClosed() {
		t.Fatalf("a live conn closed after %v: %v / %v", 10*ka, a.closeErr(), b.closeErr())
	}
}

// TestCloseTimeoutResets proves a stream closed while the remote never closes its side is
// reset after the close timeout: the remote's Read reports a remote StreamError.
func TestCloseTimeoutResets(t *testing.T) {
	a, b := connPair(t, &Transport{KeepAlive: -1, CloseTimeout: 50 * time.Millisecond})
	sa, sb := streamPair(t, a, b)

	if err := sa.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	sb.SetReadDeadline(time.Now().Add(waitLimit))
	var se *network.StreamError
	waitFor(t, "the remote's Read to report the reset", func() bool {
		_, err := sb.Read(make([]byte, 1)) // io.EOF after the FIN, until the reset
		if err != nil && !errors.Is(err, io.EOF) && !errors.As(err, &se) {
			t.Fatalf("remote Read: %v; want io.EOF, then a StreamError", err)
		}
		return se != nil
	})
	if !se.Remote {
		t.Errorf("remote Read: %v; want Remote true", se)
	}
}

// TestReadDeadline proves Read fails with os.ErrDeadlineExceeded at its deadline, and that
// moving the deadline while a Read blocks takes effect.
func TestReadDeadline(t *testing.T) {
	a, b := connPair(t, &Transport{KeepAlive: -1})

	t.Run("idle", func(t *testing.T) {
		_, r := streamPair(t, a, b)
		r.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := r.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read: %v; want os.ErrDeadlineExceeded", err)
		}
	})

	t.Run("moved while blocked", func(t *testing.T) {
		_, r := streamPair(t, a, b)
		r.SetReadDeadline(time.Now().Add(time.Hour))
		res := make(chan error, 1)
		// Ends at the moved deadline, or when b closes at cleanup.
		go func() {
			_, err := r.Read(make([]byte, 1))
			res <- err
		}()
		waitBlocked(t, "mux.(*stream).Read(")
		r.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		select {
		case err := <-res:
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("Read: %v; want os.ErrDeadlineExceeded", err)
			}
		case <-time.After(waitLimit):
			t.Fatal("Read did not return at its moved deadline")
		}
	})
}

// TestDataAndFINSurviveConnClose proves what arrived before the connection closed stays
// readable: the data, then io.EOF for the FIN that came with it (a stream's broken error
// only shows once its buffer is read, and a FIN read first wins).
func TestDataAndFINSurviveConnClose(t *testing.T) {
	a, b := connPair(t, &Transport{KeepAlive: -1})
	w, r := streamPair(t, a, b)
	// Until a has read b's ACK it has unread bytes, and closing a TCP socket with unread
	// bytes sends RST, which may drop what is in flight.
	waitFor(t, "a to see the ACK", func() bool { return len(a.unacked) == 0 })

	want := bytes.Repeat([]byte("0123456789"), 100)
	if _, err := w.Write(want); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if err := w.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	a.Close()
	waitFor(t, "b to close", b.IsClosed)

	r.SetReadDeadline(time.Now().Add(waitLimit))
	got, err := io.ReadAll(r) // ReadAll turns the final io.EOF into a nil error
	if err != nil {
		t.Errorf("Read after the close: %v; want io.EOF after the data", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("read %d bytes after the close; want the %d written", len(got), len(want))
	}
}

// FuzzConnInput feeds arbitrary bytes to a listener-side Conn while its streams are
// accepted and read to the end: no input may panic it or keep Close from returning.
func FuzzConnInput(f *testing.F) {
	cat := func(frames ...[]byte) []byte { return bytes.Join(frames, nil) }
	f.Add(cat(
		frame(typeWindow, flagSYN, 1, 0, nil),
		frame(typeData, 0, 1, 5, []byte("hello")),
		frame(typeWindow, flagFIN, 1, 0, nil),
	))
	f.Add(cat(
		frame(typeWindow, flagSYN, 3, Window, nil),
		frame(typeData, flagFIN, 3, 3, []byte("abc")),
		frame(typeWindow, flagACK, 2, 0, nil),
	))
	f.Add(cat(
		frame(typeWindow, flagSYN, 1, 0, nil),
		frame(typeWindow, flagRST, 1, 0x42, nil),
		frame(typeWindow, flagSYN, 1, 0, nil),
	))
	f.Add(cat(frame(typePing, flagSYN, 0, 7, nil), frame(typePing, flagACK, 0, 7, nil)))
	f.Add(frame(typeGoAway, 0, 0, 0, nil))
	f.Add(frame(typeData, 0, 1, MaxPayload+1, nil))
	f.Add([]byte{typeWindow, flagSYN, 0, 0})
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add(bytes.Repeat([]byte{0xff}, 64))

	f.Fuzz(func(t *testing.T, in []byte) {
		raw, nc := net.Pipe()
		c := newConn(nc, true, &Transport{KeepAlive: -1})
		var wg sync.WaitGroup
		wg.Add(2)
		// Drains what c writes; ends when raw closes.
		go func() {
			defer wg.Done()
			io.Copy(io.Discard, raw)
		}()
		// Accepts until c closes; each reader ends at its stream's end or c's close.
		go func() {
			defer wg.Done()
			for {
				s, err := c.AcceptStream()
				if err != nil {
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					io.Copy(io.Discard, s)
				}()
			}
		}()

		raw.Write(in) // fails once c closes on a protocol error
		raw.Close()
		closed := make(chan struct{})
		go func() {
			c.Close()
			wg.Wait()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(waitLimit):
			t.Fatal("Close or the stream readers did not return")
		}
	})
}
