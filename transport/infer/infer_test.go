package infer

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

const model = "synth-tiny"

func newHost(t testing.TB) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func connect(t *testing.T, a, b host.Host) {
	t.Helper()
	if err := a.Connect(context.Background(), peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatal(err)
	}
}

func request(maxTokens int) *inference.Request {
	seed := int64(7)
	temp := 0.8
	return &inference.Request{
		Model:       model,
		Messages:    []inference.Message{{Role: "user", Content: "hello mesh"}},
		MaxTokens:   &maxTokens,
		Seed:        &seed,
		Temperature: &temp,
	}
}

type pair struct {
	client *Client
	server *Server
	sh     host.Host
	be     *synth.Backend
}

func newPair(t *testing.T, sopts []ServerOption, copts ...ClientOption) pair {
	t.Helper()
	be, err := synth.New(model)
	if err != nil {
		t.Fatal(err)
	}
	ch, sh := newHost(t), newHost(t)
	srv := NewServer(sh, be, sopts...)
	t.Cleanup(func() { srv.Close() })
	connect(t, ch, sh)
	return pair{client: NewClient(ch, copts...), server: srv, sh: sh, be: be}
}

func collect(toks *[]inference.Token) func(inference.Token) error {
	return func(tk inference.Token) error { *toks = append(*toks, tk); return nil }
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

// Remote tokens are identical to the same backend serving locally.
func TestRemoteStreamMatchesLocal(t *testing.T) {
	p := newPair(t, nil)
	var local, remote []inference.Token
	lres, err := p.be.Generate(context.Background(), request(24), collect(&local))
	if err != nil {
		t.Fatal(err)
	}
	rres, err := p.client.Generate(context.Background(), p.sh.ID(), request(24), collect(&remote))
	if err != nil {
		t.Fatal(err)
	}
	if len(local) == 0 || len(local) != len(remote) {
		t.Fatalf("local %d tokens, remote %d", len(local), len(remote))
	}
	for i := range local {
		if local[i] != remote[i] {
			t.Fatalf("token %d: local %+v remote %+v", i, local[i], remote[i])
		}
	}
	if lres != rres {
		t.Fatalf("result local %+v remote %+v", lres, rres)
	}
	waitFor(t, "server to count the request served", func() bool {
		st := p.server.Stats()
		return st.Served == 1 && st.InFlight == 0
	})
}

func TestTypedErrorsCrossTheWire(t *testing.T) {
	p := newPair(t, nil)
	bad := request(8)
	bad.Model = "no-such-model"
	_, err := p.client.Generate(context.Background(), p.sh.ID(), bad, collect(new([]inference.Token)))
	if inference.CodeOf(err) != inference.CodeModelNotFound {
		t.Fatalf("unknown model: %v, want model_not_found", err)
	}
	invalid := request(8)
	invalid.Messages = nil
	_, err = p.client.Generate(context.Background(), p.sh.ID(), invalid, collect(new([]inference.Token)))
	if inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Fatalf("no messages: %v, want invalid_request", err)
	}
}

func TestAdmissionRefusal(t *testing.T) {
	paused := func(peer.ID) error { return inference.Errorf(inference.CodePolicyPaused, "on battery") }
	p := newPair(t, []ServerOption{WithAdmission(paused)})
	_, err := p.client.Generate(context.Background(), p.sh.ID(), request(8), collect(new([]inference.Token)))
	if inference.CodeOf(err) != inference.CodePolicyPaused {
		t.Fatalf("err %v, want policy_paused", err)
	}
}

// blocking is a generator that emits one token and then waits for its context.
type blocking struct{ started chan struct{} }

func (b blocking) Generate(ctx context.Context, _ *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	if err := emit(inference.Token{Index: 0, Text: "x", ID: 1}); err != nil {
		return inference.Result{}, err
	}
	b.started <- struct{}{}
	<-ctx.Done()
	return inference.Result{}, ctx.Err()
}

// blockingServer serves a blocking generator (room for n starts) on a new host, connected
// from a new client host. The server closes at cleanup, before the hosts (Close is
// idempotent).
func blockingServer(t *testing.T, n int, opts ...ServerOption) (ch, sh host.Host, gen blocking, srv *Server) {
	t.Helper()
	ch, sh = newHost(t), newHost(t)
	gen = blocking{started: make(chan struct{}, n)}
	srv = NewServer(sh, gen, opts...)
	t.Cleanup(func() { srv.Close() })
	connect(t, ch, sh)
	return ch, sh, gen, srv
}

func TestOverAdmissionIsRefusedAtOnce(t *testing.T) {
	ch, sh, gen, srv := blockingServer(t, 8, WithMaxInFlight(2, 2))
	c := NewClient(ch)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := c.Generate(ctx, sh.ID(), request(8), func(inference.Token) error { return nil })
			done <- err
		}()
	}
	<-gen.started
	<-gen.started
	began := time.Now()
	_, err := c.Generate(context.Background(), sh.ID(), request(8), collect(new([]inference.Token)))
	if inference.CodeOf(err) != inference.CodeOverloaded {
		t.Fatalf("third request: %v, want overloaded", err)
	}
	t.Logf("overloaded answer in %v", time.Since(began))
	cancel()
	for range 2 {
		<-done
	}
	waitFor(t, "slots released", func() bool { return srv.Stats().InFlight == 0 })
}

// A cancelled request stops the server's generation, and its stream is reset, not pooled.
func TestClientCancelStopsServer(t *testing.T) {
	ch, sh, gen, srv := blockingServer(t, 1)
	c := NewClient(ch)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Generate(ctx, sh.ID(), request(8), func(inference.Token) error { return nil })
		errc <- err
	}()
	<-gen.started
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client err %v, want context.Canceled", err)
	}
	// The blocking generator returns only when its context ends: the reset reached it.
	waitFor(t, "server to see the disconnect and drop the stream", func() bool {
		st := srv.Stats()
		return st.ClientDisconnected == 1 && st.InFlight == 0 && openStreams(sh, ch.ID(), ReuseID) == 0
	})
	if n := c.pooledTo(sh.ID()); n != 0 {
		t.Errorf("client pool: %d streams after a cancelled request, want 0", n)
	}
}

// silent accepts the request and then says nothing (a hung or SIGSTOPped peer): the
// first-token timeout ends the wait, not the (here longer) inter-token one.
func TestSilentPeerTimesOut(t *testing.T) {
	ch, sh := newHost(t), newHost(t)
	release := make(chan struct{})
	defer close(release)
	sh.SetStreamHandler(ID, func(s network.Stream) {
		<-release
		s.Reset()
	})
	connect(t, ch, sh)
	const interToken = time.Minute
	c := NewClient(ch, WithTimeouts(300*time.Millisecond, interToken))
	start := time.Now()
	_, err := c.Generate(context.Background(), sh.ID(), request(8), collect(new([]inference.Token)))
	if took := time.Since(start); inference.CodeOf(err) != inference.CodeTimeout || took >= interToken {
		t.Fatalf("err %v after %v, want timeout at the first-token timeout", err, took)
	}
}

// A peer frozen mid-stream (its connection open, its backend stopped at a token: a hung
// process, SIGSTOP) gives timeout at the inter-token timeout, not the (here much longer)
// first-token one, with the tokens before it delivered; the client's reset then cancels
// the peer's generation.
func TestFrozenPeerMidStreamTimesOut(t *testing.T) {
	const firstToken, interToken, frozenAt = time.Minute, 200 * time.Millisecond, 5
	be, err := synth.New(model)
	if err != nil {
		t.Fatal(err)
	}
	ch, sh := newHost(t), newHost(t)
	srv := NewServer(sh, paced{Backend: be, before: map[int]time.Duration{frozenAt: forever}})
	t.Cleanup(func() { srv.Close() })
	connect(t, ch, sh)
	c := NewClient(ch, WithTimeouts(firstToken, interToken))
	var toks []inference.Token
	var last time.Time
	req := request(24)
	req.Stream = true
	_, err = c.Generate(t.Context(), sh.ID(), req, func(tok inference.Token) error {
		toks, last = append(toks, tok), time.Now()
		return nil
	})
	if inference.CodeOf(err) != inference.CodeTimeout || len(toks) != frozenAt {
		t.Fatalf("err %v after %d tokens, want timeout after %d", err, len(toks), frozenAt)
	}
	if since := time.Since(last); since < interToken || since >= firstToken {
		t.Fatalf("timeout %v after the last token, want the inter-token timeout %v", since, interToken)
	}
	waitFor(t, "the peer to see the client gone", func() bool {
		st := srv.Stats()
		return st.ClientDisconnected == 1 && st.InFlight == 0
	})
}

// A peer that dies mid-stream gives peer_lost, never a hang.
func TestPeerLostMidStream(t *testing.T) {
	ch, sh := newHost(t), newHost(t)
	got2 := make(chan struct{})
	sh.SetStreamHandler(ID, func(s network.Stream) {
		frame.NewReader(s, MaxRequestFrame).Next()
		frame.Write(s, encodeToken(nil, inference.Token{Index: 0, Text: "a", ID: 3}))
		frame.Write(s, encodeToken(nil, inference.Token{Index: 1, Text: "b", ID: 4}))
		<-got2 // the peer dies after the client has the first two tokens
		s.Conn().Close()
	})
	connect(t, ch, sh)
	var toks []inference.Token
	_, err := NewClient(ch).Generate(context.Background(), sh.ID(), request(8), func(tk inference.Token) error {
		toks = append(toks, tk)
		if len(toks) == 2 {
			close(got2)
		}
		return nil
	})
	if inference.CodeOf(err) != inference.CodePeerLost || len(toks) != 2 {
		t.Fatalf("err %v after %d tokens, want peer_lost after 2", err, len(toks))
	}
}

func TestProtocolViolationsGivePeerLost(t *testing.T) {
	cases := map[string][][]byte{
		"index gap":          {encodeToken(nil, inference.Token{Index: 1, Text: "a"})},
		"empty token text":   {{frameToken, 0x00, 0x00}},
		"bad finish reason":  {append([]byte{frameDone}, `{"finish_reason":"maybe"}`...)},
		"unknown frame type": {{0x7f}},
		"oversized frame":    {bytes.Repeat([]byte{frameToken}, maxFrame+1)},
		"no terminal frame":  {encodeToken(nil, inference.Token{Index: 0, Text: "a"})},
	}
	for name, frames := range cases {
		ch, sh := newHost(t), newHost(t)
		sh.SetStreamHandler(ID, func(s network.Stream) {
			frame.NewReader(s, MaxRequestFrame).Next()
			for _, f := range frames {
				frame.Write(s, f)
			}
			s.Close()
		})
		connect(t, ch, sh)
		_, err := NewClient(ch).Generate(context.Background(), sh.ID(), request(8), collect(new([]inference.Token)))
		if inference.CodeOf(err) != inference.CodePeerLost {
			t.Errorf("%s: err %v, want peer_lost", name, err)
		}
	}
}

// An oversized request frame is refused after reading the length alone, and recorded in the
// sender's score as a malformed frame; the honest request that follows on another stream is
// served.
func TestServerRefusesOversizedRequest(t *testing.T) {
	var seen observed
	p := newPair(t, []ServerOption{WithServerObserver(&seen)})
	ch := newHost(t)
	connect(t, ch, p.sh)
	st, err := ch.NewStream(context.Background(), p.sh.ID(), ID)
	if err != nil {
		t.Fatal(err)
	}
	huge := make([]byte, MaxRequestFrame+1)
	huge[0] = frameRequest
	frame.Write(st, huge)
	if _, err := frame.NewReader(st, maxFrame).Next(); err == nil {
		t.Fatal("server answered an oversized request frame")
	}
	waitFor(t, "protocol error counted", func() bool { return p.server.Stats().ProtocolErrors == 1 })
	if got := seen.events(); len(got) != 1 || got[0] != ch.ID().String()+" malformed_frame" {
		t.Fatalf("observed %q, want one malformed_frame of the sender %s", got, ch.ID())
	}
	var toks []inference.Token
	if _, err := p.client.Generate(context.Background(), p.sh.ID(), request(4), collect(&toks)); err != nil {
		t.Fatal("honest request after the oversized one:", err)
	}
}

func TestShutdownEndsGenerations(t *testing.T) {
	ch, sh, gen, srv := blockingServer(t, 1)
	errc := make(chan error, 1)
	go func() {
		_, err := NewClient(ch).Generate(context.Background(), sh.ID(), request(8), func(inference.Token) error { return nil })
		errc <- err
	}()
	<-gen.started
	srv.Close()
	if err := <-errc; inference.CodeOf(err) != inference.CodeShuttingDown {
		t.Fatalf("err %v, want shutting_down", err)
	}
}

// replaySeen is a backend that notes the replay of each request it serves.
type replaySeen struct {
	inference.Backend
	seen chan []int
}

func (r replaySeen) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	r.seen <- req.Replay
	return r.Backend.Generate(ctx, req, emit)
}

// A request that continues a cut stream carries its replay to the server's backend, which
// answers with the whole completion from index 0, identical to an uninterrupted run, and
// says it replayed them (Result.Replayed); a replay the server's checks refuse is an
// invalid_request error.
func TestReplayCrossesTheWire(t *testing.T) {
	be, err := synth.New(model)
	if err != nil {
		t.Fatal(err)
	}
	seen := replaySeen{Backend: be, seen: make(chan []int, 4)}
	ch, sh := newHost(t), newHost(t)
	srv := NewServer(sh, seen)
	t.Cleanup(func() { srv.Close() })
	connect(t, ch, sh)
	client := NewClient(ch)

	var local []inference.Token
	if _, err := be.Generate(context.Background(), request(24), collect(&local)); err != nil {
		t.Fatal(err)
	}
	req := request(24)
	for _, tok := range local[:10] {
		req.Replay = append(req.Replay, tok.ID)
	}
	var remote []inference.Token
	res, err := client.Generate(context.Background(), sh.ID(), req, collect(&remote))
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != len(req.Replay) {
		t.Fatalf("the server replayed %d tokens, the client says %d", len(req.Replay), res.Replayed)
	}
	if got := <-seen.seen; !slices.Equal(got, req.Replay) {
		t.Fatalf("the server's backend saw replay %v, want %v", got, req.Replay)
	}
	if !slices.Equal(remote, local) {
		t.Fatalf("replayed stream:\n%+v\nuninterrupted:\n%+v", remote, local)
	}

	req.Replay = []int{-1}
	if _, err := client.Generate(context.Background(), sh.ID(), req, collect(&remote)); inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Fatalf("replaying id -1: %v, want invalid_request", err)
	}
}

// claimsReplayed is a backend whose results claim to have replayed n tokens, whatever it
// was asked to replay.
type claimsReplayed struct {
	inference.Backend
	n int
}

func (c claimsReplayed) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	res, err := c.Backend.Generate(ctx, req, emit)
	res.Replayed = c.n
	return res, err
}

// A peer's Replayed is held to the tokens it was asked to replay: the executor times its
// prefill by it, and a peer must not make its prefill look longer than it was.
func TestReplayedHeldToTheReplay(t *testing.T) {
	be, err := synth.New(model)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	if _, err := be.Generate(context.Background(), request(8), func(tok inference.Token) error {
		ids = append(ids, tok.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ch, sh := newHost(t), newHost(t)
	srv := NewServer(sh, claimsReplayed{Backend: be, n: 1000})
	t.Cleanup(func() { srv.Close() })
	connect(t, ch, sh)
	client := NewClient(ch)
	for _, replay := range [][]int{nil, ids[:1], ids[:3]} {
		req := request(8)
		req.Replay = replay
		res, err := client.Generate(context.Background(), sh.ID(), req, func(inference.Token) error { return nil })
		if err != nil || res.Replayed != len(replay) {
			t.Fatalf("asked to replay %d tokens, the peer claims 1000: the client says %d (err %v)", len(replay), res.Replayed, err)
		}
	}
}

// A replay that would push a request frame past MaxRequestFrame is left out: the frame
// stays within its bound and the server generates the tokens again.
func TestReplayLeftOutOfAFullFrame(t *testing.T) {
	req := request(4000)
	req.Messages[0].Content = strings.Repeat("x", MaxRequestFrame-1000)
	req.Replay = make([]int, 3000)
	for i := range req.Replay {
		req.Replay[i] = 1000 + i
	}
	body, err := EncodeRequest(req, false)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := decodeRequest(body)
	if len(body) > MaxRequestFrame || err != nil || got.Replay != nil {
		t.Fatalf("frame of %d bytes (bound %d), err %v, replay of %d ids", len(body), MaxRequestFrame, err, len(got.Replay))
	}
	req.Messages[0].Content = "short"
	if body, err = EncodeRequest(req, false); err != nil {
		t.Fatal(err)
	}
	if got, _, err = decodeRequest(body); err != nil || !slices.Equal(got.Replay, req.Replay) {
		t.Fatalf("a frame with room lost its replay: err %v, %d ids", err, len(got.Replay))
	}
}

// A peer whose address accepts connections and then says nothing (a peer that left, behind
// an address that no longer answers, as a dial sees it) gives unavailable at the open
// timeout, not whenever libp2p's dial timeouts (here a minute) or the caller give up.
func TestUnreachablePeerIsUnavailableAtOpenTimeout(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() { // accepts and holds every connection until the listener closes
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	ch, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay(),
		libp2p.WithDialTimeout(time.Minute), libp2p.SwarmOpts(swarm.WithDialTimeoutLocal(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	gone := newHost(t)
	addr, err := manet.FromNetAddr(silent.Addr())
	if err != nil {
		t.Fatal(err)
	}
	ch.Peerstore().AddAddr(gone.ID(), addr, time.Hour)
	gone.Close()

	const open = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := NewClient(ch, WithOpenTimeout(open))
	_, err = c.Generate(ctx, gone.ID(), request(8), collect(new([]inference.Token)))
	if inference.CodeOf(err) != inference.CodeUnavailable || ctx.Err() != nil {
		t.Fatalf("err %v (caller's context: %v), want unavailable at the %v open timeout", err, ctx.Err(), open)
	}
}
