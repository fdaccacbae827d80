package testnet

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"go.uber.org/goleak"
)

// fastHeartbeat makes staleness observable in seconds: stale after 2×1 s + 1 s, forgotten
// after twice that.
const fastHeartbeat = time.Second

func start(t *testing.T, opts Options) *Testnet {
	t.Helper()
	tn, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tn.Close() })
	return tn
}

func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := WaitFor(ctx, 10*time.Millisecond, cond); err != nil {
		t.Fatalf("%s: not within %v", what, d)
	}
}

func TestFiveNodesConvergeAndStopCleanly(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	tn, err := New(Options{Nodes: 5, Heartbeat: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Close() // before the leak check, also when the test fails early
	// The production heartbeat: convergence within seconds comes from announcing on join.
	within(t, 10*time.Second, "5 nodes converge", tn.Converged)
	tcp := 0
	for _, n := range tn.Running() {
		st := n.Status()
		if st.Mesh.PeersKnown != 4 || !st.Ready || st.Capability == nil {
			t.Errorf("node %s status: known %d ready %v capability %v", n.ID(), st.Mesh.PeersKnown, st.Ready, st.Capability != nil)
		}
		// Loopback peers dial TCP first (node's dial ranking), and TCP connections between
		// nodes run on yamux, as /api/peers shows.
		for _, p := range n.Peers() {
			for _, c := range p.Conns {
				if c.Transport != "tcp" {
					continue
				}
				tcp++
				if c.Muxer != string(yamux.ID) || c.Security == "" || c.Direction == "" {
					t.Errorf("node %s: a TCP connection %+v, want multiplexed by %q", n.ID(), c, yamux.ID)
				}
			}
		}
	}
	if tcp == 0 {
		t.Error("no TCP connection between the nodes")
	}
	if err := tn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tn.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

func TestKilledNodeGoesStaleThenForgotten(t *testing.T) {
	tn := start(t, Options{Nodes: 4, NoConsole: true, Heartbeat: fastHeartbeat})
	within(t, 10*time.Second, "converge", tn.Converged)
	victim := tn.Node(3).ID()
	if err := tn.Kill(3); err != nil {
		t.Fatal(err)
	}
	survivors := tn.Running()
	// Connection events: the kill shows at once as a disconnect.
	within(t, time.Second, "disconnect seen", func() bool {
		for _, n := range survivors {
			if e, ok := n.Registry().Get(victim, time.Now()); ok && e.Connected {
				return false
			}
		}
		return true
	})
	// Silence: stale after 2 heartbeats + 1 s (3 s here), then forgotten after 6 s.
	within(t, 5*time.Second, "victim stale everywhere", func() bool {
		for _, n := range survivors {
			if e, ok := n.Registry().Get(victim, time.Now()); ok && !e.Stale {
				return false
			}
		}
		return true
	})
	within(t, 6*time.Second, "victim forgotten everywhere", func() bool {
		for _, n := range survivors {
			if _, ok := n.Registry().Get(victim, time.Now()); ok {
				return false
			}
		}
		return true
	})
	// The survivors still see each other.
	if !tn.Converged() {
		t.Fatal("survivors no longer converged")
	}
}

func TestLateJoinerSeenByAllWithin3s(t *testing.T) {
	tn := start(t, Options{Nodes: 5, NoConsole: true, Heartbeat: 15 * time.Second})
	within(t, 10*time.Second, "converge", tn.Converged)
	began := time.Now()
	idx, err := tn.Add()
	if err != nil {
		t.Fatal(err)
	}
	late := tn.Node(idx).ID()
	within(t, 3*time.Second, "late joiner seen by all", func() bool {
		for _, n := range tn.Running() {
			if n.ID() == late {
				continue
			}
			if e, ok := n.Registry().Get(late, time.Now()); !ok || e.Stale {
				return false
			}
		}
		return true
	})
	t.Logf("late joiner seen by all %d nodes in %v", len(tn.Running())-1, time.Since(began))
}

func TestStoppedNodeDisconnectSeenWithinASecond(t *testing.T) {
	tn := start(t, Options{Nodes: 3, NoConsole: true, Heartbeat: 15 * time.Second})
	within(t, 10*time.Second, "converge", tn.Converged)
	gone := tn.Node(2).ID()
	if err := tn.Stop(2); err != nil {
		t.Fatal(err)
	}
	within(t, time.Second, "clean disconnect seen", func() bool {
		for _, n := range tn.Running() {
			if e, ok := n.Registry().Get(gone, time.Now()); ok && e.Connected {
				return false
			}
		}
		return true
	})
	if err := tn.Stop(2); err == nil {
		t.Fatal("stopping a stopped node: want an error")
	}
}

func TestMeshesAreIsolated(t *testing.T) {
	a := start(t, Options{Nodes: 2, NoConsole: true, Mesh: "alpha", Heartbeat: fastHeartbeat})
	within(t, 10*time.Second, "alpha converges", a.Converged)
	// A node of another mesh bootstraps into alpha's node 0 yet never enters its registry.
	b := start(t, Options{Nodes: 1, NoConsole: true, Mesh: "beta", Heartbeat: fastHeartbeat})
	n0, other := a.Node(0), b.Node(0)
	if err := other.Host().Connect(context.Background(), n0.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	// Two heartbeats pass with both connected: nothing crosses.
	deadline := time.Now().Add(2 * fastHeartbeat)
	for time.Now().Before(deadline) {
		if _, ok := n0.Registry().Get(other.ID(), time.Now()); ok {
			t.Fatal("a node of mesh beta entered mesh alpha's registry")
		}
		if other.Registry().Len() != 0 {
			t.Fatal("mesh beta's node learned mesh alpha's peers")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
