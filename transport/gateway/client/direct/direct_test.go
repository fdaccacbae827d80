package direct_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/gateway/client/direct"
	"github.com/meshinfer/meshinfer/transport/infer"
	"github.com/meshinfer/meshinfer/transport/webrtc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const model = "synth-tiny"

func startNode(t *testing.T, cfg node.Config) *node.Node {
	t.Helper()
	id, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Identity, cfg.Loopback = id, true
	if len(cfg.ListenAddrs) == 0 {
		cfg.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	cfg.ConsoleAddr, cfg.APIAddr = node.ConsoleOff, "127.0.0.1:0"
	cfg.Consent = &participation.Consent{Version: participation.ConsentVersion, RunLocal: true, Contribute: true}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	return n
}

// mesh is a coordinator that serves no model, with one API key, and two peers serving
// model that joined through it and accept WebRTC set-ups (direct tasks).
type mesh struct {
	coord *node.Node
	peers []*node.Node
	dirs  []string // the peers' data dirs
	dir   string
	key   string
}

func startMesh(t *testing.T, verify float64) *mesh {
	t.Helper()
	return startMeshWith(t, verify, nil, 2)
}

// startMeshWrapped is startMesh with the peers' backends wrapped by wrap (nil: as they are).
func startMeshWrapped(t *testing.T, verify float64, wrap func(inference.Backend) inference.Backend) *mesh {
	t.Helper()
	return startMeshWith(t, verify, wrap, 2)
}

// TestDirectTasksGoToAcceptingPeers: with one of two serving peers taking direct tasks,
// every direct task goes to it.
func TestDirectTasksGoToAcceptingPeers(t *testing.T) {
	m := startMeshAccepting(t, node.VerifyOff, 1)
	for i := range 6 {
		res, err := direct.Chat(context.Background(), "http://"+m.coord.APIAddr(), m.key, chatBody(int64(i), 4), direct.Options{})
		if err != nil {
			t.Fatalf("direct task %d: %v", i, err)
		}
		if want := "peer:" + m.peers[0].ID().String(); res.Peer != want || res.Usage.CompletionTokens != 4 {
			t.Fatalf("direct task %d served by %s with %d tokens, want %s (the accepting peer) with 4", i, res.Peer, res.Usage.CompletionTokens, want)
		}
	}
}

// startMeshAccepting is startMesh with only the first accepting peers taking WebRTC
// set-ups (direct tasks).
func startMeshAccepting(t *testing.T, verify float64, accepting int) *mesh {
	t.Helper()
	return startMeshWith(t, verify, nil, accepting)
}

// startMeshWith starts the coordinator and two serving peers, their backends wrapped by
// wrap (nil: as they are), the first accepting of them taking WebRTC set-ups.
func startMeshWith(t *testing.T, verify float64, wrap func(inference.Backend) inference.Backend, accepting int) *mesh {
	t.Helper()
	m := &mesh{dir: t.TempDir()}
	ks, err := gateway.OpenKeys(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.key, _, err = ks.Create("direct", time.Now()); err != nil {
		t.Fatal(err)
	}
	// Verification voters must be on hosts apart: each peer listens (and dials) on a
	// loopback address of its own. They may vote as soon as they are connected: known at
	// all (1 ns), any score not excluded.
	m.coord = startNode(t, node.Config{DataDir: m.dir, Roles: []node.Role{node.RoleCoordinator}, VerifySample: verify,
		VoterMinKnown: time.Nanosecond, VoterMinScore: reputation.ExcludeBelow})
	for i := range 2 {
		m.dirs = append(m.dirs, t.TempDir())
		m.peers = append(m.peers, startNode(t, node.Config{Models: []string{model}, WrapBackend: wrap, WebRTCAccept: i < accepting,
			ListenAddrs: []string{fmt.Sprintf("/ip4/127.0.0.%d/tcp/0", 2+i)},
			DataDir:     m.dirs[len(m.dirs)-1], Bootstrap: []peer.AddrInfo{m.coord.AddrInfo()}}))
	}
	// Ready for a direct task: the coordinator routes to a peer once it is fresh and
	// contacted, and sends it direct tasks once identify said it takes them; gossip may
	// bring the vector before either on a loaded machine.
	var missing string
	waitFor(t, 20*time.Second, "the coordinator sees every peer", func() bool {
		for i, p := range m.peers {
			e, ok := m.coord.Registry().Get(p.ID(), time.Now())
			ps, err := m.coord.Host().Peerstore().SupportsProtocols(p.ID(), infer.DirectID)
			direct := err == nil && len(ps) > 0
			if !ok || e.Stale || !e.Contacted || i < accepting && !direct {
				missing = fmt.Sprintf("peer %d: known %v, stale %v, contacted %v, takes direct tasks %v", i, ok, e.Stale, e.Contacted, direct)
				return false
			}
		}
		return true
	}, &missing)
	return m
}

// waitFor polls cond until it holds, failing the test after d, with *why[0] (if given)
// saying what was still missing.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool, why ...*string) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			if len(why) > 0 {
				what += " (" + *why[0] + ")"
			}
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

func chatBody(seed int64, maxTokens int) map[string]any {
	return map[string]any{"model": model, "max_tokens": maxTokens, "seed": seed,
		"messages": []map[string]string{{"role": "user", "content": "what is a mesh?"}}}
}

// reference is what the model itself answers.
func reference(t *testing.T, seed int64, maxTokens int) string {
	t.Helper()
	b, err := synth.New(model)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	req := &inference.Request{Model: model, Seed: &seed, MaxTokens: &maxTokens,
		Messages: []inference.Message{{Role: inference.RoleUser, Content: "what is a mesh?"}}}
	if _, err := b.Generate(context.Background(), req, func(tok inference.Token) error {
		sb.WriteString(tok.Text)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

// A thin client's direct request: the coordinator routes it and relays the WebRTC set-up,
// the tokens come from the serving peer over the data channel (identical to the model's),
// the coordinator serves none of them itself, and it meters the task from the peer's
// receipt, countersigned, with the peer's token count, under the client's device id.
func TestDirectThroughCoordinator(t *testing.T) {
	m := startMesh(t, node.VerifyOff)
	base := "http://" + m.coord.APIAddr()
	const device = "dev_0123456789abcdef0123456789abcdef"
	for i := range 3 {
		want := reference(t, int64(i), 16)
		var streamed strings.Builder
		res, err := direct.Chat(context.Background(), base, m.key, chatBody(int64(i), 16),
			direct.Options{Device: device, OnToken: func(tok inference.Token) { streamed.WriteString(tok.Text) }})
		if err != nil {
			t.Fatalf("direct request %d: %v", i, err)
		}
		if res.Text != want || streamed.String() != want || res.Usage.CompletionTokens == 0 {
			t.Fatalf("direct request %d: %q (streamed %q), want %q", i, res.Text, streamed.String(), want)
		}
		rc, err := receipts.VerifyCountersig(m.coord.ID().String(), res.Receipt, res.Countersig)
		if err != nil || "peer:"+rc.Server != res.Peer || rc.TokensOut != res.Usage.CompletionTokens {
			t.Fatalf("direct request %d: receipt %+v for %s: %v", i, rc, res.Peer, err)
		}
	}
	st := m.coord.Status().Routing
	if st.Direct != 3 || st.Requests.Mesh != 0 || st.Requests.Local != 0 {
		t.Fatalf("coordinator routing %+v: want 3 direct tasks and nothing it served or relayed itself", st)
	}
	served, relayed := 0, 0
	for _, p := range m.peers {
		st := p.Status()
		served += int(st.Inference.Served)
		relayed += int(st.WebRTC.Relayed)
	}
	if served != 3 || relayed != 3 {
		t.Fatalf("peers served %d tasks over %d relayed channels, want 3 and 3", served, relayed)
	}
	// Metered from the receipts: three events, each with the peer's receipt countersigned.
	var events []gateway.MeterEvent
	waitFor(t, 10*time.Second, "three meter events", func() bool {
		events = events[:0]
		gateway.ReadEvents(filepath.Join(m.dir, gateway.UsageFile), func(e gateway.MeterEvent) { events = append(events, e) })
		return len(events) >= 3
	})
	if len(events) != 3 {
		t.Fatalf("%d meter events, want 3", len(events))
	}
	for _, e := range events {
		rc, err := receipts.VerifyCountersig(e.Coordinator, e.Receipt, e.Countersig)
		if err != nil || e.Outcome != gateway.OutcomeCompleted || e.TokensOut != rc.TokensOut || e.TokensOut == 0 || e.Device != device {
			t.Fatalf("meter event %+v: %v (want device %s)", e, err, device)
		}
	}
}

// heldBackend holds every stream before token index at until its context ends: the test
// hangs up while the task is certainly running.
type heldBackend struct {
	inference.Backend
	at int
}

func (b heldBackend) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	return b.Backend.Generate(ctx, req, func(tok inference.Token) error {
		if tok.Index == b.at {
			<-ctx.Done()
			return ctx.Err()
		}
		return emit(tok)
	})
}

// A thin client that hangs up mid-stream on a direct task is metered with the tokens the
// serving peer wrote to its channel and its prompt at the request's bound, as
// client_disconnected; the peer's own record counts the tokens it sent (issue 19, finding
// 4).
func TestDirectHangUpIsMetered(t *testing.T) {
	const received = 4
	m := startMeshWrapped(t, node.VerifyOff, func(b inference.Backend) inference.Backend { return heldBackend{b, received} })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := 0
	_, err := direct.Chat(ctx, "http://"+m.coord.APIAddr(), m.key, chatBody(1, 64), direct.Options{OnToken: func(inference.Token) {
		if got++; got == received {
			cancel() // hang up: the channel and the gateway connection
		}
	}})
	if !errors.Is(err, context.Canceled) || got != received {
		t.Fatalf("hung up after %d tokens: %v, want %d and context.Canceled", got, err, received)
	}
	prompt := (&inference.Request{Messages: []inference.Message{{Role: inference.RoleUser, Content: "what is a mesh?"}}}).PromptTokensBound()
	var events []gateway.MeterEvent
	waitFor(t, 10*time.Second, "the hung-up task metered", func() bool {
		events = events[:0]
		gateway.ReadEvents(filepath.Join(m.dir, gateway.UsageFile), func(e gateway.MeterEvent) { events = append(events, e) })
		return len(events) > 0
	})
	// The peer counts a token once the channel's Write returned; the write that carried the
	// last token may still have been returning when the hang-up reached the peer, so the
	// bill is what was delivered or one token less, never more.
	e := events[0]
	if len(events) != 1 || e.TokensOut > received || e.TokensOut < received-1 || e.TokensIn != prompt || e.Outcome != "client_disconnected" || e.Receipt != "" {
		t.Fatalf("meter events %+v: want one client_disconnected with %d tokens in and %d (or %d) out", events, prompt, received, received-1)
	}
	// The serving peer's log: the task, with the tokens it sent.
	var served []receipts.Receipt
	waitFor(t, 10*time.Second, "the serving peer's receipt", func() bool {
		served = served[:0]
		for _, dir := range m.dirs {
			receipts.Read(filepath.Join(dir, receipts.File), func(r receipts.Receipt, err error) bool {
				if err == nil {
					served = append(served, r)
				}
				return true
			})
		}
		return len(served) > 0
	})
	if r := served[0]; len(served) != 1 || r.TokensOut != e.TokensOut || r.Outcome != "client_disconnected" || r.Requester != m.coord.ID().String() {
		t.Fatalf("serving peer's receipts %+v: want one client_disconnected for the coordinator with %d tokens out", served, received)
	}
}

// A direct task keeps the body's time limit: a task still running at it ends with timeout,
// metered so, and the serving peer ends it too. Privacy local-only, which keeps a request
// on the coordinator, is refused before anything is set up, as is a malformed preference.
func TestDirectPrefs(t *testing.T) {
	// Every stream holds at its third token until its context ends: only the time limit
	// ends the task.
	m := startMeshWrapped(t, node.VerifyOff, func(b inference.Backend) inference.Backend { return heldBackend{b, 2} })
	base := "http://" + m.coord.APIAddr()
	for _, tc := range []struct {
		meshinfer map[string]any
		want      string // in the error
	}{
		{map[string]any{"privacy": "local-only"}, `privacy "local-only" keeps a request on this node`},
		{map[string]any{"privacy": "nearby"}, "privacy"},
		{map[string]any{"timeout": "30"}, "timeout"},
		{map[string]any{"timeout": 30}, "meshinfer object"},
	} {
		body := chatBody(1, 8)
		body["meshinfer"] = tc.meshinfer
		_, err := direct.Chat(context.Background(), base, m.key, body, direct.Options{})
		if inference.CodeOf(err) != inference.CodeInvalidRequest || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("meshinfer %v: %v, want invalid_request naming %q", tc.meshinfer, err, tc.want)
		}
	}
	if st := m.coord.Status().Routing; st.Direct != 0 {
		t.Fatalf("coordinator counted %d direct tasks for refused requests", st.Direct)
	}

	body := chatBody(1, 8)
	body["meshinfer"] = map[string]any{"timeout": "1s"}
	got := 0
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a limit not kept fails, not hangs
	defer cancel()
	_, err := direct.Chat(ctx, base, m.key, body, direct.Options{OnToken: func(inference.Token) { got++ }})
	if inference.CodeOf(err) != inference.CodeTimeout || !strings.Contains(err.Error(), "1s time limit passed") || got != 2 {
		t.Fatalf("held past its 1s time limit: %v after %d tokens, want timeout after 2", err, got)
	}
	var events []gateway.MeterEvent
	waitFor(t, 10*time.Second, "the timed-out task metered", func() bool {
		events = events[:0]
		gateway.ReadEvents(filepath.Join(m.dir, gateway.UsageFile), func(e gateway.MeterEvent) { events = append(events, e) })
		return len(events) > 0
	})
	if e := events[0]; len(events) != 1 || e.Outcome != string(inference.CodeTimeout) || e.TokensOut > 2 || e.Receipt != "" {
		t.Fatalf("meter events %+v: want one timeout with at most 2 tokens out", events)
	}
}

// Direct tasks are verified like any mesh task: against the digest the peer's receipt
// names, by another peer's execution.
func TestDirectTasksAreVerified(t *testing.T) {
	m := startMesh(t, 1)
	base := "http://" + m.coord.APIAddr()
	for i := range 3 {
		if _, err := direct.Chat(context.Background(), base, m.key, chatBody(int64(10+i), 8), direct.Options{}); err != nil {
			t.Fatalf("direct request %d: %v", i, err)
		}
	}
	waitFor(t, 10*time.Second, "three verifications", func() bool {
		v := m.coord.Status().Routing.Verification
		if v.Failed > 0 {
			t.Fatalf("verification %+v: want 3 passed", v)
		}
		return v.Passed == 3
	})
}

// A bad key, or a malformed device id, is refused before anything is set up, saying why.
func TestDirectBadKey(t *testing.T) {
	m := startMesh(t, node.VerifyOff)
	_, err := direct.Chat(context.Background(), "http://"+m.coord.APIAddr(), gateway.KeyPrefix+"nope", chatBody(1, 4), direct.Options{})
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("bad key: %v", err)
	}
	_, err = direct.Chat(context.Background(), "http://"+m.coord.APIAddr(), m.key, chatBody(1, 4), direct.Options{Device: "my laptop"})
	if inference.CodeOf(err) != inference.CodeInvalidRequest || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), gateway.DeviceHeader) {
		t.Fatalf("malformed device: %v, want invalid_request (400) naming %s", err, gateway.DeviceHeader)
	}
	if st := m.coord.Status().Routing; st.Direct != 0 {
		t.Fatalf("coordinator counted %d direct tasks", st.Direct)
	}
}

// With ICE blocked on the client's side, no channel sets up within the timeout: Chat says
// so with ErrNoChannel (so that the caller can use the gateway instead), nothing was
// metered, and nothing is left running.
//
// That Chat gave up at its own 1 s set-up timeout, not the default 5 s one nor the peer's,
// is read from the error (webrtc.ErrSetupTimeout, naming the timeout), not from a stopwatch:
// a bound on the wall-clock time failed on a loaded machine.
func TestDirectNoChannel(t *testing.T) {
	m := startMesh(t, node.VerifyOff)
	se := webrtc.DefaultSettingEngine()
	se.SetIPFilter(func(net.IP) bool { return false })
	const timeout = time.Second
	start := time.Now()
	_, err := direct.Chat(context.Background(), "http://"+m.coord.APIAddr(), m.key, chatBody(1, 4),
		direct.Options{WebRTC: webrtc.RelayConfig{SettingEngine: se, ConnectTimeout: timeout}})
	if !errors.Is(err, direct.ErrNoChannel) || !errors.Is(err, webrtc.ErrSetupTimeout) ||
		!strings.Contains(err.Error(), fmt.Sprintf("(%v)", timeout)) {
		t.Fatalf("ICE blocked: %v, want ErrNoChannel at the %v set-up timeout", err, timeout)
	}
	t.Logf("no channel: gave up after %v (set-up timeout %v)", time.Since(start).Round(time.Millisecond), timeout)
	if st := m.coord.Status().Routing; st.Direct != 0 {
		t.Fatalf("coordinator counted %d direct tasks", st.Direct)
	}
}

// Peers that do not accept WebRTC set-ups (no --webrtc or --webrtc-accept) take no direct
// task: the coordinator cannot open one on them, and the client gets the coordinator's
// error, not a channel; no direct task is counted.
func TestDirectPeersNotAccepting(t *testing.T) {
	m := startMeshAccepting(t, node.VerifyOff, 0)
	_, err := direct.Chat(context.Background(), "http://"+m.coord.APIAddr(), m.key, chatBody(1, 4), direct.Options{})
	if inference.CodeOf(err) != inference.CodeUnavailable || !strings.Contains(err.Error(), "--webrtc-accept") {
		t.Fatalf("direct task on peers not accepting: %v, want unavailable naming --webrtc-accept", err)
	}
	if st := m.coord.Status().Routing; st.Direct != 0 {
		t.Fatalf("coordinator counted %d direct tasks", st.Direct)
	}
	for i, p := range m.peers {
		if w := p.Status().WebRTC; w.Accepting || w.Relayed != 0 {
			t.Fatalf("peer %d's webrtc status %+v: want not accepting, nothing relayed", i, w)
		}
	}
}
