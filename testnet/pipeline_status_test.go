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
// nothing and three nodes announcing synth-small with budgets of 11, 6 and 6 MiB, so that
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
			cfg.MemoryBudget = []int64{0, 11 << 20, 6 << 20, 6 << 20}[i]
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
// both within seconds; a second request then runs on the same warm ranges. The loads are held by a gate until the router has seen the first
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

	// A second request for the model runs on the same ranges (the plan prefers those held
	// warm), and no stage node loads another.
	r = stream(t, router.APIAddr(), routedBody(model, 4, 4, nil), nil, nil)
	if r.errCode != "" || !r.done {
		t.Fatalf("second pipeline request: %+v", r)
	}
	again, _ := inference.ParseRoute(r.final.Route)
	if !slices.Equal(again.Stages, served.Stages) {
		t.Fatalf("the second request ran on %q, the first on the ranges now warm, %q", r.final.Route, served.Route())
	}
	for i := 1; i < 4; i++ {
		if st := tn.Node(i).Own().Stages; len(st) != 1 || st[0].State != caps.StageWarm {
			t.Fatalf("node %d holds %+v after the second request, want its one warm range", i, st)
		}
	}
}

// TestPipelineStatus: while a pipeline streams (held at a stage's third step), the router's
// status lists it open with its three stages and non-zero step and layer times, and each
// stage node's status lists its session of that pipeline; once it ends, the router lists
// it closed with every step of the generation, and the stage nodes list no session. Of
// nine pipelines, the router lists the last eight.
func TestPipelineStatus(t *testing.T) {
	const model = "synth-small"
	reached := make(chan int, 4)
	release := make(chan struct{})
	tn := shardNodes(t, time.Second, func(i int, cfg *node.Config) {
		cfg.WrapStages = func(b inference.StageBackend) inference.StageBackend {
			return heldStages{StageBackend: b, node: i, step: 3, reached: reached, release: release}
		}
	})
	router := tn.Node(0)
	if pl := router.Status().Pipelines; len(pl.Recent) != 0 || len(pl.Sessions) != 0 {
		t.Fatalf("pipelines before any request: %+v", pl)
	}
	body := routedBody(model, 8, 5, nil)
	done := make(chan streamResult, 1)
	go func() { done <- stream(t, router.APIAddr(), body, nil, nil) }()
	select {
	case <-reached: // stage 0 holds the third step: the prompt and one token went through
	case <-time.After(60 * time.Second):
		t.Fatal("no stage reached its third step")
	}

	recent := router.Status().Pipelines.Recent
	if len(recent) != 1 {
		t.Fatalf("the router lists %d pipelines while one runs: %+v", len(recent), recent)
	}
	hp := recent[0]
	if hp.Model != model || !hp.Open || hp.Failure != "" || len(hp.Stages) != 3 || hp.Steps != 2 || hp.StepMS <= 0 ||
		hp.HopsMS == nil || *hp.HopsMS <= 0 || hp.StartedAt == "" {
		t.Fatalf("the running pipeline at the router: %+v", hp)
	}
	served, ok := inference.ParseRoute(hp.Route)
	if !ok || len(served.Stages) != 3 {
		t.Fatalf("route %q", hp.Route)
	}
	var layers float64
	for i, s := range hp.Stages {
		if want := served.Stages[i]; s.Peer != want.Peer || s.Lo != want.Lo || s.Hi != want.Hi || s.ForwardMS == nil || *s.ForwardMS <= 0 {
			t.Fatalf("stage %d listed as %+v, route has %+v", i, s, want)
		}
		layers += *s.ForwardMS
	}
	if layers > hp.StepMS {
		t.Fatalf("the stages' layers took %.3f ms a step, more than the %.3f ms round trip that holds them", layers, hp.StepMS)
	}
	byID := map[string]*node.Node{}
	for i := 1; i < 4; i++ {
		byID[tn.Node(i).ID().String()] = tn.Node(i)
	}
	for i, s := range hp.Stages {
		ss := byID[s.Peer].Status().Pipelines.Sessions
		want := 2 // stage 0 holds its third step; the others wait for it
		if len(ss) != 1 || ss[0].Model != model || ss[0].Lo != s.Lo || ss[0].Hi != s.Hi || ss[0].Head != router.ID().String() ||
			ss[0].Index != i || ss[0].Stages != 3 || ss[0].Steps != want || ss[0].ForwardMS <= 0 {
			t.Fatalf("stage %d (%s) lists its sessions as %+v", i, s.Peer, ss)
		}
	}
	close(release)

	r := <-done
	if r.errCode != "" || !r.done || r.final.Route != hp.Route {
		t.Fatalf("pipeline request: %+v, want served at %s", r, hp.Route)
	}
	// max_tokens is reached: a step for the prompt, then one for each token but the last.
	recent = router.Status().Pipelines.Recent
	if len(recent) != 1 || recent[0].Open || recent[0].Failure != "" || recent[0].Route != hp.Route ||
		len(r.tokens) != 8 || recent[0].Steps != len(r.tokens) || recent[0].StepMS <= 0 {
		t.Fatalf("after the request (%d tokens) the router lists %+v", len(r.tokens), recent)
	}
	within(t, 20*time.Second, "the stage sessions freed", func() bool {
		for _, n := range byID {
			if len(n.Status().Pipelines.Sessions) != 0 {
				return false
			}
		}
		return true
	})

	// Eight more, of one token each (one step: the prompt): the router keeps the last 8, and
	// the first, of 8 steps, is gone.
	for seed := range int64(8) {
		if r := stream(t, router.APIAddr(), routedBody(model, 1, 100+seed, nil), nil, nil); r.errCode != "" || !r.done {
			t.Fatalf("request %d: %+v", seed, r)
		}
	}
	recent = router.Status().Pipelines.Recent
	if len(recent) != 8 {
		t.Fatalf("the router lists %d pipelines after 9, want the last 8", len(recent))
	}
	for i, hp := range recent {
		if hp.Open || hp.Steps != 1 || hp.Failure != "" {
			t.Fatalf("pipeline %d listed as %+v, want one of the last 8, of one step", i, hp)
		}
	}
}
