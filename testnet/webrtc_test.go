package testnet

import (
	"context"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"
	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/transport/infer"
	pwebrtc "github.com/meshinfer/meshinfer/transport/webrtc"
)

var viaWebRTC = map[string]string{"transport": "webrtc"}

// A request that asks for WebRTC is served by a peer over a data channel, token for token
// what the libp2p path and the model itself give; the first sets a path up (cold), the next
// reuses it (warm), and the serving peer counts the PeerConnection it accepted. Closing
// the testnet leaves no goroutine behind, pion's included.
func TestWebRTCDispatchMatchesLibp2p(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	tn, err := New(Options{Nodes: 2, NoConsole: true, Heartbeat: time.Second, ModelsFor: serveNothing, WebRTCAccept: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Close()
	within(t, 15*time.Second, "converge", tn.Converged)
	router, server := tn.Node(0), tn.Node(1)
	for i := range 3 {
		body := routedBody("synth-tiny", 24, int64(i), viaWebRTC)
		r := stream(t, router.APIAddr(), body, nil, nil)
		if r.errCode != "" || !r.done || r.final.Route != "peer:"+server.ID().String() {
			t.Fatalf("request %d over WebRTC: %+v", i, r)
		}
		plain := stream(t, router.APIAddr(), routedBody("synth-tiny", 24, int64(i), nil), nil, nil)
		if want := reference(t, body); r.text() != want || plain.text() != want {
			t.Fatalf("request %d: WebRTC %q, libp2p %q, model %q", i, r.text(), plain.text(), want)
		}
	}
	w := router.Status().WebRTC
	if w == nil || w.Dispatched != 3 || w.Fallbacks != 0 || w.ColdSetups != 1 || w.WarmHits != 2 || w.Open != 1 {
		t.Fatalf("router's webrtc status %+v: want 3 dispatched, 1 cold set-up, 2 warm hits, 1 open", w)
	}
	if s := server.Status().WebRTC; s == nil || s.Accepted != 1 {
		t.Fatalf("server's webrtc status %+v: want 1 accepted", s)
	}
	// Both paths went to the same server: 3 requests each.
	if st := server.Status().Inference; st.Served != 6 {
		t.Fatalf("server served %d, want 6", st.Served)
	}
	http.DefaultClient.CloseIdleConnections() // the test's own keep-alive connections
	if err := tn.Close(); err != nil {
		t.Fatal(err)
	}
}

// --webrtc (the node's default transport) sends requests over WebRTC without a per-request
// preference; a request that says libp2p still goes over libp2p.
func TestWebRTCNodeDefault(t *testing.T) {
	tn := start(t, Options{Nodes: 2, NoConsole: true, Heartbeat: time.Second, ModelsFor: serveNothing, WebRTCAccept: true,
		Configure: func(i int, cfg *node.Config) {
			if i == 0 {
				cfg.Prefs.Transport = "webrtc"
			}
		}})
	within(t, 15*time.Second, "converge", tn.Converged)
	router := tn.Node(0)
	if r := stream(t, router.APIAddr(), routedBody("synth-tiny", 8, 1, nil), nil, nil); r.errCode != "" || !r.done {
		t.Fatalf("default transport: %+v", r)
	}
	if r := stream(t, router.APIAddr(), routedBody("synth-tiny", 8, 2, map[string]string{"transport": "libp2p"}), nil, nil); r.errCode != "" || !r.done {
		t.Fatalf("libp2p by request: %+v", r)
	}
	if w := router.Status().WebRTC; w.Dispatched != 1 || w.Fallbacks != 0 {
		t.Fatalf("webrtc status %+v: want exactly the first request dispatched over WebRTC", w)
	}
}

// With ICE blocked (no candidate passes the router's filter), the set-up times out and the
// request goes over libp2p, within the connect timeout plus the request's own time, counted
// as a fallback; the client sees a normal, complete stream.
func TestWebRTCBlockedFallsBackToLibp2p(t *testing.T) {
	const timeout = time.Second
	tn := start(t, Options{Nodes: 2, NoConsole: true, Heartbeat: time.Second, ModelsFor: serveNothing, WebRTCAccept: true,
		Configure: func(i int, cfg *node.Config) {
			if i == 0 {
				se := pwebrtc.DefaultSettingEngine()
				se.SetIPFilter(func(net.IP) bool { return false })
				cfg.WebRTCSettingEngine, cfg.WebRTCConnectTimeout = se, timeout
			}
		}})
	within(t, 15*time.Second, "converge", tn.Converged)
	router := tn.Node(0)
	body := routedBody("synth-tiny", 16, 5, viaWebRTC)
	r := stream(t, router.APIAddr(), body, nil, nil)
	if r.errCode != "" || !r.done || r.text() != reference(t, body) {
		t.Fatalf("blocked ICE: %+v", r)
	}
	// The set-up's timeout, the request itself (well under a second), and slack for -race.
	if r.duration > timeout+3*time.Second {
		t.Fatalf("request took %v with a %v connect timeout", r.duration, timeout)
	}
	if w := router.Status().WebRTC; w.Fallbacks != 1 || w.Dispatched != 0 || w.SetupFailures == 0 {
		t.Fatalf("webrtc status %+v: want one fallback after a failed set-up", w)
	}
	t.Logf("fell back to libp2p; the request took %v", r.duration)
}

// A data channel killed mid-stream (the serving node dies) follows the router's rules for a
// cut stream: the request resumes on another peer and the client gets one contiguous stream
// identical to the model's.
func TestWebRTCChannelKilledMidStream(t *testing.T) {
	gate := newTokenGate()
	tn := start(t, Options{Nodes: 3, NoConsole: true, Heartbeat: time.Second, ModelsFor: serveNothing,
		WebRTCAccept: true, Configure: gate.configure})
	within(t, 15*time.Second, "converge", tn.Converged)
	router := tn.Node(0)
	open := gate.Hold(t, 5) // the serving peer stops after 5 tokens until it is killed
	body := routedBody("synth-tiny", 48, 9, viaWebRTC)
	var killed string
	r := stream(t, router.APIAddr(), body, nil, func(n int, route string) {
		if n != 5 {
			return
		}
		killed = route
		killRoute(t, tn, route)
		open()
	})
	if killed == "" || r.errCode != "" || !r.done || r.final.Route == killed || r.text() != reference(t, body) {
		t.Fatalf("killed %q mid-stream: %+v", killed, r)
	}
	if got := router.Status().Routing.Resumptions; got < 1 {
		t.Fatalf("resumptions %d, want at least 1", got)
	}
}

// A node answers WebRTC signaling only when it accepts WebRTC (node's --webrtc or
// --webrtc-accept). One that does not registers neither the signaling nor the direct-task
// protocol, so a set-up to it fails at once, and a request asking for WebRTC still
// completes over libp2p, counted as a fallback; the node that accepts serves the same
// request over a data channel.
func TestWebRTCOnlyWhenAccepted(t *testing.T) {
	const accepting, refusing = 1, 2
	tn := start(t, Options{Nodes: 3, NoConsole: true, Heartbeat: time.Second,
		ModelsFor: func(i int) []string {
			return [][]string{nil, {"synth-tiny"}, {"synth-small"}}[i]
		},
		Configure: func(i int, cfg *node.Config) { cfg.WebRTCAccept = i == accepting }})
	within(t, 15*time.Second, "converge", tn.Converged)
	router := tn.Node(0)

	for i, want := range map[int]bool{accepting: true, refusing: false} {
		n := tn.Node(i)
		for _, proto := range []protocol.ID{pwebrtc.SignalID, infer.DirectID} {
			if got := slices.Contains(n.Host().Mux().Protocols(), proto); got != want {
				t.Fatalf("node %d registers %s: %v, want %v", i, proto, got, want)
			}
		}
		st, err := router.Host().NewStream(context.Background(), n.ID(), pwebrtc.SignalID)
		if want != (err == nil) {
			t.Fatalf("signaling stream to node %d: %v, want it opened %v", i, err, want)
		}
		if err == nil {
			st.Reset()
		}
		if w := n.Status().WebRTC; w == nil || w.Accepting != want {
			t.Fatalf("node %d's webrtc status %+v: want accepting %v", i, w, want)
		}
	}

	refused := routedBody("synth-small", 16, 3, viaWebRTC)
	r := stream(t, router.APIAddr(), refused, nil, nil)
	if r.errCode != "" || !r.done || r.final.Route != "peer:"+tn.Node(refusing).ID().String() || r.text() != reference(t, refused) {
		t.Fatalf("webrtc request to the node not accepting: %+v", r)
	}
	if w := router.Status().WebRTC; w.Fallbacks != 1 || w.Dispatched != 0 || w.SetupFailures != 1 {
		t.Fatalf("router's webrtc status %+v: want one failed set-up, fallen back to libp2p", w)
	}
	accepted := routedBody("synth-tiny", 16, 4, viaWebRTC)
	r = stream(t, router.APIAddr(), accepted, nil, nil)
	if r.errCode != "" || !r.done || r.final.Route != "peer:"+tn.Node(accepting).ID().String() || r.text() != reference(t, accepted) {
		t.Fatalf("webrtc request to the node accepting: %+v", r)
	}
	if w := router.Status().WebRTC; w.Fallbacks != 1 || w.Dispatched != 1 {
		t.Fatalf("router's webrtc status %+v: want the second request dispatched over WebRTC", w)
	}
	if a, n := tn.Node(accepting).Status().WebRTC, tn.Node(refusing).Status().WebRTC; a.Accepted != 1 || n.Accepted != 0 {
		t.Fatalf("accepted: %d by the node accepting, %d by the other; want 1 and 0", a.Accepted, n.Accepted)
	}
}
