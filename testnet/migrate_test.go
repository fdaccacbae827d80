package testnet

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/node"
)

// A stream cut mid-way goes on as the viability gate picks, from what the router measured:
// with privacy any, and the cloud (a meshinfer API serving the built-in models, which says
// they are deterministic) measured much faster than a peer whose copy of the model is cold,
// the cloud generates the completion again; with privacy mesh, the next peer replays the
// tokens sent. Both streams are identical to an uninterrupted run, and /api/status "migration"
// has both decisions with their inputs and outcome.
func TestGatePicksCloudOrReplay(t *testing.T) {
	gate := newTokenGate()
	tn := start(t, Options{Nodes: 4, NoConsole: true, Heartbeat: time.Second, ModelsFor: serveNothing,
		Cloud: true, CloudLatency: time.Millisecond, CloudModels: []string{"synth-tiny"}, Configure: gate.configure})
	within(t, 15*time.Second, "converge", tn.Converged)
	router := tn.Node(0)

	// The router measures the cloud: latency first, the cloud beats peers whose model is
	// still cold (they load on their first request).
	for i := range 3 {
		r := stream(t, router.APIAddr(), routedBody("synth-tiny", 16, int64(i), map[string]string{"privacy": "any", "priority": "latency"}), nil, nil)
		if r.errCode != "" || r.final.Tier != "cloud" {
			t.Fatalf("warm-up request %d: %+v, want the cloud", i, r)
		}
	}

	const killAt = 4
	for _, tc := range []struct {
		privacy, choice, tier string
	}{
		{"any", "restart_cloud", "cloud"}, // the cloud is last for priority cost: mesh first
		{"mesh", "replay", "mesh"},
	} {
		open := gate.Hold(t, killAt)
		body := routedBody("synth-tiny", 200, 11, map[string]string{"privacy": tc.privacy, "priority": "cost"})
		var killed string
		r := stream(t, router.APIAddr(), body, nil, func(n int, route string) {
			if n == killAt {
				killed = route
				killRoute(t, tn, route)
				open()
			}
		})
		if killed == "" || r.errCode != "" || !r.done {
			t.Fatalf("privacy %s: killed %q, result %+v", tc.privacy, killed, r)
		}
		if want := reference(t, body); r.text() != want {
			t.Fatalf("privacy %s: the stream differs from an uninterrupted run\n got %q\nwant %q", tc.privacy, r.text(), want)
		}
		if r.final.Tier != tc.tier || r.final.Route == killed {
			t.Fatalf("privacy %s: went on at %s (%s), want the %s tier; %+v", tc.privacy, r.final.Route, r.final.Tier, tc.tier, router.Status().Migration)
		}
		m := router.Status().Migration
		last := m.Recent[len(m.Recent)-1]
		if m.Decisions[tc.choice] != 1 || last.Choice != tc.choice || last.Outcome != "completed" ||
			last.Inputs.Generated != killAt || last.Route != r.final.Route || last.TookMS <= 0 {
			t.Fatalf("privacy %s: migration status %+v, want a completed %s after %d tokens", tc.privacy, m, tc.choice, killAt)
		}
		if _, ok := last.OptionsMS["replay"]; !ok {
			t.Fatalf("privacy %s: options %v: a replay on the next peer was possible", tc.privacy, last.OptionsMS)
		}
	}
}

// drainMidStream streams body from the router (node 0) of tn, drains the battery of the
// peer serving it once the client has drainAt tokens (the gate holds the stream there
// until the peer has paused itself), and returns the stream and the drained node.
func drainMidStream(t *testing.T, tn *Testnet, gate *tokenGate, body string, heartbeat time.Duration) (streamResult, int) {
	t.Helper()
	const drainAt = 4
	open := gate.Hold(t, drainAt)
	drained := 0
	r := stream(t, tn.Node(0).APIAddr(), body, nil, func(n int, route string) {
		if n != drainAt {
			return
		}
		defer open()
		for i := 1; i < tn.Len(); i++ {
			if "peer:"+tn.Node(i).ID().String() == route {
				drained = i
			}
		}
		if drained == 0 {
			t.Errorf("token %d from %q, not a peer", n, route)
			return
		}
		// The router probes the serving peer as the attempt starts (a paused peer answers
		// no probe, and the gate needs that leg): the test drains only once it has, rather
		// than racing the probe on a loaded machine.
		nd := tn.Node(drained)
		within(t, 10*time.Second, "the router measures the serving peer's bandwidth", func() bool {
			return measuredBothWays(tn.Node(0), nd)
		})
		if err := drainBattery(tn, drained); err != nil {
			t.Error(err)
		}
		within(t, 3*heartbeat, "the node pauses itself", func() bool {
			return nd.Status().Participation.Admission == "paused"
		})
	})
	if drained == 0 || r.errCode != "" || !r.done {
		t.Fatalf("drained node %d, stream %+v", drained, r)
	}
	if want := reference(t, body); r.text() != want {
		t.Fatalf("the stream differs from an uninterrupted run\n got %q\nwant %q", r.text(), want)
	}
	return r, drained
}

// measuredBothWays reports whether n has measured its bandwidth with p each way.
func measuredBothWays(n, p *node.Node) bool {
	for _, e := range n.Peers() {
		if e.PeerID == p.ID().String() {
			return e.BandwidthMbps != nil && e.BandwidthMbps.Down > 0 && e.BandwidthMbps.Up > 0
		}
	}
	return false
}

// handoverMesh starts a router (node 0, serving nothing) and two peers serving model,
// with simulated batteries, every link from the router capped at kbPerSec KB/s (so that
// the bandwidth probes and transfers are paced by the link, as on a network, and measured),
// and, with cloud, the testnet's stand-in cloud serving synth-tiny (for the router to
// measure it on) and model.
func handoverMesh(t *testing.T, gate *tokenGate, heartbeat time.Duration, model string, kbPerSec int, cloud bool) *Testnet {
	t.Helper()
	tn := start(t, Options{Nodes: 3, NoConsole: true, Heartbeat: heartbeat, Sensors: true, Links: true,
		Cloud: cloud, CloudLatency: time.Millisecond, CloudModels: slices.Compact([]string{"synth-tiny", model}),
		ModelsFor: func(i int) []string {
			if i == 0 {
				return nil
			}
			return []string{model}
		},
		Configure: func(i int, cfg *node.Config) {
			gate.configure(i, cfg)
			cfg.PeerInterTokenTimeout = time.Minute // the test holds the stream while the battery drains
		}})
	if err := tn.Between([]int{0}, []int{1, 2}).Bandwidth(kbPerSec); err != nil {
		t.Fatal(err)
	}
	within(t, 15*time.Second, "converge", tn.Converged)
	for i := 1; i < 3; i++ {
		within(t, 10*time.Second, "every peer accepting", func() bool { a, _ := peerAccepting(tn.Node(0), tn.Node(i)); return a })
	}
	return tn
}

// A peer whose battery drains below the floor mid-generation hands its session over by live
// transfer: it pauses, sends its KV cache on the stream while it keeps generating, stops,
// and the router relays the cache to the other peer, which goes on from it (prefilling
// only the last token) instead of replaying the prompt and the tokens sent. The stream is
// identical to an uninterrupted run, and /api/status "migration" has the live_transfer
// decision, completed, with the source up and the bandwidth measured.
func TestBatteryDrainHandsOverLive(t *testing.T) {
	const heartbeat = 500 * time.Millisecond
	gate := newTokenGate()
	// synth-tiny's cache is 1 KiB a position: moving it beats the gate's replay estimate
	// (500 positions/s) above 0.5 MB/s, and the links are capped at 10 MB/s.
	tn := handoverMesh(t, gate, heartbeat, "synth-tiny", 10_000, false)
	router := tn.Node(0)
	r, drained := drainMidStream(t, tn, gate, routedBody("synth-tiny", 40, 5, nil), heartbeat)
	if moved := tn.Node(drained).Status().Inference.Moved; moved != 1 {
		t.Fatalf("the drained node counts %d generations moved, want 1", moved)
	}
	other := tn.Node(3 - drained)
	if r.final.Route != "peer:"+other.ID().String() {
		t.Fatalf("went on at %s, want the other peer %s", r.final.Route, other.ID())
	}
	resumed := gate.Resumed()
	if len(resumed) != 1 || resumed[0] < 4 || len(gate.Replays()) != 0 {
		t.Fatalf("resumed with %v positions of cache, replays %v: want one resumption from the cache, no replay; %+v", resumed, gate.Replays(), router.Status().Migration)
	}
	m := router.Status().Migration
	if len(m.Recent) == 0 {
		t.Fatalf("no migration decision: %+v", m)
	}
	last := m.Recent[len(m.Recent)-1]
	if m.Decisions["live_transfer"] != 1 || last.Choice != "live_transfer" || last.Outcome != "completed" ||
		!last.Inputs.SourceUp || last.Inputs.KVBytes <= 0 || last.Inputs.BandwidthMbps <= 0 || last.Route != r.final.Route {
		t.Fatalf("migration status %+v, want one completed live_transfer with the source up and the bandwidth measured", m)
	}
	t.Logf("live transfer of %d bytes (%d positions) at %.0f Mbit/s; options %v", last.Inputs.KVBytes, resumed[0], last.Inputs.BandwidthMbps, last.OptionsMS)
}

// Over a slow link (8 Mbit/s from the router to either peer, measured) moving a leaving
// peer's cache would take longer than rebuilding it: the gate, deciding at the handover
// with the source up, stops the source and, with privacy any and the cloud measured
// faster than a peer whose copy of the model is cold (2 s to load, as the router assumes),
// restarts in the cloud; with privacy
// mesh, replays on the other peer. Neither moves the cache; both streams are identical to
// an uninterrupted run.
func TestSlowLinkGatePicksCloudOrReplay(t *testing.T) {
	const heartbeat = 500 * time.Millisecond
	gate := newTokenGate()
	// synth-small's cache is 8 KiB a position: moving it beats the gate's replay estimate
	// (500 positions/s) only above 4 MB/s, and the links are capped at 1 MB/s.
	tn := handoverMesh(t, gate, heartbeat, "synth-small", 1_000, true)
	router := tn.Node(0)
	// The router measures the cloud (its time to first token and rate, whatever the model):
	// with requests for synth-tiny, which only the cloud serves, so that they go there on
	// a slow machine as on a fast one.
	for i := range 3 {
		r := stream(t, router.APIAddr(), routedBody("synth-tiny", 8, int64(i), map[string]string{"privacy": "any"}), nil, nil)
		if r.errCode != "" || r.final.Tier != "cloud" {
			t.Fatalf("warm-up request %d: %+v, want the cloud", i, r)
		}
	}
	for k, tc := range []struct{ privacy, choice, tier string }{
		{"any", "restart_cloud", "cloud"}, // priority cost: the mesh first
		{"mesh", "replay", "mesh"},
	} {
		if k > 0 { // the drained peer charges and comes back, so that both peers serve again
			for i := 1; i < 3; i++ {
				if err := chargeBattery(tn, i); err != nil {
					t.Fatal(err)
				}
			}
			for i := 1; i < 3; i++ {
				within(t, 20*time.Second, "both peers accepting", func() bool { a, _ := peerAccepting(router, tn.Node(i)); return a })
			}
		}
		// A short completion: the cloud's restart (its measured TTFT and rate over all of
		// it) beats a cold peer's replay.
		body := routedBody("synth-small", 12, int64(20+k), map[string]string{"privacy": tc.privacy, "priority": "cost"})
		r, drained := drainMidStream(t, tn, gate, body, heartbeat)
		if r.final.Tier != tc.tier || r.final.Route == "peer:"+tn.Node(drained).ID().String() {
			t.Fatalf("privacy %s: went on at %s (%s), want the %s tier; %+v", tc.privacy, r.final.Route, r.final.Tier, tc.tier, router.Status().Migration)
		}
		m := router.Status().Migration
		last := m.Recent[len(m.Recent)-1]
		live, hasLive := last.OptionsMS["live_transfer"]
		if last.Choice != tc.choice || last.Outcome != "completed" || !last.Inputs.SourceUp || !hasLive ||
			live <= last.EstimateMS || last.Inputs.BandwidthMbps <= 0 || last.Inputs.BandwidthMbps > 16 {
			t.Fatalf("privacy %s: last decision %+v, want a completed %s taken with the source up over a link measured near 8 Mbit/s, live transfer estimated slower", tc.privacy, last, tc.choice)
		}
		if n := len(gate.Resumed()); n != 0 {
			t.Fatalf("privacy %s: %d resumptions from a cache, want none", tc.privacy, n)
		}
		t.Logf("privacy %s: %s at %.1f Mbit/s; options %v", tc.privacy, last.Choice, last.Inputs.BandwidthMbps, last.OptionsMS)
	}
}

// A peer that leaves with notice but dies while its cache moves: the replacement goes on
// from the rows it was sent before the cut, prefilling only the positions it lacks, instead
// of replaying the prompt and the tokens from scratch. The leaving peer's second send of
// rows is held until it is killed, so the cut falls mid-transfer whatever the machine's
// speed (HoldMove bounds the pre-copy to 16 positions a token: the cache of a prompt of
// over 100 positions moves in several sends).
func TestCutMidTransferResumesFromRows(t *testing.T) {
	const heartbeat = 500 * time.Millisecond
	gate := newTokenGate()
	// synth-tiny, 1 KiB a position: moving beats the gate's replay estimate (500
	// positions/s) above 0.5 MB/s, and the links are capped at 10 MB/s. (With synth-small,
	// 8 KiB a position, the line was 4 MB/s, and a probe under -race on a busy machine
	// measured 3.4.)
	tn := handoverMesh(t, gate, heartbeat, "synth-tiny", 10_000, false)
	body := longBody("synth-tiny", 40, 24, 7)
	loaded, release := gate.HoldMove(t)
	killed := make(chan int, 1)
	go func() {
		defer release()
		var n int
		select {
		case n = <-loaded:
		case <-t.Context().Done():
			return
		}
		for i := 1; i < tn.Len(); i++ {
			nd := tn.Node(i)
			if nd.Status().Participation.Admission != "paused" {
				continue
			}
			if moved := nd.Status().Inference.Moved; moved != 0 {
				t.Errorf("the source finished its move (%d) before the second send: the test cut nothing", moved)
			}
			if err := tn.Kill(i); err != nil {
				t.Error(err)
			}
			killed <- n
			return
		}
		t.Error("no paused peer to kill")
	}()
	r, drained := drainMidStream(t, tn, gate, body, heartbeat)
	var first int
	select {
	case first = <-killed:
	default:
		t.Fatalf("the source was not killed mid-transfer: the replacement loaded no rows; resumed %v, replays %v, at %s; %+v",
			gate.Resumed(), gate.Replays(), r.final.Route, tn.Node(0).Status().Migration)
	}
	other := tn.Node(3 - drained)
	if r.final.Route != "peer:"+other.ID().String() {
		t.Fatalf("went on at %s, want the other peer %s", r.final.Route, other.ID())
	}
	resumed, replays := gate.Resumed(), gate.Replays()
	if len(resumed) != 1 || resumed[0] != first || len(replays) != 0 {
		t.Fatalf("resumed with %v positions of cache (first rows %d), replays %v: want one resumption from the first rows, no replay",
			resumed, first, replays)
	}
	m := tn.Node(0).Status().Migration
	last := m.Recent[len(m.Recent)-1]
	if last.Choice != "live_transfer" || last.Outcome != "completed" || last.Route != r.final.Route {
		t.Fatalf("migration status %+v, want the live_transfer decision completed at %s", m, r.final.Route)
	}
	t.Logf("figure M1-cut: source killed mid-transfer; the replacement resumed from the %d positions it had, the stream identical", first)
}

// longBody is routedBody with a user message of words words (synth's tokenizer makes a few
// tokens of each), for a KV cache worth moving.
func longBody(model string, words, maxTokens int, seed int64) string {
	w := make([]string, words)
	for i := range w {
		w[i] = fmt.Sprintf("w%d", i%89)
	}
	b, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": maxTokens, "seed": seed, "temperature": 0.8, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": strings.Join(w, " ")}},
	})
	return string(b)
}

// The replacement of a live handover can be this node: a router that serves the model
// itself, cold, sends the request to a peer whose copy is warm; when that peer's battery
// drains mid-generation, its cache comes to the router, which loads the rows into its own
// backend and goes on from them, with no replay. The stream is identical to an
// uninterrupted run.
func TestHandOverToThisNode(t *testing.T) {
	const heartbeat = 500 * time.Millisecond
	gate := newTokenGate()
	tn := start(t, Options{Nodes: 2, NoConsole: true, Heartbeat: heartbeat, Sensors: true, Links: true,
		ModelsFor: func(int) []string { return []string{"synth-tiny"} },
		Configure: func(i int, cfg *node.Config) {
			gate.configure(i, cfg)
			cfg.PeerInterTokenTimeout = time.Minute // the test holds the stream while the battery drains
		}})
	// synth-tiny's cache is 1 KiB a position: moving it beats a replay above 0.5 MB/s.
	if err := tn.Between([]int{0}, []int{1}).Bandwidth(10_000); err != nil {
		t.Fatal(err)
	}
	within(t, 15*time.Second, "converge", tn.Converged)
	router, peer := tn.Node(0), tn.Node(1)
	// The peer's copy warms up on a request of its own owner; the router's stays cold, so
	// the router sends its request to the peer first and keeps itself as the next target.
	if r := stream(t, peer.APIAddr(), routedBody("synth-tiny", 4, 1, map[string]string{"privacy": "local-only"}), nil, nil); r.errCode != "" || !r.done {
		t.Fatalf("warming the peer: %+v", r)
	}
	within(t, 10*time.Second, "the router sees the peer's model warm", func() bool {
		e, ok := router.Registry().Get(peer.ID(), time.Now())
		if !ok || e.Stale || e.Vector == nil || !e.Vector.Load.Accepting {
			return false
		}
		m := slices.IndexFunc(e.Vector.Models, func(m caps.Model) bool { return m.Name == "synth-tiny" })
		return m >= 0 && e.Vector.Models[m].State == caps.ModelWarm
	})
	body := routedBody("synth-tiny", 40, 5, map[string]string{"privacy": "mesh", "priority": "latency"})
	r, drained := drainMidStream(t, tn, gate, body, heartbeat)
	if drained != 1 || r.final.Tier != "local" {
		t.Fatalf("drained node %d, went on at %s (%s): want node 1, then this node", drained, r.final.Route, r.final.Tier)
	}
	resumed := gate.Resumed()
	if len(resumed) != 1 || resumed[0] < 4 || len(gate.Replays()) != 0 {
		t.Fatalf("resumed with %v positions of cache, replays %v: want one resumption from the cache, no replay", resumed, gate.Replays())
	}
	m := router.Status().Migration
	last := m.Recent[len(m.Recent)-1]
	if last.Choice != "live_transfer" || last.Outcome != "completed" || !last.Inputs.SourceUp || last.Inputs.BandwidthMbps <= 0 {
		t.Fatalf("migration status %+v, want a completed live_transfer with the source up and its leg measured", m)
	}
	t.Logf("live transfer to this node: %d positions at %.0f Mbit/s; options %v", resumed[0], last.Inputs.BandwidthMbps, last.OptionsMS)
}
