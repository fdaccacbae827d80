package testnet

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// proxyPair starts an echo server as node 0, a proxy in front of it, and a connection to
// the proxy from node 1's address. Bounds below are lower bounds (a fault can only add
// time), so a slow machine cannot fail them.
func proxyPair(t *testing.T) (*linkState, net.Conn) {
	t.Helper()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	state := newLinkState()
	p, err := newLinkProxy(0, "127.0.0.1", state)
	if err != nil {
		t.Fatal(err)
	}
	p.setUpstream(echo.Addr().String())
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	c, err := d.Dial("tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		p.close()
		echo.Close()
		<-done
	})
	return state, c
}

func roundTrip(t *testing.T, c net.Conn, msg []byte) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("echo differs")
	}
	return time.Since(start)
}

// Delay adds to each direction, bandwidth paces, a partition holds the bytes until the
// heal, and a reset cuts the connection: each on the link it names.
func TestLinkProxyFaults(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) }) // after proxyPair's cleanup
	state, c := proxyPair(t)
	roundTrip(t, c, []byte("warm"))

	state.update([][2]int{{1, 0}, {0, 1}}, func(f *LinkFaults) { f.Delay = 40 * time.Millisecond })
	if d := roundTrip(t, c, []byte("delayed")); d < 80*time.Millisecond {
		t.Errorf("round trip %v with 40 ms each way", d)
	}
	state.update([][2]int{{1, 0}}, func(f *LinkFaults) { f.Delay = 0 })
	if d := roundTrip(t, c, []byte("one way")); d < 40*time.Millisecond {
		t.Errorf("round trip %v with 40 ms back", d)
	}
	state.clear()

	// 20 KB at 100 KB/s one way: at least 200 ms less one pace step (the first write).
	state.update([][2]int{{1, 0}}, func(f *LinkFaults) { f.KBPerSec = 100 })
	if d := roundTrip(t, c, bytes.Repeat([]byte("b"), 20_000)); d < 200*time.Millisecond-linkPace {
		t.Errorf("20 KB at 100 KB/s in %v", d)
	}
	state.clear()

	state.update([][2]int{{1, 0}}, func(f *LinkFaults) { f.Down = true })
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); n != 0 || !isTimeout(err) {
		t.Fatalf("read %d bytes (%v) across a partition", n, err)
	}
	c.SetReadDeadline(time.Time{})
	state.update([][2]int{{1, 0}}, func(f *LinkFaults) { f.Down = false })
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "held" {
		t.Fatalf("after the heal: %q, %v", got, err)
	}

	state.reset([][2]int{{0, 1}})
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after a reset: %v, want a connection reset", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
