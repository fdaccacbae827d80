package client_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/gateway/client"
)

// Over WebSocket Chat streams the same tokens and result as over REST and as the backend
// itself, for concurrent calls sharing one connection.
func TestChatWebSocketMatchesREST(t *testing.T) {
	co := startCoordinator(t, fixtureOptions{})
	ws := co.newClient(t, co.key)
	rest := co.newClient(t, co.key, client.WithForceREST())
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			want, ref := reference(t, int64(i), 12+i)
			for _, tc := range []struct {
				c         *client.Client
				transport string
			}{{ws, client.TransportWebSocket}, {rest, client.TransportREST}} {
				col := &collector{t: t}
				res, err := tc.c.Chat(context.Background(), chatBody(int64(i), 12+i), col.on)
				if err != nil {
					t.Errorf("%s %d: %v", tc.transport, i, err)
					return
				}
				col.check(res, want, ref, tc.transport)
			}
		})
	}
	wg.Wait()
	if u := co.usage(t); u.Requests != 2*n || u.Completed != 2*n {
		t.Fatalf("usage %+v, want %d requests completed", u, 2*n)
	}
}

// Against a coordinator without the WebSocket endpoint, Chat falls back to REST.
func TestChatFallsBackToREST(t *testing.T) {
	co := startCoordinator(t, fixtureOptions{noWebSocket: true})
	c := co.newClient(t, co.key)
	want, ref := reference(t, 3, 16)
	for range 2 {
		col := &collector{t: t}
		res, err := c.Chat(context.Background(), chatBody(3, 16), col.on)
		if err != nil {
			t.Fatal(err)
		}
		col.check(res, want, ref, client.TransportREST)
	}
	t.Logf("figure F16: without the WebSocket endpoint every request served over REST, identical to the reference")
}

// A missing, unknown or revoked key is refused with 401, over WebSocket and over REST, and
// nothing runs.
func TestChatRefusesBadKeys(t *testing.T) {
	co := startCoordinator(t, fixtureOptions{})
	revoked, _, err := co.ks.Create("bob", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := co.ks.Revoke("bob", time.Now()); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{
		"missing": "",
		"unknown": gateway.KeyPrefix + strings.Repeat("a", gateway.KeyLen-len(gateway.KeyPrefix)),
		"revoked": revoked,
	}
	for name, key := range keys {
		for _, opts := range [][]client.Option{nil, {client.WithForceREST()}} {
			_, err := co.newClient(t, key, opts...).Chat(context.Background(), chatBody(1, 4), nil)
			var e *client.Error
			if !errors.As(err, &e) || e.Status != 401 || e.Code != "invalid_api_key" || e.Message == "" {
				t.Fatalf("%s key (%d options): %v", name, len(opts), err)
			}
		}
	}
	if n := co.d.calls.Load(); n != 0 {
		t.Fatalf("%d requests ran with bad keys", n)
	}
}

// When pongs stop, the client declares the connection dead after exactly three missed pongs,
// reconnects, and resubmits the request in flight, which completes once.
//
// The test ticks each connection's ping clock by hand: with a real ticker the second
// connection, too, was declared dead whenever a loaded machine took longer than three ping
// intervals to answer (2 resubmits: 5 runs in 100 with -cpu 1 beside CPU burners).
func TestKeepaliveThreeMissedPongs(t *testing.T) {
	var (
		mu      sync.Mutex
		pings   = map[uint64]int{}
		closed  = make(chan uint64, 8)
		secondP = make(chan struct{}, 1)
	)
	g := newGate()
	co := startCoordinator(t, fixtureOptions{hold: g.hold, hooks: gateway.WSTestHooks{
		DropPing: func(conn uint64, _ int64) bool {
			mu.Lock()
			pings[conn]++
			mu.Unlock()
			if conn == 1 {
				return true // the first connection goes silent
			}
			select {
			case secondP <- struct{}{}:
			default:
			}
			return false
		},
		Closed: func(conn uint64) { closed <- conn },
	}})
	clocks := make(chan chan time.Time, 8) // each connection's ping clock, in order
	// No lost timeout either: how soon the redial succeeds is the machine's speed too.
	c := co.newClient(t, co.key, client.WithPingTicks(func() <-chan time.Time {
		ch := make(chan time.Time)
		clocks <- ch
		return ch
	}), client.WithLostTimeout(time.Hour), client.WithRand(rand.New(rand.NewPCG(1, 2))))
	want, ref := reference(t, 4, 20)
	type outcome struct {
		res client.Result
		err error
		col *collector
	}
	out := make(chan outcome, 1)
	go func() {
		col := &collector{t: t}
		res, err := c.Chat(context.Background(), chatBody(4, 20), col.on)
		out <- outcome{res, err, col}
	}()
	<-g.started // in flight on connection 1, held: nothing but pongs could come back
	first := <-clocks
	for range 4 { // three pings, each left unanswered; at the fourth tick the connection is dead
		first <- time.Time{}
	}
	if conn := <-closed; conn != 1 {
		t.Fatalf("connection %d closed first", conn)
	}
	mu.Lock()
	missed := pings[1]
	mu.Unlock()
	if missed != 3 {
		t.Fatalf("the client gave up on its connection after %d unanswered pings, want 3", missed)
	}
	second := <-clocks // reconnected
	second <- time.Time{}
	<-secondP // and the new connection is kept alive
	close(g.open)
	o := <-out
	if o.err != nil {
		t.Fatal(o.err)
	}
	o.col.check(o.res, want, ref, client.TransportWebSocket)
	if o.res.Resubmits != 1 || co.d.calls.Load() != 1 {
		t.Fatalf("%d resubmits, %d runs; want 1 and 1", o.res.Resubmits, co.d.calls.Load())
	}
	t.Logf("figure F16: pongs stopped: the connection declared dead after 3 missed pongs, the request resubmitted once and completed once")
}

// Over many seeded runs, a connection cut at a random token and the resubmission that
// follows give exactly one completion, identical to the reference, metered once.
func TestResubmissionGivesExactlyOneCompletion(t *testing.T) {
	const runs = 20
	var cutAt atomic.Int64 // the index after which to cut, plus one; 0: no cut armed
	co := startCoordinator(t, fixtureOptions{hooks: gateway.WSTestHooks{
		CutAfterToken: func(_ uint64, _ string, index int) bool {
			armed := cutAt.Load()
			return armed > 0 && int64(index) == armed-1 && cutAt.CompareAndSwap(armed, 0)
		},
	}})
	c := co.newClient(t, co.key, client.WithRand(rand.New(rand.NewPCG(7, 7))))
	want, ref := reference(t, 11, 32)
	rng := rand.New(rand.NewPCG(2026, 7))
	for i := range runs {
		cut := rng.IntN(len(want))
		cutAt.Store(int64(cut) + 1)
		col := &collector{t: t}
		res, err := c.Chat(context.Background(), chatBody(11, 32), col.on)
		if err != nil {
			t.Fatalf("run %d (cut after token %d): %v", i, cut, err)
		}
		if cutAt.Load() != 0 {
			t.Fatalf("run %d: the connection was not cut", i)
		}
		col.check(res, want, ref, client.TransportWebSocket)
		if res.Resubmits != 1 {
			t.Fatalf("run %d (cut after token %d): %d resubmits, want 1", i, cut, res.Resubmits)
		}
	}
	u := co.usage(t)
	if u.Requests != runs || u.Completed != runs || u.TokensOut != int64(runs*ref.Usage.CompletionTokens) || co.d.calls.Load() != runs {
		t.Fatalf("usage %+v and %d runs after %d requests of %d tokens: each must be metered once",
			u, co.d.calls.Load(), runs, ref.Usage.CompletionTokens)
	}
	t.Logf("figure F16: %d runs cut at a random token: %d completions, each identical and metered once (0 duplicates)", runs, u.Completed)
}

// peer_lost or unavailable before any token is retried once, over either transport; a
// second failure is returned.
func TestRetryOnceBeforeFirstToken(t *testing.T) {
	for _, code := range []inference.Code{inference.CodePeerLost, inference.CodeUnavailable} {
		for _, failures := range []int64{1, 2} {
			co := startCoordinator(t, fixtureOptions{hold: func(_ context.Context, call int64) error {
				if call <= failures {
					return inference.Errorf(code, "test failure %d", call)
				}
				return nil
			}})
			want, ref := reference(t, 5, 8)
			for _, opts := range [][]client.Option{nil, {client.WithForceREST()}} {
				co.d.calls.Store(0)
				col := &collector{t: t}
				res, err := co.newClient(t, co.key, opts...).Chat(context.Background(), chatBody(5, 8), col.on)
				name := fmt.Sprintf("%s ×%d over %d options", code, failures, len(opts))
				if failures == 1 {
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					col.check(res, want, ref, res.Transport)
					if res.Resubmits != 1 {
						t.Fatalf("%s: %d resubmits", name, res.Resubmits)
					}
				} else {
					var e *client.Error
					if !errors.As(err, &e) || e.Code != string(code) {
						t.Fatalf("%s: %v", name, err)
					}
				}
				if n := co.d.calls.Load(); n != 2 {
					t.Fatalf("%s: %d runs, want 2", name, n)
				}
			}
		}
	}
}

// A request the coordinator refuses is returned as its error, without a retry.
func TestChatReturnsRefusal(t *testing.T) {
	co := startCoordinator(t, fixtureOptions{})
	body := chatBody(1, 4)
	body["model"] = "no-such-model"
	for _, opts := range [][]client.Option{nil, {client.WithForceREST()}} {
		_, err := co.newClient(t, co.key, opts...).Chat(context.Background(), body, nil)
		var e *client.Error
		if !errors.As(err, &e) || e.Code != string(inference.CodeModelNotFound) {
			t.Fatalf("%d options: %v", len(opts), err)
		}
	}
	if _, err := co.newClient(t, co.key).Chat(context.Background(), []int{1}, nil); err == nil {
		t.Fatal("a body that is not an object was sent")
	}
}

// Cancelling a call's context ends it and cancels it on the coordinator; Close ends calls in
// flight with ErrClosed and every goroutine of the client (TestMain checks).
func TestCancelAndClose(t *testing.T) {
	g := newGate()
	defer close(g.open)
	co := startCoordinator(t, fixtureOptions{hold: g.hold})
	c := co.newClient(t, co.key)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Chat(ctx, chatBody(1, 4), nil)
		errc <- err
	}()
	<-g.started
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	if cause := <-g.ended; inference.CodeOf(cause) != inference.CodeUnavailable {
		t.Fatalf("the coordinator's run ended with %v", cause)
	}
	go func() {
		_, err := c.Chat(context.Background(), chatBody(2, 4), nil)
		errc <- err
	}()
	<-g.started
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, client.ErrClosed) {
		t.Fatalf("call in flight at Close: %v", err)
	}
	if _, err := c.Chat(context.Background(), chatBody(1, 4), nil); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("call after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// An unreachable gateway fails the first call at once instead of retrying forever.
func TestUnreachableFailsFast(t *testing.T) {
	co := startCoordinator(t, fixtureOptions{})
	c := client.New("http://127.0.0.1:1", co.key, client.WithHTTPClient(co.hc))
	defer c.Close()
	if _, err := c.Chat(context.Background(), chatBody(1, 4), nil); err == nil {
		t.Fatal("a call to a closed port succeeded")
	}
}

// A client pointed at another machine over plain http:// sends nothing (no connection is
// even tried) unless WithPlainHTTP says the network is trusted: the key would travel in the
// clear (issue 19).
func TestPlainHTTPKeyRefused(t *testing.T) {
	c := client.New("http://coordinator.invalid:9337", "msk_live_secret")
	defer c.Close()
	if _, err := c.Chat(context.Background(), map[string]any{"model": "synth-tiny"}, nil); !errors.Is(err, gateway.ErrPlainHTTPKey) {
		t.Fatalf("Chat over plain http to another machine: %v, want ErrPlainHTTPKey", err)
	}
}
