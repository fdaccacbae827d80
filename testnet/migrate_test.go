package testnet

import (
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/participation"
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
		Cloud: true, CloudLatency: time.Millisecond, Configure: gate.configure})
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

// A peer whose battery drains below the floor mid-generation hands its session over by live
// transfer: it pauses, sends its KV cache on the stream while it keeps generating, stops,
// and the router relays the cache to the other peer, which goes on from it (prefilling
// only the last token) instead of replaying the prompt and the tokens sent. The stream is
// identical to an uninterrupted run, and /api/status "migration" has the live_transfer
// decision, completed.
func TestBatteryDrainHandsOverLive(t *testing.T) {
	const heartbeat = 500 * time.Millisecond
	gate := newTokenGate()
	tn := start(t, Options{Nodes: 3, NoConsole: true, Heartbeat: heartbeat, Sensors: true,
		ModelsFor: func(i int) []string {
			if i == 0 {
				return nil
			}
			return []string{"synth-small"}
		},
		Configure: func(i int, cfg *node.Config) {
			gate.configure(i, cfg)
			cfg.PeerInterTokenTimeout = time.Minute // the test holds the stream while the battery drains
		}})
	within(t, 15*time.Second, "converge", tn.Converged)
	router := tn.Node(0)
	for i := 1; i < 3; i++ {
		within(t, 10*time.Second, "every peer accepting", func() bool { a, _ := peerAccepting(router, tn.Node(i)); return a })
	}

	const drainAt = 4
	open := gate.Hold(t, drainAt)
	body := routedBody("synth-small", 40, 5, nil)
	drained := 0
	r := stream(t, router.APIAddr(), body, nil, func(n int, route string) {
		if n != drainAt {
			return
		}
		for i := 1; i < 3; i++ {
			if "peer:"+tn.Node(i).ID().String() == route {
				drained = i
			}
		}
		if drained == 0 {
			t.Errorf("token %d from %q, not a peer", n, route)
			open()
			return
		}
		s := tn.Sensors(drained)
		st := s.State()
		st.BatteryLevel = participation.DefaultBatteryFloor - 5
		if err := s.Set(st); err != nil {
			t.Error(err)
		}
		nd := tn.Node(drained)
		within(t, 3*heartbeat, "the node pauses itself", func() bool {
			return nd.Status().Participation.Admission == "paused"
		})
		open()
	})
	if drained == 0 || r.errCode != "" || !r.done {
		t.Fatalf("drained node %d, stream %+v", drained, r)
	}
	if want := reference(t, body); r.text() != want {
		t.Fatalf("the stream differs from an uninterrupted run\n got %q\nwant %q", r.text(), want)
	}
	other := tn.Node(3 - drained)
	if r.final.Route != "peer:"+other.ID().String() {
		t.Fatalf("went on at %s, want the other peer %s", r.final.Route, other.ID())
	}
	resumed := gate.Resumed()
	if len(resumed) != 1 || resumed[0] < drainAt || len(gate.Replays()) != 0 {
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
