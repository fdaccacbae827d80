package openai

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

func TestCheckAddr(t *testing.T) {
	tests := []struct {
		addr     string
		public   bool
		loopback bool // false: refused with ErrNotLoopback
		ok       bool
	}{
		{"127.0.0.1:9337", false, true, true},
		{"127.0.0.2:0", false, true, true},
		{"[::1]:9337", false, true, true},
		{"localhost:9337", false, true, true},
		{"0.0.0.0:9337", false, false, false},
		{":9337", false, false, false},
		{"192.0.2.1:9337", false, false, false},
		{"example.com:9337", false, false, false},
		{"0.0.0.0:9337", true, true, true},
		{"192.0.2.1:9337", true, true, true},
		{"127.0.0.1", false, true, false}, // no port
		{"127.0.0.1", true, true, false},
	}
	for _, tt := range tests {
		err := CheckAddr(tt.addr, tt.public)
		if (err == nil) != tt.ok {
			t.Errorf("CheckAddr(%q, %v) = %v, want ok=%v", tt.addr, tt.public, err, tt.ok)
		}
		if got := errors.Is(err, ErrNotLoopback); got != !tt.loopback {
			t.Errorf("CheckAddr(%q, %v) = %v: ErrNotLoopback %v, want %v", tt.addr, tt.public, err, got, !tt.loopback)
		}
	}
	if _, err := New("0.0.0.0:0", newDispatcher(t)); !errors.Is(err, ErrNotLoopback) {
		t.Errorf("New(0.0.0.0:0) = %v, want ErrNotLoopback", err)
	}
	if _, err := New("0.0.0.0:0", newDispatcher(t), WithPublic(false)); !errors.Is(err, ErrNotLoopback) {
		t.Errorf("New(0.0.0.0:0, WithPublic(false)) = %v, want ErrNotLoopback", err)
	}
}

func TestServerClose(t *testing.T) {
	s, err := New("127.0.0.1:0", newDispatcher(t), WithLimits(inference.Limits{MaxBodyBytes: 4 << 10}))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c := newClient(t)
	addr := s.Addr()
	// WithLimits reached the handler.
	status, _, _, err := sendBody(c, addr, paddedBody(t, 4<<10+1), false)
	if err != nil || status != http.StatusRequestEntityTooLarge {
		t.Errorf("body over WithLimits' 4 KiB: status %d (%v), want 413", status, err)
	}
	status, _, _, err = sendBody(c, addr, paddedBody(t, 4<<10), false)
	if err != nil || status != http.StatusOK {
		t.Errorf("body at WithLimits' 4 KiB: status %d (%v), want 200", status, err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	c.Transport.(*http.Transport).CloseIdleConnections()
	if _, err := c.Get("http://" + addr + "/v1/models"); err == nil {
		t.Errorf("GET after Close succeeded")
	}
}

// TestClientDisconnect: a client that goes away cancels the Dispatcher's context, before the
// first token and mid-stream.
func TestClientDisconnect(t *testing.T) {
	for _, tt := range []struct {
		name       string
		stream     bool
		afterFirst bool // cancel after reading the first event, not before any token
	}{
		{"before first token", false, false},
		{"stream before first token", true, false},
		{"mid-stream", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			held := make(chan struct{}, 1)
			cancelled := make(chan error, 1)
			wait := func(ctx context.Context) error {
				held <- struct{}{}
				<-ctx.Done()
				cancelled <- ctx.Err()
				return ctx.Err()
			}
			d := newDispatcher(t)
			if tt.afterFirst {
				d.after = func(ctx context.Context, tok inference.Token) error {
					if tok.Index == 0 {
						return wait(ctx)
					}
					return nil
				}
			} else {
				d.before = wait
			}
			s := startServer(t, d)
			c := newClient(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.Addr()+"/v1/chat/completions",
				bytes.NewReader(body(t, testRequest(), tt.stream, false)))
			if err != nil {
				t.Fatalf("NewRequest: %v", err)
			}
			done := make(chan struct{})
			go func() { // ends when the request fails or is read to its end
				defer close(done)
				resp, err := c.Do(req)
				if err != nil {
					return
				}
				defer resp.Body.Close()
				if tt.afterFirst {
					if _, err := readEvent(bufio.NewReader(resp.Body)); err != nil {
						t.Errorf("first event: %v", err)
					}
					cancel()
				}
				io.Copy(io.Discard, resp.Body)
			}()
			recv(t, held, "the dispatcher to hold the request")
			if !tt.afterFirst {
				cancel()
			}
			if err := recv(t, cancelled, "the dispatcher's context to end"); !errors.Is(err, context.Canceled) {
				t.Errorf("dispatcher context ended with %v, want context.Canceled", err)
			}
			recv(t, done, "the client to return")
		})
	}
}

// TestCloseInFlight: Close ends requests that outlive the grace period with shutting_down,
// as a JSON error before the first token and as a final error event in a stream, and returns
// only after their handlers.
func TestCloseInFlight(t *testing.T) {
	held := make(chan struct{}, 2)
	hold := func(ctx context.Context) error {
		held <- struct{}{}
		<-ctx.Done()
		return fmt.Errorf("generation: %w", ctx.Err()) // as a backend does: the cause is the server's to name
	}
	d := newDispatcher(t)
	d.after = func(ctx context.Context, tok inference.Token) error {
		if tok.Index == 0 {
			return hold(ctx)
		}
		return nil
	}
	s := startServer(t, d)
	s.shutdownGrace, s.terminalGrace = 50*time.Millisecond, 2*time.Second // the test's time, not the product's
	c := newClient(t)

	// A stream held after its first token.
	resp := post(t, context.Background(), c, s.Addr(), body(t, testRequest(), true, false))
	defer resp.Body.Close()
	recv(t, held, "the stream to be held")

	// A non-streaming request held before any token (model cold or loading, say).
	d2 := newDispatcher(t)
	d2.before = hold
	s2 := startServer(t, d2)
	s2.shutdownGrace, s2.terminalGrace = 50*time.Millisecond, 2*time.Second
	type result struct {
		status int
		body   []byte
		header http.Header
	}
	got2 := make(chan result, 1)
	b2 := body(t, testRequest(), false, false)
	go func() { // ends when the request does
		status, b, h, err := sendBody(c, s2.Addr(), b2, false)
		if err != nil {
			t.Errorf("held request: %v", err)
		}
		got2 <- result{status, b, h}
	}()
	recv(t, held, "the request to be held")

	closed := make(chan error, 2)
	go func() { closed <- s.Close() }()  // ends when Close returns
	go func() { closed <- s2.Close() }() // ends when Close returns

	st := readStream(t, bufio.NewReader(resp.Body))
	if st.err == nil || st.err.Code != string(inference.CodeShuttingDown) || st.done || st.tokens != 1 {
		t.Errorf("stream at Close: %+v, error %+v; want 1 token then a shutting_down error event", st, st.err)
	}
	r := recv(t, got2, "the held request's response")
	if e := decodeError(t, r.status, r.header, r.body); r.status != 503 || e.Code != string(inference.CodeShuttingDown) {
		t.Errorf("request at Close: status %d code %q, want 503 shutting_down", r.status, e.Code)
	}
	for range 2 {
		if err := recv(t, closed, "Close to return"); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

// The API on loopback refuses a request whose Host is not this machine (DNS rebinding);
// with WithPublic it serves any Host, the operator having exposed it on purpose.
func TestServerRefusesForeignHost(t *testing.T) {
	for _, public := range []bool{false, true} {
		s, err := New("127.0.0.1:0", newDispatcher(t), WithPublic(public))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.Addr()+"/v1/models", nil)
		req.Host = "rebound.evil.example"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusMisdirectedRequest
		if public {
			want = http.StatusOK
		}
		if resp.StatusCode != want {
			t.Errorf("public %v: status %d, want %d", public, resp.StatusCode, want)
		}
		s.Close()
	}
}
