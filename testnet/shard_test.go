package testnet

import (
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
