package testnet

import (
	"testing"
	"time"
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
