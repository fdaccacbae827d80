package testnet

import (
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/node"
)

// shardNodes starts the mesh of TestPipelineServesAModelNoNodeHolds: a router that serves
// nothing and three nodes announcing synth-small with budgets of 10, 5 and 5 MiB, so that
// a request for it runs on a pipeline of three stages (2 + 1 + 1 layers). configure, when
// set, adjusts the stage nodes' configuration further.
func shardNodes(t *testing.T, heartbeat time.Duration, configure func(i int, cfg *node.Config)) *Testnet {
	t.Helper()
	tn := start(t, Options{Nodes: 4, NoConsole: true, Heartbeat: heartbeat,
		ModelsFor: func(i int) []string {
			if i == 0 {
				return nil
			}
			return []string{"synth-small"}
		},
		Configure: func(i int, cfg *node.Config) {
			cfg.MemoryBudget = []int64{0, 10 << 20, 5 << 20, 5 << 20}[i]
			if i > 0 && configure != nil {
				configure(i, cfg)
			}
		},
	})
	within(t, 20*time.Second, "converge", tn.Converged)
	return tn
}

// stagesAt is the stages that the router's registry holds for peer p's latest vector.
func stagesAt(router *node.Node, p string) []caps.Stage {
	id, err := peer.Decode(p)
	if err != nil {
		return nil
	}
	e, ok := router.Registry().Get(id, time.Now())
	if !ok || e.Vector == nil {
		return nil
	}
	return e.Vector.Stages
}

// TestStageRangesAnnouncedLoadingThenWarm: a stage node announces the layer range a head
// asked it for as soon as its load starts (state loading) and again as soon as it is loaded
// (warm), without waiting for its heartbeat: with a heartbeat of a minute, the router sees
// both within seconds. The loads are held by a gate until the router has seen the first
// stage loading; stage 0 loads before it opens the rest of the chain, so it is the only one
// loading then.
func TestStageRangesAnnouncedLoadingThenWarm(t *testing.T) {
	const model = "synth-small"
	gate := make(chan struct{})
	tn := shardNodes(t, time.Minute, func(_ int, cfg *node.Config) { cfg.SynthLoadGate = gate })
	router := tn.Node(0)
	// Each stage node publishes once more, now that every peer is on its topic, and the
	// router holds that vector: whatever a node owed the mesh (its announcement on a peer's
	// join) is folded into it, and its next heartbeat is a minute away. So what the router
	// sees next comes from the loads.
	seqs := make([]uint64, 4)
	for i := 1; i < 4; i++ {
		seqs[i] = tn.Node(i).Own().Seq
		tn.Node(i).Announce()
	}
	within(t, 20*time.Second, "the stage nodes' fresh announcements reach the router", func() bool {
		for i := 1; i < 4; i++ {
			n := tn.Node(i)
			e, ok := router.Registry().Get(n.ID(), time.Now())
			if !ok || e.Vector.Seq <= seqs[i] || e.Vector.Seq != n.Own().Seq {
				return false
			}
		}
		return true
	})
	for i := 1; i < 4; i++ {
		if st := stagesAt(router, tn.Node(i).ID().String()); len(st) != 0 {
			t.Fatalf("node %d announces stages %+v before any pipeline", i, st)
		}
	}

	done := make(chan streamResult, 1)
	body := routedBody(model, 4, 3, nil)
	go func() { done <- stream(t, router.APIAddr(), body, nil, nil) }()
	var loadingAt string
	var loading caps.Stage
	within(t, 20*time.Second, "the router sees a stage's range loading", func() bool {
		for i := 1; i < 4; i++ {
			id := tn.Node(i).ID().String()
			for _, st := range stagesAt(router, id) {
				if st.State == caps.StageLoading {
					loadingAt, loading = id, st
					return true
				}
			}
		}
		return false
	})
	for i := 1; i < 4; i++ {
		if id := tn.Node(i).ID().String(); id != loadingAt {
			if st := stagesAt(router, id); len(st) != 0 {
				t.Fatalf("node %d announces %+v while stage 0 still loads", i, st)
			}
		}
	}
	close(gate)

	r := <-done
	if r.errCode != "" || !r.done {
		t.Fatalf("pipeline request: %+v", r)
	}
	served, ok := inference.ParseRoute(r.final.Route)
	if !ok || len(served.Stages) != 3 {
		t.Fatalf("served at %q, want a pipeline of 3 stages", r.final.Route)
	}
	first := served.Stages[0]
	if want := (caps.Stage{Model: model, Lo: first.Lo, Hi: first.Hi, State: caps.StageLoading}); loadingAt != first.Peer || loading != want {
		t.Fatalf("the range seen loading was %+v at %s; the pipeline's first stage is %+v", loading, loadingAt, first)
	}
	within(t, 20*time.Second, "the router sees every stage's range warm", func() bool {
		for _, s := range served.Stages {
			want := []caps.Stage{{Model: model, Lo: s.Lo, Hi: s.Hi, State: caps.StageWarm}}
			if !slices.Equal(stagesAt(router, s.Peer), want) {
				return false
			}
		}
		return true
	})
}
