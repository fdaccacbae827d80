package openai

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/transport"
)

// apiFrom does GET /v1/models on the API at addr from the loopback address src (127.0.0.x
// are distinct clients on one machine), on a fresh connection.
func apiFrom(src, addr string) (int, error) {
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/models", nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// slowClient connects from src and sends the start of a header, then a byte every few
// milliseconds until the server cuts it; it reports the cut (the server closed the
// connection, not the fail-safe deadline) on the channel.
func slowClient(t *testing.T, src, addr string) <-chan bool {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
	go func() { // ends at the first failed write: the server cut, or the test closed, c
		for {
			if _, err := c.Write([]byte("X")); err != nil {
				return
			}
			time.Sleep(10 * time.Millisecond) // pacing only: the test waits on the cut
		}
	}()
	cut := make(chan bool, 1)
	go func() { // ends when c is closed either way
		c.SetReadDeadline(time.Now().Add(time.Minute))
		_, err := io.ReadAll(c)
		var ne net.Error
		cut <- !errors.As(err, &ne) || !ne.Timeout()
	}()
	return cut
}

// The API's server limits against slow and greedy clients: a trickled header is cut at the
// header deadline, and a client at its connection cap has the next one closed on arrival,
// while another client is served. The limits are narrowed (a short deadline, a small cap)
// so that the test waits on events, not on the real 5 s; transport's synctest tests time
// the real values.
func TestAPISlowAndGreedyClients(t *testing.T) {
	const deadline = 200 * time.Millisecond
	narrow := httpLimits()
	narrow.ReadHeaderTimeout, narrow.ConnsPerIP = deadline, 4

	s := startServer(t, newDispatcher(t), withHTTPLimits(narrow))
	start := time.Now()
	cut := slowClient(t, "127.0.0.1", s.Addr())
	if code, err := apiFrom("127.0.0.2", s.Addr()); err != nil || code != http.StatusOK {
		t.Fatalf("another client during the attack: %d, %v", code, err)
	}
	if !<-cut {
		t.Fatal("a trickled header was never cut")
	}
	if took := time.Since(start); took < deadline {
		t.Fatalf("cut after %v, before the %v deadline", took, deadline)
	}

	narrow.ReadHeaderTimeout = time.Hour // the held connections stay held
	s = startServer(t, newDispatcher(t), withHTTPLimits(narrow))
	for range narrow.ConnsPerIP {
		slowClient(t, "127.0.0.1", s.Addr())
	}
	if !<-slowClient(t, "127.0.0.1", s.Addr()) { // accepted in order: after the held ones
		t.Fatalf("connection %d from one address was kept open", narrow.ConnsPerIP+1)
	}
	if code, err := apiFrom("127.0.0.2", s.Addr()); err != nil || code != http.StatusOK {
		t.Fatalf("another client at the cap: %d, %v", code, err)
	}
	if _, err := apiFrom("127.0.0.1", s.Addr()); err == nil {
		t.Fatal("a request over the cap was served")
	}
	t.Logf("figure F4: API: a trickled header cut at its %v deadline while 127.0.0.2 was served; connection %d from one address refused", deadline, narrow.ConnsPerIP+1)
}

// The defaults are in force: a header past MaxHeaderBytes gets 431 from New's server.
func TestAPIHeaderBound(t *testing.T) {
	s := startServer(t, newDispatcher(t))
	for _, tt := range []struct {
		pad, want int
	}{{1 << 10, http.StatusOK}, {transport.MaxHeaderBytes + 16<<10, http.StatusRequestHeaderFieldsTooLarge}} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.Addr()+"/v1/models", nil)
		req.Header.Set("X-Pad", strings.Repeat("a", tt.pad))
		resp, err := newClient(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Fatalf("header of %d bytes: %d, want %d", tt.pad, resp.StatusCode, tt.want)
		}
	}
}
