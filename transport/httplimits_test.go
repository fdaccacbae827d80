package transport

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// pipeListener hands out net.Pipe connections, so that a server runs in a synctest bubble;
// each connection claims the remote address its dialer names.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 80} }

// dial connects to the server as a client at from (an IP address).
func (l *pipeListener) dial(from string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- addrConn{s, &net.TCPAddr{IP: net.ParseIP(from), Port: 40000}}:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

// trickle writes data to c a byte a second, then closes c. It ends at the first write that
// fails, or with the test.
func trickle(t *testing.T, c net.Conn, data string) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		defer c.Close()
		for i := range len(data) {
			if _, err := c.Write([]byte{data[i]}); err != nil {
				return
			}
			select {
			case <-time.After(time.Second):
			case <-stop:
				return
			}
		}
	}()
}

// apiLimits are the API's limits (transport/openai), which F4 is about.
var apiLimits = HTTPLimits{
	ReadHeaderTimeout: ReadHeaderTimeout,
	ReadTimeout:       30 * time.Second,
	IdleTimeout:       2 * time.Minute,
	MaxHeaderBytes:    MaxHeaderBytes,
	ConnsPerIP:        512,
}

// servePipes serves h with l on a pipe listener until the test's bubble ends, and returns
// the listener (its per-client counts) and a client of the honest address 10.0.0.2.
func servePipes(t *testing.T, l HTTPLimits, h http.Handler) (*pipeListener, *PerIPListener, *http.Client) {
	pl := newPipeListener()
	ln := l.Listener(pl)
	srv := l.Server(h)
	go srv.Serve(ln) // ends with Close below
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return pl.dial("10.0.0.2") }}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
		// After an error response net/http lingers 500 ms before closing (rstAvoidanceDelay):
		// let those goroutines end before the bubble does.
		time.Sleep(time.Second)
	})
	return pl, ln, &http.Client{Transport: tr}
}

// F4 (docs/reliability.md): 64 connections trickle a header a byte a second, far quicker than
// any per-read deadline would allow for, and are cut at the header deadline, to the instant
// (virtual time); the connection count is back to what it was before the attack; and an
// honest client is served all along, each request as fast as without the attack (in
// virtual time: no wait at all).
func TestSlowlorisHeaderCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl, ln, hc := servePipes(t, apiLimits, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "ok")
		}))
		honest := func() time.Duration {
			start := time.Now()
			resp, err := hc.Get("http://10.0.0.1/api/status")
			if err != nil {
				t.Fatalf("honest request: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(b) != "ok" {
				t.Fatalf("honest request: %d %q", resp.StatusCode, b)
			}
			return time.Since(start)
		}
		honest()
		synctest.Wait()
		before := ln.Open() // the honest client's kept-alive connection

		const attackers = 64
		header := "GET /api/status HTTP/1.1\r\nHost: 10.0.0.1\r\nX-Pad: " + strings.Repeat("a", 100)
		start := time.Now()
		cut := make(chan time.Duration, attackers)
		for range attackers {
			c, err := pl.dial("10.0.0.66")
			if err != nil {
				t.Fatal(err)
			}
			go func() { // ends when the server closes the connection
				io.Copy(io.Discard, c)
				cut <- time.Since(start)
			}()
			trickle(t, c, header)
		}
		// Honest requests every 250 ms of the attack, each on the kept-alive connection.
		for range 4 * int(ReadHeaderTimeout/time.Second) {
			time.Sleep(250 * time.Millisecond)
			if took := honest(); took != 0 {
				t.Fatalf("an honest request took %v during the attack, none without it", took)
			}
		}
		var latest time.Duration
		for range attackers {
			d := <-cut
			latest = max(latest, d)
			if d < ReadHeaderTimeout || d >= ReadHeaderTimeout+time.Second {
				t.Fatalf("an attacker was cut after %v, want the header deadline %v (+ under 1 s)", d, ReadHeaderTimeout)
			}
		}
		synctest.Wait()
		if got := ln.Open(); got != before {
			t.Fatalf("%d connections open after the attack, %d before", got, before)
		}
		t.Logf("figure F4: %d attackers trickling a header (virtual time): the last cut at %v (deadline %v); connections back to %d; %d honest requests during the attack, each in 0 s",
			attackers, latest, ReadHeaderTimeout, before, 4*int(ReadHeaderTimeout/time.Second))
	})
}

// A kept-alive connection is closed after IdleTimeout without a request; a body that
// trickles is cut at ReadTimeout, counted from the request's start.
func TestIdleAndBodyDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bodyErr := make(chan error, 1)
		pl, _, _ := servePipes(t, apiLimits, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, err := io.Copy(io.Discard, r.Body)
			bodyErr <- err
		}))

		c, err := pl.dial("10.0.0.3")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("first request: %v, %v", resp, err)
		}
		<-bodyErr
		io.Copy(io.Discard, c) // until the server closes the idle connection
		if d := time.Since(start); d != apiLimits.IdleTimeout {
			t.Fatalf("idle connection closed after %v, want %v", d, apiLimits.IdleTimeout)
		}

		c2, err := pl.dial("10.0.0.3")
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		start = time.Now()
		io.WriteString(c2, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
		trickle(t, c2, strings.Repeat("x", 1000))
		if err := <-bodyErr; err == nil {
			t.Fatal("a trickled body was read to its end")
		}
		if d := time.Since(start); d != apiLimits.ReadTimeout {
			t.Fatalf("body cut after %v, want %v", d, apiLimits.ReadTimeout)
		}
	})
}

// A header over MaxHeaderBytes (and net/http's few KiB of slack) gets 431, one within it
// is served.
func TestMaxHeaderBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, _, hc := servePipes(t, apiLimits, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		for _, tt := range []struct {
			pad  int
			want int
		}{
			{MaxHeaderBytes - 1024, http.StatusOK},
			{MaxHeaderBytes + 16<<10, http.StatusRequestHeaderFieldsTooLarge},
		} {
			req, _ := http.NewRequest(http.MethodGet, "http://10.0.0.1/", nil)
			req.Header.Set("X-Pad", strings.Repeat("a", tt.pad))
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("header of %d bytes: %v", tt.pad, err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("header of %d bytes: %d, want %d", tt.pad, resp.StatusCode, tt.want)
			}
		}
	})
}
