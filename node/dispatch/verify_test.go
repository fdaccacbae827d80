package dispatch

import (
	"context"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/reputation"
)

// peerScript is what a scripted peer answers (an output, or an error), what its vector
// claims, and how this node knows it. The zero value of the last group is an established
// voter as far as time, connection and address go: known for an hour, connected, on a /24
// of its own (10.0.i.1, i its rank by peer ID). Its score is the store's.
type peerScript struct {
	out           []inference.Token
	err           error
	deterministic bool // what its vector claims about the model

	known     time.Duration // since its first announcement here; 0: an hour
	offline   bool          // no direct connection now
	stale     bool          // not heard from lately
	addr      netip.Addr    // its connection's remote address; zero: 10.0.i.1
	noAddr    bool          // no address known (reached only through a relay)
	successes int           // tasks it served this node, recorded before the verification
}

// scriptedPeers answers the peer protocol from scripts; read-only once built.
type scriptedPeers map[peer.ID]peerScript

func (s scriptedPeers) Generate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	sc := s[p]
	if sc.err != nil {
		return inference.Result{}, sc.err
	}
	for _, tok := range sc.out {
		if err := emit(tok); err != nil {
			return inference.Result{}, err
		}
	}
	return inference.Result{FinishReason: inference.FinishLength}, nil
}

// verifyMesh is a verification's world: an executor whose peers answer from scripts, this
// node's view of them (registry entries, addresses, scores) and a request to verify.
type verifyMesh struct {
	d    *Executor
	rep  *reputation.Store
	snap *route.Snapshot
	req  inference.Request
}

// newVerifyMesh builds a verifyMesh for model over peers, the peer "served" among them
// having served the request, at the executor's clock (cfg.Now, else time.Now). local is
// this node's own backend as the request's snapshot saw it.
func newVerifyMesh(t *testing.T, seed uint64, cfg Config, rep *reputation.Store, model string, local []route.LocalModel, peers scriptedPeers) *verifyMesh {
	t.Helper()
	cfg.Peers, cfg.Registry, cfg.Rep, cfg.Seed = peers, entries{}, rep, seed
	ids := slices.Sorted(maps.Keys(peers))
	addrs := map[peer.ID]netip.Addr{}
	for i, p := range ids {
		switch sc := peers[p]; {
		case sc.noAddr:
		case sc.addr.IsValid():
			addrs[p] = sc.addr
		default:
			addrs[p] = netip.AddrFrom4([4]byte{10, 0, byte(i), 1})
		}
	}
	cfg.PeerAddr = func(p peer.ID) netip.Addr { return addrs[p] }
	d := newExecutor(t, cfg)
	now := d.now()
	snap := &route.Snapshot{Rep: rep, Tune: route.DefaultTuning(), Local: route.Local{Models: local}}
	for _, p := range ids {
		sc := peers[p]
		known := sc.known
		if known == 0 {
			known = time.Hour
		}
		snap.Peers = append(snap.Peers, route.Peer{Entry: registry.Entry{Peer: p, Vector: &caps.Vector{
			Models: []caps.Model{{Name: model, State: caps.ModelWarm, Deterministic: sc.deterministic}},
			Load:   caps.Load{Accepting: true},
		}, FirstSeen: now.Add(-known), LastSeen: now, Connected: !sc.offline, Stale: sc.stale}})
		for range sc.successes {
			rep.Record(reputation.Target{Model: model, Peer: p.String()}, reputation.Success, now)
		}
	}
	seed64 := int64(seed)
	return &verifyMesh{d: d, rep: rep, snap: snap,
		req: inference.Request{Model: model, Seed: &seed64, Messages: []inference.Message{{Role: inference.RoleUser, Content: "hi"}}}}
}

// run is the request as peer "served" answered it with sent.
func (m *verifyMesh) run(sent []inference.Token, resumed bool) *run {
	return &run{d: m.d, snap: m.snap, sent: sent, resumed: resumed, attempts: 1, req: m.req,
		last: route.Target{Tier: route.TierMesh, Peer: "served", Model: m.req.Model}}
}

// integrityStore is a store that scores integrity alone (no credit for successes or
// speed), so that a score above or below neutral can only come from a verification.
func integrityStore(t *testing.T) *reputation.Store {
	t.Helper()
	params := reputation.DefaultParams()
	params.SuccessWeight, params.PerformanceWeight, params.SuccessCap = 0, 0, 25
	rep, err := reputation.New(params)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// verifyOnce has an executor verify one request of synth-tiny that peer "served" answered
// with sent, the other peers of the mesh answering from their scripts, and waits for the
// verdict. The store scores integrity alone (integrityStore).
func verifyOnce(t *testing.T, seed uint64, cfg Config, sent []inference.Token, peers scriptedPeers, resumed bool) (console.Verification, *reputation.Store) {
	t.Helper()
	m := newVerifyMesh(t, seed, cfg, integrityStore(t), "synth-tiny", nil, peers)
	m.d.maybeVerify(m.run(sent, resumed), nil)
	m.d.Close() // waits for the verification
	return m.d.verificationStatus(), m.rep
}

// verifyAll verifies every task, with voters vetted from a score of 50 up: an integrity
// store gives nobody credit for work, so the default 60 is out of reach there.
var verifyAll = Config{VerifySample: 1, Voters: Voters{MinScore: reputation.NeutralScore}}

// The executor's verification end to end over scripted peers: who runs the request
// again, what each outcome counts as, and who gets which reputation event.
func TestVerifyVerdicts(t *testing.T) {
	truth := []inference.Token{{Index: 0, Text: "a", ID: 1}, {Index: 1, Text: " mesh", ID: 2}}
	lie1 := []inference.Token{{Index: 0, Text: "a", ID: 1}, {Index: 1, Text: " node", ID: 3}}
	lie2 := []inference.Token{{Index: 0, Text: "the", ID: 4}, {Index: 1, Text: " peer", ID: 5}}
	honest := peerScript{out: truth, deterministic: true}
	lost := peerScript{err: inference.Errorf(inference.CodePeerLost, "stream reset"), deterministic: true}
	tests := []struct {
		name    string
		cfg     Config
		sent    []inference.Token
		others  scriptedPeers
		resumed bool
		want    console.Verification
		failed  []peer.ID // excluded by a failed verification
		passed  []peer.ID // credited with a passed one
	}{
		{"outputs match", verifyAll, truth, scriptedPeers{"h1": honest},
			false, console.Verification{Sampled: 1, Passed: 1}, nil, []peer.ID{"served", "h1"}},
		{"the served peer lied: two out of three", verifyAll, lie1, scriptedPeers{"h1": honest, "h2": honest},
			false, console.Verification{Sampled: 1, Failed: 1}, []peer.ID{"served"}, []peer.ID{"h1", "h2"}},
		{"mismatch and no third peer", verifyAll, truth, scriptedPeers{"l1": {out: lie1, deterministic: true}},
			false, console.Verification{Sampled: 1, Inconclusive: 1}, nil, nil},
		{"three different outputs", verifyAll, truth, scriptedPeers{"l1": {out: lie1, deterministic: true}, "l2": {out: lie2, deterministic: true}},
			false, console.Verification{Sampled: 1, Inconclusive: 1}, nil, nil},
		{"the verifier was lost", verifyAll, truth, scriptedPeers{"x": lost},
			false, console.Verification{Sampled: 1, Inconclusive: 1}, nil, nil},
		{"no other peer", verifyAll, truth, scriptedPeers{},
			false, console.Verification{Sampled: 1, Skipped: 1}, nil, nil},
		{"the other peer's claim of non-determinism does not matter", verifyAll, truth, scriptedPeers{"n": {out: truth}},
			false, console.Verification{Sampled: 1, Passed: 1}, nil, []peer.ID{"served", "n"}},
		{"the only other peer is not a vetted voter", verifyAll, truth, scriptedPeers{"h1": {out: truth, known: time.Minute}},
			false, console.Verification{Sampled: 1, Skipped: 1, SkippedUnvetted: 1}, nil, nil},
		{"no vetted third voter", verifyAll, truth, scriptedPeers{"l1": {out: lie1}, "h1": {out: truth, offline: true}},
			false, console.Verification{Sampled: 1, Inconclusive: 1}, nil, nil},
		{"a resumed stream is not verified", verifyAll, truth, scriptedPeers{"h1": honest},
			true, console.Verification{}, nil, nil},
		{"verification off", Config{VerifySample: VerifyOff, VerifyProbationSample: 1}, truth, scriptedPeers{"h1": honest},
			false, console.Verification{}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peers := maps.Clone(tt.others)
			peers["served"] = peerScript{out: tt.sent, deterministic: true}
			got, rep := verifyOnce(t, 1, tt.cfg, tt.sent, peers, tt.resumed)
			if got != tt.want {
				t.Fatalf("counters %+v, want %+v", got, tt.want)
			}
			now := time.Now()
			for p := range peers {
				score, excluded := rep.Score(p.String(), now), rep.Excluded(p.String(), now)
				switch {
				case slices.Contains(tt.failed, p):
					if !excluded {
						t.Errorf("%s: score %v, want excluded", p, score)
					}
				case slices.Contains(tt.passed, p):
					if score <= reputation.NeutralScore {
						t.Errorf("%s: score %v, want a passed verification's credit", p, score)
					}
				case excluded || p != "x" && score != reputation.NeutralScore:
					// The lost peer's failure is an availability debit, which never reaches
					// below the floor of 40: only an integrity penalty excludes.
					t.Errorf("%s: score %v, want no verification event", p, score)
				}
			}
		})
	}
}

// A lying verifier is outvoted just like a lying server. Which peer verifies first is the
// router's weighted draw, so over seeds both orders occur: the honest peer first (the
// outputs match and the liar is never asked) or the liar first (a third execution on the
// honest peer outvotes it).
func TestVerifyLyingVerifier(t *testing.T) {
	truth := []inference.Token{{Index: 0, Text: "a", ID: 1}, {Index: 1, Text: " mesh", ID: 2}}
	lie := []inference.Token{{Index: 0, Text: "a", ID: 1}, {Index: 1, Text: " node", ID: 3}}
	peers := scriptedPeers{
		"served": {out: truth, deterministic: true},
		"h1":     {out: truth, deterministic: true},
		"l1":     {out: lie, deterministic: true},
	}
	var sawMatch, sawOutvoted bool
	for seed := uint64(1); seed <= 32; seed++ {
		got, rep := verifyOnce(t, seed, verifyAll, truth, peers, false)
		now := time.Now()
		switch got {
		case console.Verification{Sampled: 1, Passed: 1}:
			sawMatch = true
			if s := rep.Score(peer.ID("l1").String(), now); s != reputation.NeutralScore {
				t.Fatalf("seed %d: the liar was never asked but scored %v", seed, s)
			}
		case console.Verification{Sampled: 1, Failed: 1}:
			sawOutvoted = true
			if !rep.Excluded(peer.ID("l1").String(), now) {
				t.Fatalf("seed %d: the lying verifier was outvoted but not excluded", seed)
			}
		default:
			t.Fatalf("seed %d: counters %+v", seed, got)
		}
		for _, p := range []peer.ID{"served", "h1"} {
			if s := rep.Score(p.String(), now); s <= reputation.NeutralScore {
				t.Fatalf("seed %d: honest %s scored %v", seed, p, s)
			}
		}
	}
	if !sawMatch || !sawOutvoted {
		t.Fatalf("over 32 seeds: honest verifier first %v, liar first %v; want both", sawMatch, sawOutvoted)
	}
}

// synthPeers are peers that each run their own instance of the synthetic backend: honest
// peers, computing for real.
type synthPeers map[peer.ID]*synth.Backend

func (s synthPeers) Generate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	return s[p].Generate(ctx, req, emit)
}

// Honest peers never get an integrity penalty: thousands of verified tasks over three
// independently loaded copies of the model, with random seeds, temperatures, top_p, lengths,
// prompts and stop strings, all pass, and every peer ends above neutral. Under -race the
// model computes about 20 times slower, so that build runs 150 tasks; `make test` runs the
// 3,000 again without the race detector (about 11 s).
func TestHonestPeersPassThousandsOfVerifications(t *testing.T) {
	const model = "synth-tiny"
	tasks := 3000
	if raceDetector {
		tasks = 150
	}
	peers := synthPeers{}
	addrs := map[peer.ID]netip.Addr{}
	snap := &route.Snapshot{Tune: route.DefaultTuning()}
	for i, p := range []peer.ID{"p1", "p2", "p3"} {
		b, err := synth.New(model)
		if err != nil {
			t.Fatal(err)
		}
		peers[p] = b
		addrs[p] = netip.AddrFrom4([4]byte{10, 0, byte(i), 1})
		// Established voters, each on a /24 of its own.
		snap.Peers = append(snap.Peers, route.Peer{Entry: registry.Entry{Peer: p, Vector: &caps.Vector{
			Models: []caps.Model{{Name: model, State: caps.ModelWarm, Deterministic: true}},
			Load:   caps.Load{Accepting: true},
		}, FirstSeen: time.Now().Add(-time.Hour), Connected: true}})
	}
	rep, err := reputation.New(reputation.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	snap.Rep = rep
	// Voters from a score of 50: the peers start there, and earn the rest in this test.
	d := newExecutor(t, Config{Peers: peers, Registry: entries{}, Rep: rep, VerifySample: 1, Seed: 7,
		Voters: Voters{MinScore: reputation.NeutralScore}, PeerAddr: func(p peer.ID) netip.Addr { return addrs[p] }})
	rng := rand.New(rand.NewPCG(1, 2))
	words := strings.Fields("the mesh routes each request to a peer that serves its model and checks a sample")
	for i := range tasks {
		seed, temp, topP := rng.Int64N(1<<40), []float64{0, 0.5, 1, 1.7}[rng.IntN(4)], []float64{1, 0.95, 0.5}[rng.IntN(3)]
		maxTok := 1 + rng.IntN(16)
		req := inference.Request{Model: model, Seed: &seed, Temperature: &temp, TopP: &topP, MaxTokens: &maxTok,
			Messages: []inference.Message{{Role: inference.RoleUser, Content: strings.Join(words[rng.IntN(8):8+rng.IntN(8)], " ")}}}
		if rng.IntN(4) == 0 {
			req.Stop = []string{words[rng.IntN(len(words))][:1]}
		}
		served := snap.Peers[rng.IntN(3)].Entry.Peer
		var sent []inference.Token
		if _, err := peers.Generate(context.Background(), served, &req, func(tok inference.Token) error {
			sent = append(sent, tok)
			return nil
		}); err != nil {
			t.Fatalf("task %d: %v", i, err)
		}
		r := &run{d: d, snap: snap, sent: sent, attempts: 1, req: req,
			last: route.Target{Tier: route.TierMesh, Peer: served, Model: model}}
		if v := d.verify(r); v != inference.VerdictPassed {
			t.Fatalf("task %d (%+v) served by %s: verdict %s", i, req, served, v)
		}
	}
	if v := d.verificationStatus(); v.Passed != uint64(tasks) || v.Failed != 0 {
		t.Fatalf("verification %+v, want %d passed", v, tasks)
	}
	for _, p := range snap.Peers {
		if s := rep.Score((route.Target{Tier: route.TierMesh, Peer: p.Entry.Peer}).RepKey(), time.Now()); s <= reputation.NeutralScore {
			t.Fatalf("honest peer %s scored %v", p.Entry.Peer, s)
		}
	}
}
