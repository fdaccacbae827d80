package testnet

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// TestPipelineServesAModelNoNodeHolds: three nodes announce synth-small (21 MB in 4 layers,
// about 5.2 MB a layer with its share of the embeddings) with memory budgets of 11, 6 and
// 6 MiB, so none holds it whole: a request for it at a router that serves nothing is planned
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
			cfg.MemoryBudget = []int64{0, 11 << 20, 6 << 20, 6 << 20}[i]
		},
	})
	within(t, 20*time.Second, "converge", tn.Converged)
	router := tn.Node(0)
	// Greedy, sampled and nucleus-sampled, and one cut by a stop string taken from its own
	// uninterrupted output.
	sampling := []struct {
		temp, topP float64
		stop       bool
	}{{0, 1, false}, {0.8, 1, false}, {1.3, 0.5, true}}
	for seed := range int64(len(sampling)) {
		sp := sampling[seed]
		body := samplingBody(t, model, 6, seed, sp.temp, sp.topP, sp.stop)
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
	if st := router.Status().Pipelines; st.Headed < uint64(len(sampling)) {
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
		t.Fatalf("with one 11 MiB node left: %+v, want a refusal naming the shortfall", r)
	}
}

// heldStages holds every stage session at its step'th Forward (the prompt is step 1) until
// the test releases it, after telling the test which node reached it first. firsts, when
// not nil, gets the positions of each session's first Forward, if it has room.
type heldStages struct {
	inference.StageBackend
	node    int
	step    int
	reached chan<- int
	release <-chan struct{}
	firsts  chan<- int
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
	if s.steps++; s.steps == 1 && s.h.firsts != nil {
		select {
		case s.h.firsts <- n:
		default:
		}
	}
	if s.steps == s.h.step {
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
	reached, firsts := make(chan int, 4), make(chan int, 64)
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
			cfg.MemoryBudget = []int64{0, 11 << 20, 11 << 20, 6 << 20, 6 << 20}[i]
			// The stages are held until the test has killed one: the lost stage, not a
			// step timing out at the head, is what the test is about.
			cfg.PeerInterTokenTimeout = time.Minute
			cfg.WrapStages = func(b inference.StageBackend) inference.StageBackend {
				return heldStages{StageBackend: b, node: i, step: 5, reached: reached, release: release, firsts: firsts}
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
	// The second pipeline was given the prompt and the tokens already sent as one batch
	// (a replay), not the prompt alone to generate them again: its sessions' first steps
	// are at least 3 positions longer than the first pipeline's.
	// Every session of both pipelines has had its first step by now.
	lo, hi := math.MaxInt, 0
	for len(firsts) > 0 {
		n := <-firsts
		lo, hi = min(lo, n), max(hi, n)
	}
	if hi < lo+3 {
		t.Fatalf("first steps of %d to %d positions: the second pipeline did not replay the tokens sent", lo, hi)
	}
}

// samplingBody is a routed request for model with the given sampling; with stop, it stops
// at two characters from the middle of its own uninterrupted output.
func samplingBody(t *testing.T, model string, maxTokens int, seed int64, temp, topP float64, stop bool) string {
	m := map[string]any{
		"model": model, "max_tokens": maxTokens, "seed": seed, "temperature": temp, "top_p": topP, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": "tell me about meshes"}},
	}
	b, _ := json.Marshal(m)
	if full := reference(t, string(b)); stop && len(full) > 4 {
		m["stop"] = []string{full[len(full)/2 : len(full)/2+2]}
		b, _ = json.Marshal(m)
	}
	return string(b)
}

// stageBudgets gives node 0 (the router, serving nothing) no budget and every other node
// 11 MiB: two of synth-small's four layers, so every pipeline of it has two stages.
func stageBudgets(i int, cfg *node.Config) {
	if i > 0 {
		cfg.MemoryBudget = 11 << 20
	}
}

// servesSmall: node 0 serves nothing, the others synth-small.
func servesSmall(i int) []string {
	if i == 0 {
		return nil
	}
	return []string{"synth-small"}
}

// Each stage of a pipeline receipts its part like a served task: after one request, each
// stage node's log holds one verified receipt, made out to the head, for the layers the
// route names for it, with the steps and positions it ran; and the head holds the same
// receipt from each stage, countersigned.
func TestStagesReceiptTheirParts(t *testing.T) {
	tn := start(t, Options{Nodes: 3, NoConsole: true, Heartbeat: time.Second, ModelsFor: servesSmall,
		Configure: func(i int, cfg *node.Config) {
			stageBudgets(i, cfg)
			cfg.VerifySample = node.VerifyOff // no other plan to open sessions
		}})
	within(t, 20*time.Second, "converge", tn.Converged)
	router := tn.Node(0)
	body := routedBody("synth-small", 6, 3, nil)
	r := stream(t, router.APIAddr(), body, nil, nil)
	if r.errCode != "" || !r.done || r.text() != reference(t, body) {
		t.Fatalf("%+v", r)
	}
	served, ok := inference.ParseRoute(r.final.Route)
	if !ok || len(served.Stages) != 2 {
		t.Fatalf("served at %q, want a pipeline of 2 stages", r.final.Route)
	}
	var parts []receipts.Stage
	for _, hop := range served.Stages {
		idx := slices.IndexFunc([]int{1, 2}, func(i int) bool { return tn.Node(i).ID().String() == hop.Peer }) + 1
		if idx == 0 {
			t.Fatalf("stage %s is not a node of the testnet", hop.Peer)
		}
		var got []receipts.Receipt
		// Receipts are written within a second of the session's end, off its path.
		within(t, 10*time.Second, fmt.Sprintf("node %d's receipt", idx), func() bool {
			got = got[:0]
			err := receipts.Read(filepath.Join(tn.DataDir(idx), receipts.File), func(rc receipts.Receipt, err error) bool {
				if err != nil {
					t.Errorf("node %d's log: %v", idx, err)
				} else {
					got = append(got, rc)
				}
				return true
			})
			return err == nil && len(got) > 0
		})
		rc := got[0]
		if len(got) != 1 || rc.Stage == nil || rc.Requester != router.ID().String() || rc.Server != hop.Peer ||
			rc.Model != "synth-small" || rc.Outcome != receipts.Completed || rc.Stage.Lo != hop.Lo || rc.Stage.Hi != hop.Hi ||
			rc.Stage.Steps < 2 || rc.Stage.Positions <= rc.Stage.Steps {
			t.Fatalf("node %d (%s[%d-%d]) logged %d receipts, the first %+v (stage %+v)", idx, hop.Peer, hop.Lo, hop.Hi-1, len(got), rc, rc.Stage)
		}
		parts = append(parts, *rc.Stage)
	}
	// Both stages ran every step of the one generation.
	if parts[0].Steps != parts[1].Steps || parts[0].Positions != parts[1].Positions {
		t.Fatalf("the stages ran %+v and %+v", parts[0], parts[1])
	}
	// And each sent the head its receipt of that part, which the head countersigned and
	// lists with the pipeline: the same stage member as the log's line, session included.
	recent := router.Status().Pipelines.Recent
	if len(recent) != 1 || recent[0].Route != r.final.Route || len(recent[0].Stages) != 2 {
		t.Fatalf("the head lists %+v, want the one pipeline", recent)
	}
	for i, st := range recent[0].Stages {
		rc, err := receipts.VerifyStageCountersig(router.ID().String(), st.Receipt, st.Countersig)
		if err != nil || rc.Server != served.Stages[i].Peer || *rc.Stage != parts[i] || rc.Stage.Session == "" {
			t.Fatalf("stage %d's countersigned receipt %+v (%v), its log's stage %+v", i, rc, err, parts[i])
		}
	}
}

// switchedStages are every stage node's backend, lying or not by a switch the test owns:
// lieNext makes a liar of whichever node opens the next stage session (the first stage of
// the next pipeline), for good.
type switchedStages struct {
	lieNext atomic.Bool
	liar    atomic.Int32 // the node lieNext made a liar; 0: none yet
}

func (s *switchedStages) wrap(i int) func(inference.StageBackend) inference.StageBackend {
	return func(b inference.StageBackend) inference.StageBackend { return switchedBackend{b, s, int32(i)} }
}

type switchedBackend struct {
	inference.StageBackend
	s    *switchedStages
	node int32
}

func (b switchedBackend) OpenStage(ctx context.Context, model string, lo, hi, maxPositions int) (inference.StageSession, error) {
	if b.s.lieNext.CompareAndSwap(true, false) {
		b.s.liar.Store(b.node)
	}
	ss, err := b.StageBackend.OpenStage(ctx, model, lo, hi, maxPositions)
	if err != nil || b.s.liar.Load() != b.node {
		return ss, err
	}
	return lyingStage{ss}, nil
}

// lyingStage returns its hidden states rotated by one value: the layers after it and the
// head compute on garbage (a norm would undo a shift or a scale).
type lyingStage struct{ inference.StageSession }

func (l lyingStage) Forward(ctx context.Context, hidden []float32, n int) ([]float32, error) {
	out, err := l.StageSession.Forward(ctx, hidden, n)
	if err != nil {
		return nil, err
	}
	return append(out[1:len(out):len(out)], out[0]), nil
}

// A coordinator verifies a pipeline's result on another plan and meters it at the head.
// Six nodes of 11 MiB serve synth-small in pipelines of two: the client's, a second plan
// of two others, and a third of the last two for a mismatch. Honest, the task passes and
// is metered as served by its pipeline; then the first stage of the client's next
// pipeline lies: the client's output differs from the model's, two other pipelines outvote
// it, the task is metered as failed (zero tokens), and each of its stages is isolated
// among the voters' nodes: the liar is excluded, its honest partner and every other node
// are not.
func TestCoordinatorVerifiesAPipelineOnAnotherPlan(t *testing.T) {
	var sw switchedStages
	c := &coordinators{t: t, keys: map[int]string{}}
	tn := start(t, Options{Nodes: 7, NoConsole: true, Heartbeat: time.Second, ModelsFor: servesSmall, DistinctHosts: true,
		Configure: func(i int, cfg *node.Config) {
			stageBudgets(i, cfg)
			if i == 0 {
				c.configure(i, cfg) // coordinator, every mesh task verified, voters vetted at once
				return
			}
			cfg.WrapStages = sw.wrap(i)
		}})
	within(t, 20*time.Second, "converge", tn.Converged)
	coord := tn.Node(0)
	var stageNodes []*node.Node
	for i := 1; i < 7; i++ {
		stageNodes = append(stageNodes, tn.Node(i))
	}
	connectTo(t, coord, stageNodes...) // voters must be connected; a head dials its first stage only
	auth := http.Header{"Authorization": {"Bearer " + c.key(0)}}

	var routes []string
	for round, lie := range []bool{false, true} {
		if lie {
			sw.lieNext.Store(true)
		}
		body := routedBody("synth-small", 3, int64(40+round), nil)
		r := stream(t, coord.APIAddr(), body, auth, nil)
		if r.errCode != "" || !r.done || !strings.HasPrefix(r.final.Route, "pipeline:") {
			t.Fatalf("round %d: %+v", round, r)
		}
		if lied := r.text() != reference(t, body); lied != lie {
			t.Fatalf("round %d: the client's output differs from the model's: %v, want %v", round, lied, lie)
		}
		// A lie is voted on by three plans, then each stage of the outvoted pipeline is
		// isolated, a convicted one twice: up to seven runs of synth-small, a few seconds
		// each under -race on a loaded machine.
		within(t, time.Minute, "verdict", func() bool {
			return coord.Status().Routing.Verification.Sampled == uint64(round+1) && verificationsInFlight(coord) == 0
		})
		routes = append(routes, r.final.Route)
	}
	liar := int(sw.liar.Load())
	if liar == 0 || !strings.Contains(routes[1], tn.Node(liar).ID().String()+"[0-") {
		t.Fatalf("the liar is node %d, not the first stage of %s", liar, routes[1])
	}
	if v := coord.Status().Routing.Verification; v.Passed != 1 || v.Failed != 1 || v.Inconclusive+v.Skipped != 0 ||
		v.StagesIsolated != 2 || v.StagesConvicted != 1 || v.StagesInconclusive != 0 {
		t.Fatalf("verification %+v: want the honest pipeline passed, the lying one failed, its 2 stages isolated and 1 convicted", v)
	}
	for i := 1; i < 7; i++ {
		if _, excluded := peerScore(t, coord, tn.Node(i)); excluded != (i == liar) {
			t.Fatalf("node %d excluded: %v; want the liar, node %d, alone", i, excluded, liar)
		}
	}

	usageFile := filepath.Join(tn.DataDir(0), gateway.UsageFile)
	var events []gateway.MeterEvent
	within(t, 10*time.Second, "both tasks metered", func() bool {
		events = events[:0]
		gateway.ReadEvents(usageFile, func(e gateway.MeterEvent) { events = append(events, e) })
		return len(events) >= 2
	})
	want := []struct {
		outcome string
		verdict inference.Verdict
		tokens  int
	}{{gateway.OutcomeCompleted, inference.VerdictPassed, 3}, {gateway.OutcomeVerificationFailed, inference.VerdictFailed, 0}}
	for i, e := range events {
		if len(events) != 2 || e.Peer != routes[i] || e.Model != "synth-small" || e.Outcome != want[i].outcome ||
			e.Verification != want[i].verdict || e.Verified != (i == 0) || e.Receipt != "" || e.TokensOut != want[i].tokens {
			t.Fatalf("event %d of %d: %+v; want served at %s, %s, verification %s", i, len(events), e, routes[i], want[i].outcome, want[i].verdict)
		}
	}
	usage, err := gateway.ReadUsage(usageFile)
	if err != nil || len(usage) != 1 {
		t.Fatalf("usage %v: %v", usage, err)
	}
	for _, u := range usage {
		if u.Requests != 2 || u.Failed != 1 || u.TokensOut != 3 {
			t.Fatalf("usage %+v: want 2 requests, the lying pipeline's failed and its tokens not counted", u)
		}
	}
	if n := coord.Status().Routing.ReceiptsRefused; n != 0 {
		t.Fatalf("%d receipts refused: a pipeline has none", n)
	}
}

// heldSession moves as the session it wraps does (inference.StageMover): the stages of a
// held chain can hand their sessions over.
func (s *heldSession) Positions() int { return s.StageSession.(inference.StageMover).Positions() }

func (s *heldSession) Rows(dst []float32, from, n int) (inference.KVRows, error) {
	return s.StageSession.(inference.StageMover).Rows(dst, from, n)
}

func (s *heldSession) Load(r inference.KVRows) error {
	return s.StageSession.(inference.StageMover).Load(r)
}

// TestPipelineStageDrainsHandsOverLive: a stage's battery drains while a pipeline streams;
// its node pauses and tells the head, which re-links the chain at its next step with a
// spare node in the stage's place and the stage's KV rows moved there. The stream goes on
// in the same attempt, with no replay (no second pipeline), identical to an uninterrupted
// run, and the head's /api/status shows the live transfer.
func TestPipelineStageDrainsHandsOverLive(t *testing.T) {
	const model = "synth-small"
	reached, firsts := make(chan int, 4), make(chan int, 64)
	release := make(chan struct{})
	tn := start(t, Options{Nodes: 5, NoConsole: true, Heartbeat: 500 * time.Millisecond, Sensors: true,
		ModelsFor: func(i int) []string {
			if i == 0 {
				return nil
			}
			return []string{model}
		},
		Configure: func(i int, cfg *node.Config) {
			// Two stages of 2 layers out of four candidates that each hold 2: two spares,
			// either of which can take a stage's layers.
			cfg.MemoryBudget = []int64{0, 11 << 20, 11 << 20, 11 << 20, 11 << 20}[i]
			cfg.PeerInterTokenTimeout = time.Minute // the test holds a stage on purpose
			cfg.WrapStages = func(b inference.StageBackend) inference.StageBackend {
				return heldStages{StageBackend: b, node: i, step: 5, reached: reached, release: release, firsts: firsts}
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
	if err := drainBattery(tn, victim); err != nil {
		t.Fatal(err)
	}
	// The victim paused (and told its sessions' heads) once its peers see it so.
	within(t, 20*time.Second, "the victim pauses", func() bool {
		accepting, known := peerAccepting(router, tn.Node(victim))
		return known && !accepting
	})
	close(release)
	r := <-done
	if r.errCode != "" || !r.done {
		t.Fatalf("after node %d's battery drained mid-stream: %+v", victim, r)
	}
	if want := reference(t, body); r.text() != want {
		t.Fatalf("the moved pipeline's stream differs\n got %q\nwant %q", r.text(), want)
	}
	if r.final.Attempts != 1 {
		t.Fatalf("%d attempts, want the one pipeline going on; %+v", r.final.Attempts, router.Status().Migration)
	}
	// No session started with the prompt and the tokens sent (a replay): the chain's two
	// sessions began with the prompt, and the replacement, which loaded its rows, with a
	// decode step of one position.
	var got []int
	for len(firsts) > 0 {
		got = append(got, <-firsts)
	}
	slices.Sort(got)
	if len(got) != 3 || got[0] != 1 || got[1] != got[2] || got[1] < 2 {
		t.Fatalf("sessions' first steps of %v positions, want the prompt twice and one decode step", got)
	}
	m := router.Status().Migration
	if m.Decisions["live_transfer"] != 1 || len(m.Recent) == 0 {
		t.Fatalf("migration status %+v, want one live_transfer", m)
	}
	last := m.Recent[len(m.Recent)-1]
	if last.Choice != "live_transfer" || last.Outcome != "completed" || !last.Inputs.SourceUp || last.Inputs.KVBytes <= 0 {
		t.Fatalf("migration decision %+v, want a completed live_transfer with the source up", last)
	}
	// The head's pipelines status shows the move and the chain as re-linked.
	recent := router.Status().Pipelines.Recent
	if len(recent) == 0 || len(recent[0].Moved) != 1 || recent[0].Moved[0].From != tn.Node(victim).ID().String() ||
		recent[0].Moved[0].Bytes <= 0 || strings.Contains(recent[0].Route, tn.Node(victim).ID().String()) {
		t.Fatalf("pipelines status %+v, want the last pipeline with node %d's stage moved and its route without it", recent, victim)
	}
	t.Logf("stage of node %d moved live: %d bytes at %.0f Mbit/s; options %v; status %+v", victim, last.Inputs.KVBytes,
		last.Inputs.BandwidthMbps, last.OptionsMS, recent[0].Moved[0])
}
