package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// Verification and metering of pipelines (verify.go, meter.go) on virtual time, over
// in-memory peers that run the real synthetic model: stages run their layer ranges, this
// node heads, and a lying stage alters the hidden states it returns. The peers share one
// backend, loaded once before the test's bubbles (under -race materializing synth-small's
// weights for each peer of each case took most of a minute): its weights are the same on
// every node by construction, and each stage session has its own KV cache.

// pipeModel is synth-small: 21 MB in 4 layers, so a 11 MiB budget holds 2 layers and
// nothing less than two such peers holds the model (testnet/shard_test.go).
const pipeModel = "synth-small"

// Budgets: a stage peer holds half the model; a whole peer all of it.
const (
	stageBudgetMB = 11
	wholeBudgetMB = 64
)

// meshNode is one in-memory peer of a stageNet: the zero value is an honest stage peer,
// established as a voter, on a /24 of its own (10.0.i.1, i its place in the list).
type meshNode struct {
	id      peer.ID
	whole   bool       // holds the model whole (and serves it as a peer); else a stage only
	lies    bool       // alters what it computes: a stage its hidden states, a whole peer a token
	offline bool       // no direct connection now: not a vetted voter
	addr    netip.Addr // zero: 10.0.i.1
	// noBudget announces no memory budget: a whole peer serves the model whole, never a
	// stage (route plans stages on announced budgets only).
	noBudget bool
	// evasive lies in its first stage session and refuses every later one: a liar that
	// will not be isolated.
	evasive bool
}

// stageNet is the peers of a mesh where synth-small is served by pipelines: each peer's
// stage backend and the whole peers' backends.
//
// lieNext makes a liar of whichever peer opens the next stage session (the first stage of
// the next pipeline), for that session and every later one: a test that cannot tell which
// peers the router will pick makes the plan it wants checked a liar's.
type stageNet struct {
	stages map[string]inference.StageBackend // by peer ID string
	whole  peers

	lieNext atomic.Bool
	liar    atomic.Pointer[string] // the peer lieNext made a liar
}

// lieOnNext arms lieNext.
func (n *stageNet) lieOnNext() { n.lieNext.Store(true) }

// liarPeer is the peer lieNext made a liar, or "".
func (n *stageNet) liarPeer() string {
	if p := n.liar.Load(); p != nil {
		return *p
	}
	return ""
}

// switchable is a peer's stage backend that lies once its peer is stageNet's liar.
type switchable struct {
	inference.StageBackend
	peer string
	net  *stageNet
}

func (s switchable) OpenStage(ctx context.Context, model string, lo, hi, maxPositions int) (inference.StageSession, error) {
	if s.net.lieNext.CompareAndSwap(true, false) {
		s.net.liar.Store(&s.peer)
	}
	if s.net.liarPeer() == s.peer {
		return lyingStages{s.StageBackend}.OpenStage(ctx, model, lo, hi, maxPositions)
	}
	return s.StageBackend.OpenStage(ctx, model, lo, hi, maxPositions)
}

// Generate runs req on a whole peer (Peers).
func (n *stageNet) Generate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	return n.whole.Generate(ctx, p, req, emit)
}

// OpenPipeline opens each stage's session on its peer's backend and chains them
// (PipelineOpener): what transport/stage does over the network. Its close gives a stage
// receipt per stage, opaque at this level: stageReceiptsOf the chain.
func (n *stageNet) OpenPipeline(ctx context.Context, model string, stages []inference.StageHop, maxPositions int, _ ReplaceStage) (inference.Layers, func() []inference.StageReceipt, error) {
	var sessions []inference.StageSession
	closeAll := func() []inference.StageReceipt {
		for _, s := range sessions {
			s.Close()
		}
		return stageReceiptsOf(stages)
	}
	for i, h := range stages {
		b, ok := n.stages[h.Peer]
		if !ok {
			closeAll()
			return nil, nil, inference.Errorf(inference.CodeUnavailable, "stage %d: no peer %s", i, h.Peer)
		}
		s, err := b.OpenStage(ctx, model, h.Lo, h.Hi, maxPositions)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		sessions = append(sessions, s)
	}
	layers := func(ctx context.Context, hidden []float32, k int) ([]float32, error) {
		for _, s := range sessions {
			var err error
			if hidden, err = s.Forward(ctx, hidden, k); err != nil {
				return nil, err
			}
		}
		return hidden, nil
	}
	return layers, closeAll, nil
}

// stageReceiptsOf is what stageNet's pipelines over stages give as their receipts: one
// per stage that names it, and a countersignature (opaque to the executor, which carries
// them to the meter; node tests the real ones).
func stageReceiptsOf(stages []inference.StageHop) []inference.StageReceipt {
	out := make([]inference.StageReceipt, len(stages))
	for i, h := range stages {
		out[i] = inference.StageReceipt{Receipt: fmt.Sprintf("%s[%d-%d]", h.Peer, h.Lo, h.Hi-1), Countersig: "head"}
	}
	return out
}

// lyingStages returns hidden states rotated by one value: every later layer and the head
// compute on garbage, so the tokens differ (a norm would undo a shift or a scale).
type lyingStages struct{ inference.StageBackend }

func (l lyingStages) OpenStage(ctx context.Context, model string, lo, hi, maxPositions int) (inference.StageSession, error) {
	s, err := l.StageBackend.OpenStage(ctx, model, lo, hi, maxPositions)
	if err != nil {
		return nil, err
	}
	return lyingSession{s}, nil
}

type lyingSession struct{ inference.StageSession }

func (l lyingSession) Forward(ctx context.Context, hidden []float32, n int) ([]float32, error) {
	out, err := l.StageSession.Forward(ctx, hidden, n)
	if err != nil {
		return nil, err
	}
	rotated := make([]float32, len(out))
	copy(rotated, out[1:])
	rotated[len(out)-1] = out[0]
	return rotated, nil
}

// evasiveStages lies in the first session it opens (lyingStages) and refuses every later
// one as overloaded, as a stage that would rather not be isolated may.
type evasiveStages struct {
	inference.StageBackend
	opened atomic.Bool
}

func (e *evasiveStages) OpenStage(ctx context.Context, model string, lo, hi, maxPositions int) (inference.StageSession, error) {
	if e.opened.Swap(true) {
		return nil, inference.Errorf(inference.CodeOverloaded, "stage busy")
	}
	return lyingStages{e.StageBackend}.OpenStage(ctx, model, lo, hi, maxPositions)
}

// pipelineWorld is an executor over a stageNet, this node heading its pipelines, and the
// snapshot and registry of its peers as of the executor's clock.
type pipelineWorld struct {
	d    *Executor
	net  *stageNet
	snap *route.Snapshot
	rep  *reputation.Store
}

// loadedModel is synth-small loaded whole, and the digest of its output for pipeReq: what
// every honest plan must give.
func loadedModel(t *testing.T) (*synth.Backend, inference.Digest) {
	t.Helper()
	b, err := synth.New(pipeModel)
	if err != nil {
		t.Fatal(err)
	}
	req := pipeReq()
	h := inference.NewDigester()
	if _, err := b.Generate(context.Background(), &req, func(tok inference.Token) error { h.Add(tok); return nil }); err != nil {
		t.Fatal(err)
	}
	return b, h.Sum()
}

func newPipelineWorld(t *testing.T, b *synth.Backend, cfg Config, rep *reputation.Store, nodes []meshNode) *pipelineWorld {
	t.Helper()
	preset, _ := synth.LookupPreset(pipeModel)
	shape := preset.Shape()
	net := &stageNet{stages: map[string]inference.StageBackend{}, whole: peers{}}
	addrs := map[peer.ID]netip.Addr{}
	var reg entries
	now := time.Now()
	for i, m := range nodes {
		var sb inference.StageBackend = switchable{b, m.id.String(), net}
		switch {
		case m.lies:
			sb = lyingStages{b}
		case m.evasive:
			sb = &evasiveStages{StageBackend: b}
		}
		net.stages[m.id.String()] = sb
		budget := int64(stageBudgetMB)
		if m.whole {
			budget = wholeBudgetMB
			tg := &target{b: b, calls: make(chan struct{}, 1024)}
			if m.lies {
				tg.alter = 2
			}
			net.whole[m.id] = tg
		}
		if m.noBudget {
			budget = 0
		}
		addrs[m.id] = m.addr
		if !m.addr.IsValid() {
			addrs[m.id] = netip.AddrFrom4([4]byte{10, 0, byte(i), 1})
		}
		reg = append(reg, registry.Entry{Peer: m.id, Contacted: true, Connected: !m.offline,
			FirstSeen: now.Add(-time.Hour), LastSeen: now, Vector: &caps.Vector{
				Models: []caps.Model{{Name: pipeModel, State: caps.ModelWarm, Deterministic: true,
					Layers: shape.Layers, WeightBytes: shape.WeightBytes, KVBytesPerToken: shape.KVBytesPerToken}},
				RAM:  caps.RAM{TotalMB: 1024, FreeMB: 512, BudgetMB: budget},
				Load: caps.Load{Accepting: true},
			}})
	}
	cfg.Peers, cfg.Registry, cfg.Rep, cfg.Head, cfg.Pipelines = net, reg, rep, b, net
	cfg.PeerAddr = func(p peer.ID) netip.Addr { return addrs[p] }
	d := newExecutor(t, cfg)
	snap, _ := d.snapshot(context.Background(), now)
	return &pipelineWorld{d: d, net: net, snap: snap, rep: rep}
}

// pipeReq is the request the tests run: a short prompt and 3 tokens (the cost of a
// generation grows with both, 20 times over under -race), sampled at a temperature.
func pipeReq() inference.Request {
	seed, maxTok, temp := int64(11), 3, 0.8
	return inference.Request{Model: pipeModel, Seed: &seed, MaxTokens: &maxTok, Temperature: &temp,
		Messages: []inference.Message{{Role: inference.RoleUser, Content: "hi"}}}
}

// pipeline is the two-stage plan of a over layers [0, 2) and b over [2, 4).
func pipeline(a, b peer.ID) route.Target {
	return route.Target{Tier: route.TierMesh, Model: pipeModel, Stages: []inference.StageHop{
		{Peer: a.String(), Lo: 0, Hi: 2}, {Peer: b.String(), Lo: 2, Hi: 4}}}
}

// pipeline3 is the three-stage plan of a over layer [0, 1), b over [1, 2) and c over [2, 4).
func pipeline3(a, b, c peer.ID) route.Target {
	return route.Target{Tier: route.TierMesh, Model: pipeModel, Stages: []inference.StageHop{
		{Peer: a.String(), Lo: 0, Hi: 1}, {Peer: b.String(), Lo: 1, Hi: 2}, {Peer: c.String(), Lo: 2, Hi: 4}}}
}

// served runs the request on t as the client's attempt did and returns the run to verify.
func (w *pipelineWorld) served(t *testing.T, tg route.Target) *run {
	t.Helper()
	r := &run{d: w.d, snap: w.snap, attempts: 1, req: pipeReq(), last: tg}
	var via inference.Transport
	if _, err := w.d.runOn(context.Background(), tg, &r.req, func(tok inference.Token) error {
		r.sent = append(r.sent, tok)
		return nil
	}, &via, &r.stageReceipts, nil); err != nil {
		t.Fatal(err)
	}
	return r
}

// isolated is the counters of one sampled task whose odd plan was a pipeline: n of its
// stages isolated, convicted of them convicted, and inconclusive stages not isolated.
func isolated(n, convicted, inconclusive uint64) console.Verification {
	return console.Verification{Sampled: 1, Failed: 1, StagesIsolated: n, StagesConvicted: convicted, StagesInconclusive: inconclusive}
}

// A pipeline's result is verified on another plan: a peer holding the model whole if a
// vetted one does, else another pipeline of vetted peers, none of them a stage of the
// served pipeline nor on a host of one. Two of three decide; an odd single peer is
// penalized, every peer of an agreeing plan is credited, and each stage of an odd pipeline
// is isolated: run again with every other layer on vetted peers apart from the pipeline.
// The stage that lies is excluded by its penalty like a lying single peer, the honest
// stages chained with it get no verification event, and a stage that cannot be isolated
// is inconclusive: nobody penalized.
func TestVerifyPipelines(t *testing.T) {
	ip := netip.MustParseAddr
	tests := []struct {
		name   string
		nodes  []meshNode
		served route.Target
		want   console.Verification
		failed []peer.ID // excluded by a failed verification
		passed []peer.ID // credited with a passed one; every other peer has no verification event
		lie    bool      // the client's output differs from the model's
	}{
		{"an honest pipeline, checked by a peer holding the model whole",
			[]meshNode{{id: "a"}, {id: "b"}, {id: "w", whole: true}, {id: "c"}, {id: "d"}},
			pipeline("a", "b"), console.Verification{Sampled: 1, Passed: 1}, nil, []peer.ID{"a", "b", "w"}, false},
		{"an honest pipeline, checked by another pipeline",
			[]meshNode{{id: "a"}, {id: "b"}, {id: "c"}, {id: "d"}},
			pipeline("a", "b"), console.Verification{Sampled: 1, Passed: 1}, nil, []peer.ID{"a", "b", "c", "d"}, false},
		{"a lying last stage: its pipeline outvoted by two others, the liar convicted alone",
			[]meshNode{{id: "a"}, {id: "b", lies: true}, {id: "c"}, {id: "d"}, {id: "e"}, {id: "f"}},
			pipeline("a", "b"), isolated(2, 1, 0), []peer.ID{"b"}, []peer.ID{"c", "d", "e", "f"}, true},
		{"a lying first stage outvoted by a pipeline and a whole peer, isolated among them",
			[]meshNode{{id: "a", lies: true}, {id: "b"}, {id: "w", whole: true}, {id: "c"}, {id: "d"}},
			pipeline("a", "b"), isolated(2, 1, 0), []peer.ID{"a"}, []peer.ID{"w", "c", "d"}, true},
		{"a lying middle stage of three: convicted, the stages before and after it not",
			[]meshNode{{id: "a"}, {id: "b", lies: true}, {id: "c"}, {id: "d"}, {id: "e"}, {id: "f"}, {id: "g"}},
			pipeline3("a", "b", "c"), isolated(3, 1, 0), []peer.ID{"b"}, []peer.ID{"d", "e", "f", "g"}, true},
		{"no vetted peer can hold the other layers: each stage inconclusive, nobody penalized",
			[]meshNode{{id: "a"}, {id: "b", lies: true}, {id: "w", whole: true, noBudget: true}, {id: "x", whole: true, noBudget: true}},
			pipeline("a", "b"), isolated(0, 0, 2), nil, []peer.ID{"w", "x"}, true},
		{"a vetted helper that lies frames nobody: the second run, with other helpers, does not confirm",
			// w and x outvote the pipeline; h1, first among equal candidates, is the first
			// helper of each isolation run and lies as a stage; h2 helps the second runs.
			[]meshNode{{id: "a"}, {id: "b", lies: true}, {id: "w", whole: true, noBudget: true}, {id: "x", whole: true, noBudget: true},
				{id: "h1", lies: true}, {id: "h2"}},
			pipeline("a", "b"), isolated(1, 1, 1), []peer.ID{"b"}, []peer.ID{"w", "x"}, true},
		{"a liar refusing its isolation run: inconclusive for it, its honest partner cleared",
			[]meshNode{{id: "a"}, {id: "b", evasive: true}, {id: "c"}, {id: "d"}, {id: "e"}, {id: "f"}},
			pipeline("a", "b"), isolated(1, 0, 1), nil, []peer.ID{"c", "d", "e", "f"}, true},
		{"a lying single peer outvoted by two pipelines is penalized",
			[]meshNode{{id: "s", whole: true, lies: true}, {id: "c"}, {id: "d"}, {id: "e"}, {id: "f"}},
			route.Target{Tier: route.TierMesh, Peer: "s", Model: pipeModel}, console.Verification{Sampled: 1, Failed: 1},
			[]peer.ID{"s"}, []peer.ID{"c", "d", "e", "f"}, true},
		{"mismatch and no third plan: inconclusive",
			[]meshNode{{id: "a"}, {id: "b", lies: true}, {id: "c"}, {id: "d"}},
			pipeline("a", "b"), console.Verification{Sampled: 1, Inconclusive: 1}, nil, nil, true},
		{"every stage of a verification plan must be vetted",
			[]meshNode{{id: "a"}, {id: "b"}, {id: "c"}, {id: "d", offline: true}},
			pipeline("a", "b"), console.Verification{Sampled: 1, Skipped: 1, SkippedUnvetted: 1}, nil, nil, false},
		{"a stage on the host of a served stage cannot vote",
			[]meshNode{{id: "a", addr: ip("192.0.2.1")}, {id: "b"}, {id: "c", addr: ip("192.0.2.9")}, {id: "d"}},
			pipeline("a", "b"), console.Verification{Sampled: 1, Skipped: 1, SkippedUnvetted: 1}, nil, nil, false},
		{"the served pipeline's stages are not reused",
			[]meshNode{{id: "a"}, {id: "b"}, {id: "c"}},
			pipeline("a", "b"), console.Verification{Sampled: 1, Skipped: 1}, nil, nil, false},
	}
	b, truth := loadedModel(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newPipelineWorld(t, b, verifyAll, integrityStore(t), tt.nodes)
				r := w.served(t, tt.served)
				if lied := inference.DigestOf(r.sent) != truth; lied != tt.lie {
					t.Fatalf("the client's output differs from the model's: %v, want %v", lied, tt.lie)
				}
				if !w.d.maybeVerify(r, nil) {
					t.Fatal("not sampled")
				}
				synctest.Wait() // the verification has run: Close would cancel it
				w.d.Close()
				if got := w.d.verificationStatus(); got != tt.want {
					t.Fatalf("counters %+v, want %+v", got, tt.want)
				}
				now := time.Now()
				for _, m := range tt.nodes {
					key := m.id.String()
					score, excluded := w.rep.Score(key, now), w.rep.Excluded(key, now)
					switch {
					case slices.Contains(tt.failed, m.id):
						if !excluded {
							t.Errorf("%s: score %v, want excluded", m.id, score)
						}
					case slices.Contains(tt.passed, m.id):
						if score <= reputation.NeutralScore {
							t.Errorf("%s: score %v, want a passed verification's credit", m.id, score)
						}
					case score != reputation.NeutralScore:
						t.Errorf("%s: score %v, want no verification event", m.id, score)
					}
				}
			})
		})
	}
}

// meterLog is a coordinator's meter that keeps its events: each event names where the
// request was served as the node's meter does (the route).
type meterLog struct{ events chan gateway.MeterEvent }

func (m meterLog) Event(_ context.Context, model string, at inference.Served, res inference.Result, err error, took time.Duration) (gateway.MeterEvent, bool) {
	outcome := gateway.OutcomeCompleted
	if err != nil {
		outcome = string(inference.CodeOf(err))
	}
	return gateway.MeterEvent{Model: model, Peer: at.Route(), TokensIn: res.Usage.PromptTokens,
		TokensOut: res.Usage.CompletionTokens, DurationMS: took.Milliseconds(), Outcome: outcome}, true
}

func (m meterLog) Write(ev gateway.MeterEvent) { m.events <- ev }

func (m meterLog) Countersign(string) (string, string, error) {
	return "", "", errors.New("this meter countersigns nothing")
}

// A coordinator meters a pipeline's request at the head like any: one event, its peer the
// pipeline's route, its tokens, no task receipt asked of the stages and none refused, but
// the receipts of its own stages (not the verification's) that the pipeline's close gave,
// with this node as their countersigner; sampled, the event waits for the verdict, and a
// lying stage's task is metered as failed.
func TestPipelineMeteredAtTheHead(t *testing.T) {
	b, truth := loadedModel(t)
	for _, liar := range []bool{false, true} {
		name := "honest stages"
		if liar {
			name = "a lying stage"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := meterLog{events: make(chan gateway.MeterEvent, 4)}
				cfg := verifyAll
				cfg.Meter = m
				// Six stage peers: the request's pipeline takes two, its verification two
				// others, a mismatch's third plan the last two. With liar, the first stage
				// of the client's pipeline lies, whichever peer the router picks for it.
				nodes := []meshNode{{id: "a"}, {id: "b"}, {id: "c"}, {id: "d"}, {id: "e"}, {id: "f"}}
				w := newPipelineWorld(t, b, cfg, integrityStore(t), nodes)
				if liar {
					w.net.lieOnNext()
				}
				req := pipeReq()
				req.Prefs = inference.DefaultPrefs()
				var toks []inference.Token
				res, at, err := w.d.Generate(context.Background(), &req, func(_ inference.Served, tok inference.Token) error {
					toks = append(toks, tok)
					return nil
				})
				if err != nil || len(at.Stages) != 2 {
					t.Fatalf("served at %+v: %v; want a pipeline of 2 stages", at, err)
				}
				if lied := inference.DigestOf(toks) != truth; lied != liar {
					t.Fatalf("the client's output differs from the model's: %v, want %v", lied, liar)
				}
				synctest.Wait() // the verification, then the meter's write
				var ev gateway.MeterEvent
				select {
				case ev = <-m.events:
				default:
					t.Fatal("no meter event")
				}
				if len(m.events) != 0 {
					t.Fatalf("%d more meter events, want one per request", len(m.events))
				}
				want := gateway.MeterEvent{Model: pipeModel, Peer: at.Route(), TokensIn: res.Usage.PromptTokens,
					TokensOut: len(toks), DurationMS: ev.DurationMS, Outcome: gateway.OutcomeCompleted,
					Verification: inference.VerdictPassed, Verified: true,
					StageReceipts: stageReceiptsOf(at.Stages), Coordinator: w.d.cfg.Self.String()}
				if liar {
					want.Outcome, want.Verification, want.Verified = gateway.OutcomeVerificationFailed, inference.VerdictFailed, false
				}
				if !reflect.DeepEqual(ev, want) || !strings.HasPrefix(ev.Peer, "pipeline:") {
					t.Fatalf("metered %+v\nwant    %+v", ev, want)
				}
				if n := w.d.stats.receiptsRefused.Load(); n != 0 {
					t.Fatalf("%d receipts refused: a pipeline has none to refuse", n)
				}
			})
		})
	}
}

// A lying verification pipeline is outvoted like a lying verifier: the served pipeline's
// output and a third plan's agree, the task passes (the verification counts as failed: it
// settled a mismatch two to one), the peers of both are credited, and the lying plan's
// stages are isolated: the liar is excluded, its partner gets no verification event. The
// second plan's first stage lies, whichever peers Decide picks for it.
func TestVerifyPipelineLyingVoter(t *testing.T) {
	b, _ := loadedModel(t)
	synctest.Test(t, func(t *testing.T) {
		nodes := []meshNode{{id: "a"}, {id: "b"}, {id: "c"}, {id: "d"}, {id: "e"}, {id: "f"}}
		w := newPipelineWorld(t, b, verifyAll, integrityStore(t), nodes)
		r := w.served(t, pipeline("a", "b"))
		w.net.lieOnNext()
		if v := w.d.verify(r); v != inference.VerdictPassed {
			t.Fatalf("verdict %s, want passed", v)
		}
		want := console.Verification{Failed: 1, StagesIsolated: 2, StagesConvicted: 1}
		if got := w.d.verificationStatus(); got != want {
			t.Fatalf("counters %+v, want %+v", got, want)
		}
		liar := w.net.liarPeer()
		if liar == "" || liar == peer.ID("a").String() || liar == peer.ID("b").String() {
			t.Fatalf("the lying stage is %q, want a peer of the second plan", liar)
		}
		now := time.Now()
		var credited, neutral, excluded []string
		for _, m := range nodes {
			switch key, score := m.id.String(), w.rep.Score(m.id.String(), now); {
			case score > reputation.NeutralScore:
				credited = append(credited, key)
			case score == reputation.NeutralScore:
				neutral = append(neutral, key)
			case w.rep.Excluded(key, now):
				excluded = append(excluded, key)
			default:
				t.Errorf("%s: score %v, want a credit, nothing, or the liar's exclusion", m.id, score)
			}
		}
		// The served pipeline and the third plan credited; the lying plan: the liar
		// excluded, its partner neither credited nor penalized.
		a, b := peer.ID("a").String(), peer.ID("b").String()
		if len(credited) != 4 || !slices.Contains(credited, a) || !slices.Contains(credited, b) ||
			len(neutral) != 1 || !slices.Equal(excluded, []string{liar}) {
			t.Fatalf("credited %v, no event %v, excluded %v (the liar %s)", credited, neutral, excluded, liar)
		}
	})
}

// Past maxIsolations stages, as many stages as that are isolated, drawn at random: distinct,
// in pipeline order, and not always the same ones.
func TestIsolationHops(t *testing.T) {
	d := newExecutor(t, Config{Peers: peers{}, Registry: entries{}, Rep: newRep(t), Seed: 1})
	var stages []inference.StageHop
	for i := range maxIsolations + 4 {
		stages = append(stages, inference.StageHop{Peer: fmt.Sprint("p", i), Lo: i, Hi: i + 1})
	}
	if got := d.isolationHops(stages[:maxIsolations]); !slices.Equal(got, stages[:maxIsolations]) {
		t.Fatalf("%d stages: isolated %v, want every one", maxIsolations, got)
	}
	seen := map[int]bool{}
	for range 20 {
		got := d.isolationHops(stages)
		if len(got) != maxIsolations || !slices.IsSortedFunc(got, func(x, y inference.StageHop) int { return x.Lo - y.Lo }) {
			t.Fatalf("isolated %v: want %d stages in pipeline order", got, maxIsolations)
		}
		for i, h := range got {
			if i > 0 && h.Lo == got[i-1].Lo {
				t.Fatalf("isolated %v: stage %d twice", got, h.Lo)
			}
			seen[h.Lo] = true
		}
	}
	if len(seen) != len(stages) {
		t.Fatalf("over 20 draws only stages %v were isolated, of %d", seen, len(stages))
	}
}
