package testnet

import (
	"errors"
	"io/fs"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/node"
)

// drainBattery puts node i's simulated battery below the participation floor, on battery.
func drainBattery(tn *Testnet, i int) error {
	s := tn.Sensors(i)
	st := s.State()
	st.BatteryLevel = participation.DefaultBatteryFloor - 5
	return s.Set(st)
}

// chargeBattery puts node i's simulated battery above the floor, charging.
func chargeBattery(tn *Testnet, i int) error {
	s := tn.Sensors(i)
	st := s.State()
	st.BatteryLevel, st.Charging = participation.DefaultBatteryFloor+20, true
	return s.Set(st)
}

// peerAccepting reports whether observer holds a fresh vector of n that says it accepts work.
func peerAccepting(observer, n *node.Node) (accepting, known bool) {
	e, ok := observer.Registry().Get(n.ID(), time.Now())
	if !ok || e.Stale || e.Vector == nil {
		return false, false
	}
	return e.Vector.Load.Accepting, true
}

// A node whose battery drops below the floor pauses: its peers see it not accepting within
// a heartbeat of its pause, the stream it was serving is handed over and completes
// elsewhere, identical (TestBatteryDrainHandsOverLive has the handover's details), new
// requests go to the other peers, and it comes back after the documented healthy
// heartbeats once charging. The peers serve synth-tiny: none of this depends on the model,
// and synth-small's generation under -race (about 60 ms a token; the stream, its reference
// and the paused phase's requests) cost the test 12 s of its 19.
func TestBatteryDrainPausesAndResumes(t *testing.T) {
	const heartbeat = 500 * time.Millisecond
	gate := newTokenGate()
	tn := start(t, Options{Nodes: 4, NoConsole: true, Heartbeat: heartbeat, Sensors: true,
		ModelsFor: func(i int) []string {
			if i == 0 {
				return nil
			}
			return []string{"synth-tiny"}
		},
		Configure: func(i int, cfg *node.Config) {
			gate.configure(i, cfg)
			// The test holds the stream mid-way on purpose while it drains the battery and
			// watches the pause spread: not a frozen peer, however long that takes.
			cfg.PeerInterTokenTimeout = time.Minute
		}})
	within(t, 15*time.Second, "converge", tn.Converged)
	router := tn.Node(0)
	for i := 1; i < 4; i++ {
		within(t, 10*time.Second, "every peer accepting", func() bool { a, _ := peerAccepting(router, tn.Node(i)); return a })
	}

	// A stream lands on some peer, which stops after its first token until the test has
	// drained that peer's battery and seen it pause: the drain lands mid-stream.
	var drained int
	var pausedAt time.Time
	var seenPaused time.Duration
	open := gate.Hold(t, 1)
	body := routedBody("synth-tiny", 48, 1, nil)
	r := stream(t, router.APIAddr(), body, nil, func(n int, route string) {
		if n != 1 {
			return
		}
		for i := 1; i < 4; i++ {
			if "peer:"+tn.Node(i).ID().String() == route {
				drained = i
			}
		}
		if drained == 0 {
			t.Errorf("first token from %q, not a peer", route)
			return
		}
		if err := drainBattery(tn, drained); err != nil {
			t.Error(err)
			return
		}
		nd := tn.Node(drained)
		within(t, 3*heartbeat, "the node pauses itself", func() bool {
			return nd.Status().Participation.Admission == "paused"
		})
		pausedAt = time.Now()
		if nd.Status().Inference.InFlight == 0 {
			t.Errorf("the stream was no longer in flight when its node paused")
		}
		if reasons := nd.Status().Participation.Reasons; !slices.Contains(reasons, "battery_low") {
			t.Errorf("pause reasons %v, want battery_low", reasons)
		}
		within(t, heartbeat+time.Second, "peers see it not accepting", func() bool {
			a, known := peerAccepting(router, nd)
			return known && !a
		})
		seenPaused = time.Since(pausedAt)
		open()
	})
	if drained == 0 || pausedAt.IsZero() {
		t.Fatalf("no peer drained (stream %+v)", r)
	}
	if r.errCode != "" || !r.done || r.final.Attempts != 2 || r.final.Route == "peer:"+tn.Node(drained).ID().String() {
		t.Fatalf("the stream in flight when its node paused was not handed over to another peer: %+v", r)
	}
	if want := reference(t, body); r.text() != want {
		t.Fatalf("the handed-over stream differs from an uninterrupted run\n got %q\nwant %q", r.text(), want)
	}
	t.Logf("node %d paused; the router saw it %v later", drained, seenPaused)

	nd := tn.Node(drained)
	// The server counts the stream as served just after its last frame leaves.
	within(t, 5*time.Second, "the finished stream leaves the node's in-flight count", func() bool {
		return nd.Status().Inference.InFlight == 0
	})
	servedBefore := nd.Status().Inference.Served
	for i := range 10 {
		resp, c := post(t, router.APIAddr(), chatBody("synth-tiny", 2, false))
		if resp.StatusCode != http.StatusOK || c.Meshinfer.Route == "peer:"+nd.ID().String() {
			t.Fatalf("request %d while node %d is paused: status %d route %s", i, drained, resp.StatusCode, c.Meshinfer.Route)
		}
	}
	if got := nd.Status().Inference.Served; got != servedBefore {
		t.Fatalf("paused node served %d requests", got-servedBefore)
	}

	// Charging and back above the floor: it resumes after RecoverBeats healthy heartbeats
	// (and not before), then takes work again.
	charged := time.Now()
	if err := chargeBattery(tn, drained); err != nil {
		t.Fatal(err)
	}
	p := participation.DefaultParams(heartbeat)
	within(t, time.Duration(p.RecoverBeats+2)*heartbeat+p.BackoffWindow+2*time.Second, "peers see it accepting again", func() bool {
		a, _ := peerAccepting(router, nd)
		return a
	})
	if back := time.Since(charged); back < time.Duration(p.RecoverBeats-1)*heartbeat {
		t.Fatalf("resumed %v after charging: sooner than %d healthy heartbeats", back, p.RecoverBeats)
	}
	for i := 0; nd.Status().Inference.Served == servedBefore; i++ {
		if i == 300 {
			t.Fatalf("node %d never served again", drained)
		}
		if resp, _ := post(t, router.APIAddr(), chatBody("synth-tiny", 2, false)); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	t.Logf("figure F15: paused below the battery floor, peers saw it not accepting, its stream was handed over and completed on another peer, identical; resumed %v after charging (≥ %d healthy heartbeats)", time.Since(charged).Round(time.Millisecond), p.RecoverBeats)
}

// Every task a node serves for a peer is receipted: the receipts verify, and their totals
// match what the serving nodes counted.
func TestReceiptsMatchServedTasks(t *testing.T) {
	// Verification re-runs are tasks too (and receipted): off here, so that receipts count
	// exactly the client's requests.
	tn := start(t, Options{Nodes: 3, NoConsole: true, Heartbeat: time.Second, ModelsFor: serveNothing,
		Configure: func(_ int, cfg *node.Config) { cfg.VerifySample = node.VerifyOff }})
	within(t, 15*time.Second, "converge", tn.Converged)
	const requests = 12
	for i := range requests {
		resp, _ := post(t, tn.Node(0).APIAddr(), chatBody("synth-tiny", 3+i%3, false))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	// A node counts a task and receipts it just after its last frame leaves, which may be
	// after the client has its answer: wait for the receipts of all of them.
	within(t, 10*time.Second, "every task receipted", func() bool {
		n := 0
		for i := 1; i < 3; i++ {
			if tot, _, err := receipts.Total(filepath.Join(tn.DataDir(i), receipts.File)); err == nil {
				n += tot.Tasks
			}
		}
		return n == requests
	})
	total := 0
	for i := 1; i < 3; i++ {
		served := tn.Node(i).Status().Inference.Served
		tot, bad, err := receipts.Total(filepath.Join(tn.DataDir(i), receipts.File))
		if served == 0 {
			if !errors.Is(err, fs.ErrNotExist) && (err != nil || tot.Tasks != 0) {
				t.Fatalf("node %d served nothing but its log says %+v, %v", i, tot, err)
			}
			continue
		}
		if err != nil || len(bad) != 0 {
			t.Fatalf("node %d receipts: %v, bad lines %v", i, err, bad)
		}
		if uint64(tot.Completed) != served || tot.Tasks != tot.Completed || tot.TokensOut == 0 {
			t.Fatalf("node %d served %d, receipts say %+v", i, served, tot)
		}
		if tot.ByRequester[tn.Node(0).ID().String()].Tasks != tot.Tasks {
			t.Fatalf("node %d receipts by requester %+v, want all from node 0", i, tot.ByRequester)
		}
		total += tot.Tasks
	}
	if total != requests {
		t.Fatalf("%d receipts for %d requests", total, requests)
	}
}
