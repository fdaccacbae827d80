package upstream_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/upstream"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// closedURL is the URL of a loopback port nothing listens on any more.
func closedURL(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// stalling serves requests that never answer until the client gives up or the test ends.
func stalling(t testing.TB) string {
	t.Helper()
	release := make(chan struct{})
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release) }) // runs before srv.Close, which waits for handlers
	return srv.URL
}

// fastTimeouts keeps the timeout cases of the tests short.
var fastTimeouts = upstream.WithTimeouts(200*time.Millisecond, 200*time.Millisecond)

// stallTimeouts give the first token all the time a loaded machine may need and a stall
// after it a short idle timeout: the two tokens before the stall always arrive in time.
var stallTimeouts = upstream.WithTimeouts(time.Minute, time.Second)

// Each failure, produced by a real condition (a closed port, our own API refusing or failing
// a request, a server that stalls), maps to its typed code, after the tokens that preceded it.
func TestErrorMapping(t *testing.T) {
	failWith := func(code inference.Code) func(*synthDispatcher) {
		return func(d *synthDispatcher) {
			d.before = func(context.Context) error { return inference.Errorf(code, "refused for the test") }
		}
	}
	failAt := func(index int, code inference.Code) func(*synthDispatcher) {
		return func(d *synthDispatcher) {
			d.after = func(_ context.Context, t inference.Token) error {
				if t.Index == index {
					return inference.Errorf(code, "failed mid-stream for the test")
				}
				return nil
			}
		}
	}
	tests := []struct {
		name     string
		base     func(t *testing.T) string // the upstream; nil: our API over hooked synth
		hook     func(*synthDispatcher)
		limits   inference.Limits
		model    string // configured and requested; testModel when empty
		mutate   func(*inference.Request)
		opts     []upstream.Option
		want     inference.Code
		tokens   int
		wrapsCtx bool
	}{
		{name: "closed port", base: func(t *testing.T) string { return closedURL(t) }, want: inference.CodeUnavailable},
		{name: "model the upstream does not serve", model: "synth-small", want: inference.CodeModelNotFound},
		{name: "429", hook: failWith(inference.CodeOverloaded), want: inference.CodeOverloaded},
		{name: "503 unavailable", hook: failWith(inference.CodeUnavailable), want: inference.CodeUnavailable},
		{name: "503 shutting down", hook: failWith(inference.CodeShuttingDown), want: inference.CodeUnavailable},
		{name: "504 is another 5xx", hook: failWith(inference.CodeTimeout), want: inference.CodeUnavailable},
		{name: "400 invalid", limits: inference.Limits{MaxTokens: 8}, want: inference.CodeInvalidRequest},
		{name: "context overflow", mutate: func(r *inference.Request) {
			r.Messages = []inference.Message{{Role: inference.RoleUser, Content: strings.Repeat("a long prompt ", 2000)}}
		}, want: inference.CodeContextOverflow},
		{name: "mid-stream typed error", hook: failAt(2, inference.CodePeerLost), want: inference.CodePeerLost, tokens: 3},
		{name: "mid-stream unavailable", hook: failAt(0, inference.CodeUnavailable), want: inference.CodeUnavailable, tokens: 1},
		{name: "no first token", base: func(t *testing.T) string { return stalling(t) }, opts: []upstream.Option{fastTimeouts}, want: inference.CodeTimeout},
		{name: "stalls mid-stream", hook: func(d *synthDispatcher) {
			d.after = func(ctx context.Context, t inference.Token) error {
				if t.Index == 1 {
					<-ctx.Done() // until the client gives up
					return ctx.Err()
				}
				return nil
			}
		}, opts: []upstream.Option{stallTimeouts}, want: inference.CodeTimeout, tokens: 2},
	}
	for _, tt := range tests {
		var base string
		if tt.base != nil {
			base = tt.base(t)
		} else {
			d := newDispatcher(t)
			if tt.hook != nil {
				tt.hook(d)
			}
			base = serve(t, openai.Handler(d, openai.WithLimits(tt.limits))).URL
		}
		model := cmpOr(tt.model, testModel)
		b := newBackend(t, base, []string{model}, tt.opts...)
		req := testRequest()
		req.Model = model
		if tt.mutate != nil {
			tt.mutate(&req)
		}
		r := generate(context.Background(), b, req)
		if got := inference.CodeOf(r.err); got != tt.want {
			t.Errorf("%s: error %v (code %q), want code %q", tt.name, r.err, got, tt.want)
		}
		if _, typed := errors.AsType[*inference.Error](r.err); !typed {
			t.Errorf("%s: error %v is not an *inference.Error", tt.name, r.err)
		}
		if r.res != (inference.Result{}) {
			t.Errorf("%s: result %+v with an error, want the zero value", tt.name, r.res)
		}
		if len(r.tokens) != tt.tokens {
			t.Errorf("%s: %d tokens before the error, want %d", tt.name, len(r.tokens), tt.tokens)
		}
		checkStream(t, r.tokens)
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// A model outside the configured list and a request that is invalid on its face fail without
// a request to the upstream.
func TestRefusedWithoutContactingUpstream(t *testing.T) {
	var contacted atomic.Int64
	api := openai.Handler(newDispatcher(t))
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		contacted.Add(1)
		api.ServeHTTP(w, r)
	}))
	b := newBackend(t, srv.URL, []string{testModel})
	req := testRequest()
	req.Model = "synth-small" // served by the upstream, not configured here
	if r := generate(context.Background(), b, req); inference.CodeOf(r.err) != inference.CodeModelNotFound {
		t.Errorf("unconfigured model: error %v, want model_not_found", r.err)
	}
	req = testRequest()
	req.Temperature = ptr(3.0)
	if r := generate(context.Background(), b, req); inference.CodeOf(r.err) != inference.CodeInvalidRequest {
		t.Errorf("temperature 3: error %v, want invalid_request", r.err)
	}
	if n := contacted.Load(); n != 0 {
		t.Errorf("upstream received %d requests, want none", n)
	}
}

// The caller's deadline ends a stalled request with an error that wraps it: a timeout.
func TestDeadline(t *testing.T) {
	b := newBackend(t, stalling(t), []string{testModel})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	r := generate(ctx, b, testRequest())
	if !errors.Is(r.err, context.DeadlineExceeded) || inference.CodeOf(r.err) != inference.CodeTimeout {
		t.Errorf("error %v, want one wrapping context.DeadlineExceeded, code timeout", r.err)
	}
}

// Cancelling mid-stream, while the upstream holds the stream open, returns promptly with an
// error wrapping context.Canceled, and the upstream sees the client go.
func TestCancelMidStream(t *testing.T) {
	d := newDispatcher(t)
	serverSawCancel := make(chan struct{})
	d.after = func(ctx context.Context, tok inference.Token) error {
		if tok.Index == 1 {
			<-ctx.Done() // the server holds the stream until the client goes
			close(serverSawCancel)
			return ctx.Err()
		}
		return nil
	}
	b := newBackend(t, serveAPI(t, d).URL, []string{testModel})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan run, 1)
	go func() { // ends when Generate returns; the test waits for it below
		req := testRequest()
		var r run
		r.res, r.err = b.Generate(ctx, &req, func(tok inference.Token) error {
			r.tokens = append(r.tokens, tok)
			if tok.Index == 1 {
				cancel()
			}
			return nil
		})
		done <- r
	}()
	bound := time.NewTimer(5 * time.Second)
	defer bound.Stop()
	select {
	case r := <-done:
		if !errors.Is(r.err, context.Canceled) || len(r.tokens) != 2 {
			t.Errorf("error %v after %d tokens, want one wrapping context.Canceled after 2", r.err, len(r.tokens))
		}
	case <-bound.C:
		t.Fatalf("Generate did not return within 5s of its context being cancelled")
	}
	select {
	case <-serverSawCancel:
	case <-bound.C:
		t.Fatalf("the upstream's request was not cancelled")
	}
}

// The idle clock stops while emit runs: a consumer slower than the idle timeout does not make
// a prompt upstream time out. (Fake time: the stream comes from memory, not the network.)
func TestSlowConsumerIsNotIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		body := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
			"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n" +
			"data: {\"choices\":[{\"delta\":{\"content\":\"c\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
		b, err := upstream.New("http://upstream.invalid", []string{testModel}, fastTimeouts,
			upstream.WithHTTPClient(&http.Client{Transport: bodyTransport(body)}))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		req := testRequest()
		n := 0
		res, err := b.Generate(context.Background(), &req, func(inference.Token) error {
			n++
			time.Sleep(time.Second) // fake time: five idle timeouts' worth of a slow client
			return nil
		})
		if err != nil || n != 3 || res.FinishReason != inference.FinishStop {
			t.Errorf("Generate = %+v, %v after %d tokens; want stop after 3", res, err, n)
		}
	})
}
