package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

func TestClientOf(t *testing.T) {
	v4 := netip.MustParsePrefix("127.0.0.2/32")
	v6 := netip.MustParsePrefix("2001:db8:1:2::/64")
	tests := []struct {
		addr net.Addr
		want netip.Prefix
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.2"), Port: 1}, v4},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:127.0.0.2"), Port: 2}, v4}, // IPv4-mapped: the same client
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::1"), Port: 1}, v6},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::9"), Port: 3}, v6}, // same /64: the same host
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "eth0"}, netip.MustParsePrefix("fe80::/64")},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:3::1"), Port: 1}, netip.MustParsePrefix("2001:db8:1:3::/64")},
		{&net.UDPAddr{IP: net.ParseIP("127.0.0.2"), Port: 1}, v4}, // parsed from its string
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, netip.Prefix{}},
		{&net.TCPAddr{}, netip.Prefix{}},
	}
	for _, tt := range tests {
		if got := clientOf(tt.addr); got != tt.want {
			t.Errorf("clientOf(%v) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}

// dialFrom opens a TCP connection to addr from the loopback address src (Linux routes all
// of 127.0.0.0/8 to lo, so 127.0.0.x are distinct clients on one machine).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c: a read ends with EOF or a reset
// (not with the fail-safe deadline, which means the server kept it open).
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(time.Minute))
	_, err := io.ReadAll(c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// getFrom does GET url from the loopback address src on a new connection and returns the
// status.
func getFrom(t *testing.T, src, url string) (int, error) {
	t.Helper()
	tr := &http.Transport{
		DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext,
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A client at its cap has its next connection closed on arrival, while another client
// (127.0.0.2) is still served; closing one of its connections gives the place back.
func TestConnsPerIPOnLoopback(t *testing.T) {
	const max = 4
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitPerIP(tcp, max)
	// No header deadline: the held connections stay held however slow the machine is.
	srv := HTTPLimits{MaxHeaderBytes: MaxHeaderBytes}.Server(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	done := make(chan struct{})
	go func() { // ends when Close stops the server
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	addr, url := tcp.Addr().String(), "http://"+tcp.Addr().String()+"/"

	held := make([]net.Conn, max)
	for i := range held {
		held[i] = dialFrom(t, "127.0.0.1", addr)
		if _, err := held[i].Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n")); err != nil { // a header never finished
			t.Fatal(err)
		}
	}
	waitFor(t, "the held connections accepted", func() bool { return ln.Open() == max })

	extra := dialFrom(t, "127.0.0.1", addr)
	if !closedByServer(extra) {
		t.Fatal("the connection over the cap was kept open")
	}
	if got := ln.Refused(); got != 1 {
		t.Fatalf("refused %d connections, want 1", got)
	}
	if code, err := getFrom(t, "127.0.0.2", url); err != nil || code != http.StatusOK {
		t.Fatalf("another client during the attack: %d, %v", code, err)
	}
	if _, err := getFrom(t, "127.0.0.1", url); err == nil {
		t.Fatal("a request over the cap was served")
	}

	held[0].Close()
	waitFor(t, "a place freed", func() bool { return ln.Open() == max-1 })
	if code, err := getFrom(t, "127.0.0.1", url); err != nil || code != http.StatusOK {
		t.Fatalf("after a connection closed: %d, %v", code, err)
	}
	waitFor(t, "the request's connection closed", func() bool { return ln.Open() == max-1 })
	t.Logf("figure F4: connection %d from 127.0.0.1 closed on arrival (cap %d), another address served, a freed place taken again", max+1, max)
}
