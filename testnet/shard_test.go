package testnet

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/node"
)

// TestPipelineServesAModelNoNodeHolds: three nodes announce synth-small (18 MB in 4 layers,
// about 4.5 MB a layer with its share of the embeddings) with memory budgets of 10, 5 and
// 5 MiB, so none holds it whole: a request for it at a router that serves nothing is planned
// as a pipeline of the fewest stages that fit (2 + 1 + 1 layers), streams through them, and
// gives exactly the tokens of a single-node run. Alone, the first of them cannot hold it,
// and the error says by how much.
func TestPipelineServesAModelNoNodeHolds(t *testing.T) {
	const model = "synth-small"
	tn := start(t, Options{Nodes: 4, NoConsole: true, Heartbeat: time.Second,
		ModelsFor: func(i int) []string {
			if i == 0 {
				return nil
			}
			return []string{model}
		},
		Configure: func(i int, cfg *node.Config) {
			cfg.MemoryBudget = []int64{0, 10 << 20, 5 << 20, 5 << 20}[i]
		},
	})
	within(t, 20*time.Second, "converge", tn.Converged)
	router := tn.Node(0)
	for seed := range int64(3) {
		body := routedBody(model, 6, seed, nil)
		r := stream(t, router.APIAddr(), body, nil, nil)
		if r.errCode != "" || !r.done {
			t.Fatalf("seed %d: %+v", seed, r)
		}
		served, ok := inference.ParseRoute(r.final.Route)
		if !ok || len(served.Stages) != 3 || !strings.HasPrefix(r.route, "pipeline:") {
			t.Fatalf("seed %d: served at %q (header %q), want a pipeline of 3 stages", seed, r.final.Route, r.route)
		}
		if want := reference(t, body); r.text() != want {
			t.Fatalf("seed %d: pipeline gave %q, a single node %q", seed, r.text(), want)
		}
	}
	if st := router.Status().Pipelines; st.Headed < 3 {
		t.Fatalf("router pipelines status %+v, want 3 headed", st)
	}
	// With two of the three stopped, the mesh cannot hold the model: a typed refusal
	// naming the shortfall, not a hang.
	gone := []string{tn.Node(2).ID().String(), tn.Node(3).ID().String()}
	for _, i := range []int{2, 3} {
		if err := tn.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	within(t, 20*time.Second, "the stopped nodes gone from the router's candidates", func() bool {
		for _, p := range router.Peers() {
			if slices.Contains(gone, p.PeerID) {
				if !p.Stale {
					return false
				}
			}
		}
		return true
	})
	r := stream(t, router.APIAddr(), routedBody(model, 6, 9, nil), nil, nil)
	if r.errCode == "" || !strings.Contains(r.errMsg, "cannot hold the model") {
		t.Fatalf("with one 10 MiB node left: %+v, want a refusal naming the shortfall", r)
	}
}

// heldStages holds every stage session at its step'th Forward (the prompt is step 1) until
// the test releases it, after telling the test which node reached it first.
type heldStages struct {
	inference.StageBackend
	node    int
	step    int
	reached chan<- int
	release <-chan struct{}
}

func (h heldStages) OpenStage(ctx context.Context, model string, lo, hi, maxPositions int) (inference.StageSession, error) {
	s, err := h.StageBackend.OpenStage(ctx, model, lo, hi, maxPositions)
	if err != nil {
		return nil, err
	}
	return &heldSession{StageSession: s, h: h}, nil
}

type heldSession struct {
	inference.StageSession
	h     heldStages
	steps int
}

func (s *heldSession) Forward(ctx context.Context, hidden []float32, n int) ([]float32, error) {
	if s.steps++; s.steps == s.h.step {
		select {
		case s.h.reached <- s.h.node:
		default:
		}
		select {
		case <-s.h.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.StageSession.Forward(ctx, hidden, n)
}

// TestPipelineLosesAStageMidStream: a stage's node is killed while a pipeline streams; the
// head notices at its next step, plans the pipeline again with the spare node in place of
// the lost one, and the client's stream goes on with no duplicated or missing token,
// identical to a single-node run.
func TestPipelineLosesAStageMidStream(t *testing.T) {
	const model = "synth-small"
	reached := make(chan int, 4)
	release := make(chan struct{})
	tn := start(t, Options{Nodes: 5, NoConsole: true, Heartbeat: time.Second,
		ModelsFor: func(i int) []string {
			if i == 0 {
				return nil
			}
			return []string{model}
		},
		Configure: func(i int, cfg *node.Config) {
			// Three stages of 2+1+1 layers out of four candidates: one spare.
			cfg.MemoryBudget = []int64{0, 10 << 20, 10 << 20, 5 << 20, 5 << 20}[i]
			cfg.WrapStages = func(b inference.StageBackend) inference.StageBackend {
				return heldStages{StageBackend: b, node: i, step: 5, reached: reached, release: release}
			}
		},
	})
	within(t, 20*time.Second, "converge", tn.Converged)
	router := tn.Node(0)
	body := routedBody(model, 16, 7, nil)
	done := make(chan streamResult, 1)
	go func() { done <- stream(t, router.APIAddr(), body, nil, nil) }()
	var victim int
	select {
	case victim = <-reached: // a stage is at its 5th step: the prompt and 3 tokens are out
	case <-time.After(60 * time.Second):
		t.Fatal("no stage reached its 5th step")
	}
	victimID := tn.Node(victim).ID().String()
	if err := tn.Stop(victim); err != nil {
		t.Fatal(err)
	}
	close(release)
	r := <-done
	if r.errCode != "" || !r.done {
		t.Fatalf("after node %d was killed mid-stream: %+v", victim, r)
	}
	if want := reference(t, body); r.text() != want {
		t.Fatalf("the resumed pipeline's stream differs\n got %q\nwant %q", r.text(), want)
	}
	served, _ := inference.ParseRoute(r.final.Route)
	if r.final.Attempts < 2 || len(served.Stages) == 0 {
		t.Fatalf("final route %q after %d attempts, want a second pipeline", r.final.Route, r.final.Attempts)
	}
	for _, s := range served.Stages {
		if s.Peer == victimID {
			t.Fatalf("the second pipeline %q still uses the killed node %d", r.final.Route, victim)
		}
	}
}
