package console

import (
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/transport"
)

// listenWith starts a console on loopback with limits changed by narrow.
func listenWith(t *testing.T, narrow func(*transport.HTTPLimits)) *Server {
	t.Helper()
	l := limits()
	narrow(&l)
	s, err := listen("127.0.0.1:0", false, &fakeSource{status: testStatus()}, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// connFrom opens a connection to the console from the loopback address src (127.0.0.x are
// distinct clients on one machine) and starts a request header it never finishes.
func connFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// cutByServer reports whether the server closed c, rather than the fail-safe deadline ending
// the wait.
func cutByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(time.Minute))
	_, err := io.ReadAll(c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// statusFrom does GET /api/status from src on a fresh connection.
func statusFrom(src, addr string) (int, error) {
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://" + addr + "/api/status")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// A client that sends its header a byte at a time is cut at the header deadline (narrowed
// here; transport's synctest tests time the real one), and others are served meanwhile.
func TestSlowHeaderIsCut(t *testing.T) {
	const deadline = 200 * time.Millisecond
	s := listenWith(t, func(l *transport.HTTPLimits) { l.ReadHeaderTimeout = deadline })
	c := connFrom(t, "127.0.0.1", s.Addr())
	start := time.Now()
	go func() { // ends at the first write that fails: the server cut the connection
		for {
			if _, err := c.Write([]byte("X")); err != nil {
				return
			}
			time.Sleep(deadline / 10) // pacing only: the test waits on the cut, not on time
		}
	}()
	if code, err := statusFrom("127.0.0.2", s.Addr()); err != nil || code != http.StatusOK {
		t.Fatalf("another client: %d, %v", code, err)
	}
	if !cutByServer(c) {
		t.Fatal("a header trickled a byte at a time was never cut")
	}
	if took := time.Since(start); took < deadline {
		t.Fatalf("cut after %v, before the %v deadline", took, deadline)
	}
	t.Logf("figure F4: console header trickled a byte at a time cut after %v (deadline %v)", time.Since(start).Round(time.Millisecond), deadline)
}

// A client holding connsPerIP connections has its next one closed on arrival; another
// client (127.0.0.2) is served meanwhile.
func TestConnsPerIPCap(t *testing.T) {
	s := listenWith(t, func(l *transport.HTTPLimits) { l.ReadHeaderTimeout, l.ReadTimeout = time.Hour, time.Hour })
	for range connsPerIP {
		connFrom(t, "127.0.0.1", s.Addr())
	}
	// Accept takes connections in the order they were made: the one after connsPerIP finds
	// them all held.
	extra := connFrom(t, "127.0.0.1", s.Addr())
	if !cutByServer(extra) {
		t.Fatalf("connection %d from one address was kept open", connsPerIP+1)
	}
	if code, err := statusFrom("127.0.0.2", s.Addr()); err != nil || code != http.StatusOK {
		t.Fatalf("another client: %d, %v", code, err)
	}
	t.Logf("figure F4: console connection %d from 127.0.0.1 closed on arrival, 127.0.0.2 served", connsPerIP+1)
}
