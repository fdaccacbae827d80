package route

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/reputation"
)

// TestDecide covers privacy × priority × capability × mesh state, model choice and
// speculative dispatch. With the defaults, for a 256-token completion at 50 tokens/s (5.12 s):
// local warm totals 5.14 s, local cold 7.14 s, a warm peer at 10 ms RTT 5.15 s, the default
// cloud 5.52 s, and fastCloud (200 tokens/s) 1.68 s.
func TestDecide(t *testing.T) {
	f := newFleet(t, "a", "b", "c", "d", "e")
	a, b := f.key("a"), f.key("b")
	const (
		pAny    = inference.PrivacyAny
		mesh    = inference.PrivacyMesh
		lonly   = inference.PrivacyLocalOnly
		cost    = inference.PriorityCost
		latency = inference.PriorityLatency
		bal     = inference.PriorityBalanced
		expl    = inference.RouteExplicit
		auto    = inference.RouteAuto
	)
	on := Cloud{Enabled: true, USDPerMTok: 1}
	fastCloud := Cloud{Enabled: true, TokensPerSec: 200, USDPerMTok: 10}
	cool := func(model string, keys ...string) func(*reputation.Store) {
		return func(r *reputation.Store) {
			for _, k := range keys {
				r.Record(reputation.Target{Model: model, Peer: k}, reputation.Unavailable, now)
			}
		}
	}
	exclude := func(keys ...string) func(*reputation.Store) {
		return func(r *reputation.Store) {
			for _, k := range keys {
				r.Observe(k, reputation.VerificationFailed, now)
			}
		}
	}
	both := func(fs ...func(*reputation.Store)) func(*reputation.Store) {
		return func(r *reputation.Store) {
			for _, fn := range fs {
				fn(r)
			}
		}
	}
	pa := f.peer("a", warm("m"))

	tests := []struct {
		name      string
		prefs     inference.Prefs
		model     string
		notAccept bool // the local backend does not accept work
		local     []LocalModel
		peers     []Peer
		cloud     Cloud
		meshUSD   float64
		rep       func(*reputation.Store)
		want      []string
		wantModel string // "" means the request's model
		wantSpec  bool
		wantWhy   [3]string // local, mesh, cloud; "" means not checked
	}{
		// Privacy.
		{name: "default prefs: mesh, never the cloud", local: []LocalModel{lw("m")}, peers: []Peer{pa}, cloud: fastCloud,
			want: []string{"local", "peer:a"}, wantWhy: [3]string{2: "privacy mesh"}},
		{name: "mesh/balanced: local warm, then peer", prefs: prefs(mesh, bal, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa}, cloud: fastCloud,
			want: []string{"local", "peer:a"}},
		{name: "local-only: local only", prefs: prefs(lonly, latency, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa}, cloud: fastCloud,
			want: []string{"local"}, wantWhy: [3]string{1: "privacy local-only", 2: "privacy local-only"}},
		{name: "local-only: no local model, nothing", prefs: prefs(lonly, bal, expl), local: []LocalModel{lw("x")}, peers: []Peer{pa}, cloud: on,
			want: []string{}, wantWhy: [3]string{0: "local does not serve m"}},
		{name: "local-only: cold local, never speculative", prefs: prefs(lonly, latency, expl), local: []LocalModel{lc("m")}, cloud: fastCloud,
			want: []string{"local"}},
		{name: "unknown privacy: local only", prefs: prefs("everywhere", bal, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa}, cloud: on,
			want: []string{"local"}},

		// Capability.
		{name: "mesh: no local model, peer", prefs: prefs(mesh, bal, expl), peers: []Peer{pa},
			want: []string{"peer:a"}, wantWhy: [3]string{0: "local does not serve m"}},
		{name: "mesh: local not accepting, peer", prefs: prefs(mesh, bal, expl), notAccept: true, local: []LocalModel{lw("m")}, peers: []Peer{pa},
			want: []string{"peer:a"}, wantWhy: [3]string{0: "local not accepting"}},
		{name: "mesh: stale, paused, full and excluded peers skipped", prefs: prefs(mesh, bal, expl),
			peers: []Peer{stale(f.peer("a", warm("m"))), paused(f.peer("b", warm("m"))), full(f.peer("c", warm("m"))), f.peer("d", warm("m")), f.peer("e", warm("m"))},
			rep:   exclude(f.key("d")), want: []string{"peer:e"}},
		{name: "mesh: peer not announcing the model", prefs: prefs(mesh, bal, expl), peers: []Peer{f.peer("a", warm("x"))},
			want: []string{}, wantWhy: [3]string{1: "no peer serves m"}},
		{name: "mesh: only peer excluded", prefs: prefs(mesh, bal, expl), peers: []Peer{pa}, rep: exclude(a),
			want: []string{}, wantWhy: [3]string{1: "peers serving m excluded"}},
		{name: "mesh: unknown capacity counts as spare", prefs: prefs(mesh, bal, expl), peers: []Peer{load(f.peer("a", warm("m")), 7, 0), load(f.peer("b", warm("m")), 3, 4)},
			want: []string{"peer:a", "peer:b"}},
		{name: "mesh: no target at all", prefs: prefs(mesh, bal, expl),
			want: []string{}, wantWhy: [3]string{"local does not serve m", "no peer serves m", "privacy mesh"}},

		// Priority, with every tier able to serve.
		{name: "any/cost: free tiers first, local wins the tie", prefs: prefs(pAny, cost, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa}, cloud: fastCloud,
			want: []string{"local", "peer:a", "cloud"}},
		{name: "any/cost: a priced mesh goes behind a cheaper cloud", prefs: prefs(pAny, cost, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa}, cloud: on, meshUSD: 2,
			want: []string{"local", "cloud", "peer:a"}},
		{name: "any/latency: fast cloud first", prefs: prefs(pAny, latency, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa}, cloud: fastCloud,
			want: []string{"cloud", "local", "peer:a"}},
		{name: "any/balanced: fast cheap cloud first", prefs: prefs(pAny, bal, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa}, cloud: fastCloud,
			want: []string{"cloud", "local", "peer:a"}},
		{name: "any/balanced: fast dear cloud last", prefs: prefs(pAny, bal, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa},
			cloud: Cloud{Enabled: true, TokensPerSec: 200, USDPerMTok: 1000},
			want:  []string{"local", "peer:a", "cloud"}},
		{name: "any/latency: slow cloud behind warm local and peer", prefs: prefs(pAny, latency, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa}, cloud: on,
			want: []string{"local", "peer:a", "cloud"}},
		{name: "any: cloud off", prefs: prefs(pAny, latency, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa},
			want: []string{"local", "peer:a"}, wantWhy: [3]string{2: "cloud not configured"}},
		{name: "any: cloud does not serve the model", prefs: prefs(pAny, latency, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa},
			cloud: Cloud{Enabled: true, Models: []string{"x"}, TokensPerSec: 200},
			want:  []string{"local", "peer:a"}, wantWhy: [3]string{2: "cloud does not serve m"}},
		{name: "any: a cloud without a list may try any name", prefs: prefs(pAny, bal, expl), cloud: on,
			want: []string{"cloud"}},
		{name: "mesh/latency: cold local behind a warm peer", prefs: prefs(mesh, latency, expl), local: []LocalModel{lc("m")}, peers: []Peer{pa},
			want: []string{"peer:a", "local"}},
		{name: "mesh/latency: measured fast local beats the peer", prefs: prefs(mesh, latency, expl),
			local: []LocalModel{{Name: "m", Warm: true, TokensPerSec: 60}}, peers: []Peer{pa},
			want: []string{"local", "peer:a"}},
		{name: "mesh: cold and warm peers both tried", prefs: prefs(mesh, latency, expl),
			peers: []Peer{f.peer("a", cold("m")), f.peer("b", warm("m"))},
			want:  []string{"peer:a", "peer:b"}},
		{name: "mesh/cost: cold local still first", prefs: prefs(mesh, cost, expl), local: []LocalModel{lc("m")}, peers: []Peer{pa},
			want: []string{"local", "peer:a"}},

		// Speculative dispatch.
		{name: "spec: any/balanced, cold local, cloud", prefs: prefs(pAny, bal, expl), local: []LocalModel{lc("m")}, peers: []Peer{pa}, cloud: on,
			want: []string{"local", "cloud", "peer:a"}, wantSpec: true},
		{name: "spec: any/latency reorders a faster cloud behind cold local", prefs: prefs(pAny, latency, expl), local: []LocalModel{lc("m")}, peers: []Peer{pa}, cloud: fastCloud,
			want: []string{"local", "cloud", "peer:a"}, wantSpec: true},
		{name: "no spec: cost", prefs: prefs(pAny, cost, expl), local: []LocalModel{lc("m")}, peers: []Peer{pa}, cloud: on,
			want: []string{"local", "peer:a", "cloud"}},
		{name: "no spec: warm local", prefs: prefs(pAny, bal, expl), local: []LocalModel{lw("m")}, cloud: on,
			want: []string{"local", "cloud"}},
		{name: "no spec: mesh privacy", prefs: prefs(mesh, bal, expl), local: []LocalModel{lc("m")}, peers: []Peer{pa}, cloud: on,
			want: []string{"peer:a", "local"}},
		{name: "no spec: cloud does not serve the model", prefs: prefs(pAny, bal, expl), local: []LocalModel{lc("m")}, cloud: Cloud{Enabled: true, Models: []string{"x"}},
			want: []string{"local"}},
		{name: "no spec: cold local cooling", prefs: prefs(pAny, bal, expl), local: []LocalModel{lc("m")}, peers: []Peer{pa}, cloud: on,
			rep: cool("m", reputation.LocalTarget), want: []string{"peer:a", "cloud"}},

		// Cooling.
		{name: "cooling peer dropped while another serves", prefs: prefs(mesh, bal, expl), peers: []Peer{pa, f.peer("b", warm("m"))},
			rep: cool("m", a), want: []string{"peer:b"}},
		{name: "cooling local dropped while a peer serves", prefs: prefs(mesh, bal, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa},
			rep: cool("m", reputation.LocalTarget), want: []string{"peer:a"}, wantWhy: [3]string{0: "local m cooling"}},
		{name: "cooling cloud dropped while local serves", prefs: prefs(pAny, latency, expl), local: []LocalModel{lw("m")}, cloud: fastCloud,
			rep: cool("m", CloudTarget), want: []string{"local"}, wantWhy: [3]string{2: "cloud m cooling"}},
		{name: "cooling elsewhere: another model's cooldown does not count", prefs: prefs(mesh, bal, expl), peers: []Peer{pa},
			rep: cool("x", a), want: []string{"peer:a"}},
		{name: "explicit: all cooling, all kept", prefs: prefs(pAny, bal, expl), local: []LocalModel{lw("m")}, peers: []Peer{pa}, cloud: on,
			rep: cool("m", reputation.LocalTarget, a, CloudTarget), want: []string{"local", "peer:a", "cloud"}},
		{name: "auto: all cooling, another model", prefs: prefs(mesh, bal, auto), local: []LocalModel{lw("m"), lw("m2")}, peers: []Peer{pa},
			rep: cool("m", reputation.LocalTarget, a), want: []string{"local"}, wantModel: "m2"},
		{name: "auto: all cooling, no other model", prefs: prefs(mesh, bal, auto), local: []LocalModel{lw("m")}, peers: []Peer{pa},
			rep: cool("m", reputation.LocalTarget, a), want: []string{}},
		{name: "explicit: an excluded peer does not keep cooling ones out", prefs: prefs(mesh, bal, expl), peers: []Peer{pa, f.peer("b", warm("m"))},
			rep: both(cool("m", a), exclude(b)), want: []string{"peer:a"}},
		{name: "auto: cooling and excluded, nothing", prefs: prefs(mesh, bal, auto), peers: []Peer{pa, f.peer("b", warm("m"))},
			rep: both(cool("m", a), exclude(b)), want: []string{}},

		// Model choice.
		{name: "auto, no model: best tier wins", prefs: prefs(mesh, latency, auto), model: "-", local: []LocalModel{lw("m1")}, peers: []Peer{f.peer("a", warm("m2"))},
			want: []string{"local"}, wantModel: "m1"},
		{name: "auto, model auto: a warm peer beats a cold local", prefs: prefs(mesh, latency, auto), model: inference.AutoModel, local: []LocalModel{lc("m1")}, peers: []Peer{f.peer("a", warm("m2"))},
			want: []string{"peer:a"}, wantModel: "m2"},
		{name: "auto, named model nobody serves: another", prefs: prefs(mesh, bal, auto), model: "m3", local: []LocalModel{lw("m1")},
			want: []string{"local"}, wantModel: "m1"},
		{name: "explicit, named model nobody serves: nothing", prefs: prefs(mesh, bal, expl), model: "m3", local: []LocalModel{lw("m1")},
			want: []string{}},
		{name: "auto, named model served: kept though another is faster", prefs: prefs(mesh, latency, auto), model: "m1", local: []LocalModel{lc("m1")}, peers: []Peer{f.peer("a", warm("m2"))},
			want: []string{"local"}},
		{name: "auto: ties go by name", prefs: prefs(mesh, bal, auto), model: "-", local: []LocalModel{lw("mb"), lw("ma")},
			want: []string{"local"}, wantModel: "ma"},
		{name: "auto: nothing at all", prefs: prefs(mesh, bal, auto), model: "-",
			want: []string{}, wantWhy: [3]string{"no model available", "no model available", "privacy mesh"}},
		{name: "auto, local-only: peer models not considered", prefs: prefs(lonly, bal, auto), model: "-", peers: []Peer{f.peer("a", warm("m2"))},
			want: []string{}},
		{name: "auto: unusable peers' models not considered", prefs: prefs(mesh, bal, auto), model: "-", peers: []Peer{stale(f.peer("a", warm("m2"))), full(f.peer("b", warm("m3")))},
			want: []string{}},
		{name: "auto: excluded peer's model not chosen", prefs: prefs(mesh, bal, auto), model: "-", peers: []Peer{f.peer("a", warm("m2"))}, rep: exclude(a),
			want: []string{}},
		{name: "auto: the cloud's list", prefs: prefs(pAny, bal, auto), model: "-", cloud: Cloud{Enabled: true, Models: []string{"c1"}},
			want: []string{"cloud"}, wantModel: "c1"},
		{name: "auto: cost picks the free model", prefs: prefs(pAny, cost, auto), model: "-", cloud: Cloud{Enabled: true, Models: []string{"c1"}, USDPerMTok: 1}, peers: []Peer{f.peer("a", cold("z"))},
			want: []string{"peer:a"}, wantModel: "z"},
		{name: "explicit, model auto: a name like any other", prefs: prefs(mesh, bal, expl), model: inference.AutoModel, local: []LocalModel{lw("m1")},
			want: []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := newStore(t)
			if tc.rep != nil {
				tc.rep(rep)
			}
			model := tc.model
			switch model {
			case "":
				model = "m"
			case "-":
				model = ""
			}
			s := &Snapshot{
				Local:          Local{Accepting: !tc.notAccept, Models: tc.local},
				Peers:          tc.peers,
				Cloud:          tc.cloud,
				Rep:            rep,
				MeshUSDPerMTok: tc.meshUSD,
			}
			got := Decide(request(model, tc.prefs), s, now.Add(time.Second), seeded(1))
			if attempts := f.render(got.Attempts); !sameAttempts(attempts, tc.want) {
				t.Errorf("attempts = %q, want %q", attempts, tc.want)
			}
			wantModel := tc.wantModel
			if wantModel == "" {
				wantModel = model
			}
			if got.Model != wantModel {
				t.Errorf("model = %q, want %q", got.Model, wantModel)
			}
			if got.Speculative != tc.wantSpec {
				t.Errorf("speculative = %v, want %v", got.Speculative, tc.wantSpec)
			}
			if len(got.Estimates) != 3 {
				t.Fatalf("%d estimates, want 3", len(got.Estimates))
			}
			for i, tier := range []Tier{TierLocal, TierMesh, TierCloud} {
				e := got.Estimates[i]
				if e.Tier != tier {
					t.Errorf("estimate %d is for %q, want %q", i, e.Tier, tier)
				}
				if e.OK == (e.Why != "") {
					t.Errorf("%s estimate: ok %v with why %q", tier, e.OK, e.Why)
				}
				if w := tc.wantWhy[i]; w != "" && e.Why != w {
					t.Errorf("%s estimate: why %q, want %q", tier, e.Why, w)
				}
			}
			for _, a := range got.Attempts {
				if a.Model != got.Model {
					t.Errorf("attempt %s runs %q, decision says %q", a, a.Model, got.Model)
				}
			}
		})
	}
}

func TestEstimates(t *testing.T) {
	f := newFleet(t, "a")
	maxTokens := 100
	req := &inference.Request{
		Model:     "m",
		Messages:  []inference.Message{{Role: inference.RoleSystem, Content: string(make([]byte, 150))}, {Role: inference.RoleUser, Content: string(make([]byte, 250))}},
		MaxTokens: &maxTokens,
		Prefs:     prefs(inference.PrivacyAny, inference.PriorityBalanced, inference.RouteExplicit),
	}
	peer := f.peer("a", cold("m"))
	peer.RTT = 30 * time.Millisecond
	s := &Snapshot{
		Local:          Local{Accepting: true, Models: []LocalModel{{Name: "m", TokensPerSec: 100, ColdStart: 3 * time.Second}}},
		Peers:          []Peer{peer},
		Cloud:          Cloud{Enabled: true, USDPerMTok: 3},
		MeshUSDPerMTok: 2,
	}
	// 400 content bytes: 100 prompt tokens, plus 100 completion tokens.
	want := []Estimate{
		{Tier: TierLocal, OK: true, TTFT: 3010 * time.Millisecond, Total: 4010 * time.Millisecond},
		{Tier: TierMesh, OK: true, TTFT: 2050 * time.Millisecond, Total: 4050 * time.Millisecond, USD: 2 * 200 / 1e6},
		{Tier: TierCloud, OK: true, TTFT: 400 * time.Millisecond, Total: 2400 * time.Millisecond, USD: 3 * 200 / 1e6},
	}
	got := Decide(req, s, now, seeded(1))
	if !slices.Equal(got.Estimates, want) {
		t.Fatalf("estimates:\n got %+v\nwant %+v", got.Estimates, want)
	}
	// Balanced: cloud 2.4 + 0.06 s, local 4.01 s, mesh 4.05 + 0.04 s; but the local model is
	// cold and the cloud usable, so the cloud is started speculatively behind it.
	if r := f.render(got.Attempts); !slices.Equal(r, []string{"local", "cloud", "peer:a"}) || !got.Speculative {
		t.Fatalf("attempts %q speculative %v, want [local cloud peer:a] speculative", r, got.Speculative)
	}

	// Tuning overrides the defaults: a slower default speed and a dearer second.
	s.Tune = Tuning{DefaultTokensPerSec: 25, DefaultCloudTTFT: time.Second, BalancedSecondsPerUSD: 1e4}
	got = Decide(req, s, now, seeded(1))
	if e := got.Estimates[2]; e.TTFT != time.Second || e.Total != 5*time.Second {
		t.Errorf("tuned cloud estimate %+v, want TTFT 1s, Total 5s", e)
	}
	if e := got.Estimates[1]; e.TTFT != 30*time.Millisecond+2*time.Second+40*time.Millisecond {
		t.Errorf("tuned mesh TTFT %v, want 2.07s", e.TTFT)
	}
}

// TestEstimatePerformance: the mesh estimate scales the default speed by the first peer's
// performance factor, clamped to [0.25, 4].
func TestEstimatePerformance(t *testing.T) {
	f := newFleet(t, "fast", "slow")
	rep := newStore(t, func(p *reputation.Params) { p.PerformanceRange = 4 }) // factors up to 16
	for i := range 20 {
		at := now.Add(time.Duration(i) * time.Second)
		rep.RecordPerformance(f.key("fast"), 10*time.Millisecond, 1000, at)
		rep.RecordPerformance(f.key("slow"), 10*time.Second, 1, at)
	}
	rep.Observe(f.key("slow"), reputation.VerificationFailed, now) // only fast is eligible
	if p := rep.Performance(f.key("fast"), now.Add(20*time.Second)); p <= 4 {
		t.Fatalf("setup: fast peer's performance %v, want > 4", p)
	}
	peer := f.peer("fast", warm("m"))
	peer.RTT = 0
	s := &Snapshot{Peers: []Peer{peer, f.peer("slow", warm("m"))}, Rep: rep}
	got := Decide(request("m", prefs(inference.PrivacyMesh, inference.PriorityLatency, inference.RouteExplicit)), s, now.Add(20*time.Second), seeded(1))
	// 200 tokens/s: TTFT 5 ms, plus 256 tokens in 1.28 s.
	if e := got.Estimates[1]; e.TTFT != 5*time.Millisecond || e.Total != 1285*time.Millisecond {
		t.Fatalf("mesh estimate %+v, want TTFT 5ms, Total 1.285s", e)
	}
}

// TestMeshFallbacksByWeight: after Select's pick come the heaviest remaining peers, in
// descending weight, at most MaxMeshAttempts in all.
func TestMeshFallbacksByWeight(t *testing.T) {
	names := []string{"p0", "p1", "p2", "p3", "p4", "p5"}
	f := newFleet(t, names...)
	var peers []Peer
	for i, n := range names {
		peers = append(peers, load(f.peer(n, warm("m")), i, 10)) // spare 1.0, 0.9, ... 0.5
	}
	slices.Reverse(peers) // input order must not matter
	s := &Snapshot{Peers: peers}
	req := request("m", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
	firsts := map[string]int{}
	for seed := range uint64(300) {
		got := f.render(Decide(req, s, now, seeded(seed)).Attempts)
		if len(got) != 3 {
			t.Fatalf("seed %d: attempts %q, want 3", seed, got)
		}
		firsts[got[0]]++
		var want []string
		for _, n := range names {
			if p := "peer:" + n; p != got[0] && len(want) < 2 {
				want = append(want, p)
			}
		}
		if !slices.Equal(got[1:], want) {
			t.Fatalf("seed %d: attempts %q, want fallbacks %q", seed, got, want)
		}
	}
	if len(firsts) != len(names) {
		t.Errorf("first picks %v: want every peer picked first at some seed", firsts)
	}
	if firsts["peer:p0"] <= firsts["peer:p5"] {
		t.Errorf("first picks %v: the peer with the most spare capacity should lead", firsts)
	}

	s.Tune.MaxMeshAttempts = 1
	if got := Decide(req, s, now, seeded(1)).Attempts; len(got) != 1 {
		t.Errorf("MaxMeshAttempts 1: %d attempts", len(got))
	}
	s.Tune.MaxMeshAttempts = 10
	if got := Decide(req, s, now, seeded(1)).Attempts; len(got) != len(names) {
		t.Errorf("MaxMeshAttempts 10: %d attempts, want all %d", len(got), len(names))
	}
}

// TestConnectedPeersFirst: clean peers this node is connected to are tried before those it
// is not (a peer that just left keeps a fresh vector for a few heartbeats), and before
// those holding a request of this node silent past its bound (a frozen peer not yet timed
// out), whatever their weights and the seed; they are still tried after them.
func TestConnectedPeersFirst(t *testing.T) {
	marks := []struct {
		name string
		set  func(*Peer, bool)
	}{
		{"unconnected", func(p *Peer, v bool) { p.Unconnected = v }}, // left, or never dialled
		{"silent", func(p *Peer, v bool) { p.Silent = v }},           // a request waits on it
	}
	for _, mark := range marks {
		t.Run(mark.name, func(t *testing.T) {
			names := []string{"p0", "p1", "p2", "p3"}
			f := newFleet(t, names...)
			var peers []Peer
			for i, n := range names {
				p := load(f.peer(n, warm("m")), i, 10) // spare 1.0, 0.9, 0.8, 0.7: p0 the heaviest
				mark.set(&p, i < 2)
				peers = append(peers, p)
			}
			s := &Snapshot{Peers: peers, Tune: Tuning{MaxMeshAttempts: 4}}
			req := request("m", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
			for seed := range uint64(200) {
				got := f.render(Decide(req, s, now, seeded(seed)).Attempts)
				if len(got) != 4 || !slices.Contains(got[:2], "peer:p2") || !slices.Contains(got[:2], "peer:p3") ||
					!slices.Contains(got[2:], "peer:p0") || !slices.Contains(got[2:], "peer:p1") {
					t.Fatalf("seed %d: attempts %q, want p2 and p3 first, then the %s p0 and p1", seed, got, mark.name)
				}
			}
			// The zero value: the order is by weight as before.
			for i := range peers {
				mark.set(&peers[i], false)
			}
			firsts := map[string]int{}
			for seed := range uint64(200) {
				firsts[f.render(Decide(req, s, now, seeded(seed)).Attempts)[0]]++
			}
			if firsts["peer:p0"] <= firsts["peer:p3"] {
				t.Errorf("none %s, first picks %v: the heaviest peer should lead", mark.name, firsts)
			}
		})
	}
}

// TestMeshFallbacksTieByPeerID: equal weights fall back in peer ID order.
func TestMeshFallbacksTieByPeerID(t *testing.T) {
	f := newFleet(t, "a", "b", "c", "d", "e")
	var peers []Peer
	var keys []string
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		peers = append(peers, f.peer(n, warm("m")))
		keys = append(keys, f.key(n))
	}
	slices.Sort(keys)
	s := &Snapshot{Peers: peers, Rep: newStore(t)}
	req := request("m", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
	for seed := range uint64(50) {
		got := Decide(req, s, now, seeded(seed)).Attempts
		var want []string
		for _, k := range keys {
			if k != got[0].RepKey() && len(want) < 2 {
				want = append(want, k)
			}
		}
		if len(got) != 3 || got[1].RepKey() != want[0] || got[2].RepKey() != want[1] {
			t.Fatalf("seed %d: attempts %v, want fallbacks %v", seed, got, want)
		}
	}
}

// TestColdPeerShare: a peer whose model is cold weighs ColdFactor (0.5) of a warm one, so
// the warm one leads 0.95 × 2/3 + 0.05 × 1/2 ≈ 66 % of the time and is the fallback of the
// cold one.
func TestColdPeerShare(t *testing.T) {
	f := newFleet(t, "warm", "cold")
	s := &Snapshot{Peers: []Peer{f.peer("cold", cold("m")), f.peer("warm", warm("m"))}, Rep: newStore(t)}
	req := request("m", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
	rng := seeded(7)
	const n = 10000
	wins := 0
	for range n {
		got := f.render(Decide(req, s, now, rng).Attempts)
		if len(got) != 2 {
			t.Fatalf("attempts %q, want both peers", got)
		}
		if got[0] == "peer:warm" {
			wins++
		}
	}
	if share := float64(wins) / n; share < 0.63 || share > 0.69 {
		t.Fatalf("warm peer first %.3f of the time, want about 0.658", share)
	}
}

// TestExplorationShare: a peer with next to no weight (spare capacity 0.001) is still picked
// first about Exploration/n of the time, and almost never without exploration.
func TestExplorationShare(t *testing.T) {
	const nPeers, draws = 10, 10000
	names := make([]string, nPeers)
	for i := range names {
		names[i] = string(rune('a' + i))
	}
	f := newFleet(t, names...)
	var peers []Peer
	for _, n := range names {
		peers = append(peers, f.peer(n, warm("m")))
	}
	peers[3] = load(peers[3], 999, 1000)
	low := "peer:" + names[3]
	req := request("m", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
	count := func(exploration float64) int {
		s := &Snapshot{Peers: peers, Rep: newStore(t, func(p *reputation.Params) { p.Exploration = exploration })}
		rng := seeded(42)
		hits := 0
		for range draws {
			if got := f.render(Decide(req, s, now, rng).Attempts); got[0] == low {
				hits++
			}
		}
		return hits
	}
	// Expected 10,000 × (0.05/10 + 0.95 × 0.0005/4.5005) ≈ 51; the standard deviation is 7.
	if got := count(reputation.DefaultExploration); got < 25 || got > 85 {
		t.Errorf("with 5%% exploration the low-weight peer led %d of %d decisions, want about 51", got, draws)
	}
	if got := count(0); got > 8 {
		t.Errorf("without exploration the low-weight peer led %d of %d decisions, want about 1", got, draws)
	}
}

// TestPenalizedPeersMapBack: penalized peers come after every clean one in the attempt
// order, and each candidate's score stays matched to its own peer, so an excluded peer is
// never tried whatever the penalties around it.
func TestPenalizedPeersMapBack(t *testing.T) {
	names := []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6"}
	f := newFleet(t, names...)
	rep := newStore(t)
	var peers []Peer
	for _, n := range names {
		peers = append(peers, f.peer(n, warm("m")))
	}
	// p1, p2 and p5 failed a minute ago: penalized, no longer cooling. p4 is excluded.
	for i, n := range []string{"p1", "p2", "p5", "p1"} {
		rep.Record(reputation.Target{Model: "m", Peer: f.key(n)}, reputation.Timeout, now.Add(time.Duration(i)*time.Millisecond))
	}
	rep.Observe(f.key("p4"), reputation.VerificationFailed, now)
	at := now.Add(time.Minute)
	s := &Snapshot{Peers: peers, Rep: rep}
	s.Tune.MaxMeshAttempts = len(names)
	req := request("m", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
	clean, penalized := []string{"peer:p0", "peer:p3", "peer:p6"}, []string{"peer:p1", "peer:p2", "peer:p5"}
	seen := map[string]bool{}
	for seed := range uint64(200) {
		dec := Decide(req, s, at, seeded(seed))
		got := f.render(dec.Attempts)
		if len(got) != 6 || slices.Contains(got, "peer:p4") || !dec.Penalized {
			t.Fatalf("seed %d: attempts %q (penalized %v), want the six peers other than p4", seed, got, dec.Penalized)
		}
		if !sameSet(got[:3], clean) || !sameSet(got[3:], penalized) {
			t.Fatalf("seed %d: attempts %q, want the clean peers %q first", seed, got, clean)
		}
		seen[got[0]] = true
		seen[got[3]+" after the clean ones"] = true
	}
	if len(seen) != 6 {
		t.Errorf("first picks %v, want each clean peer first, and each penalized one first of its class, at some seed", seen)
	}
}

func sameSet(a, b []string) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(x string) bool { return !slices.Contains(b, x) })
}

// TestRecoveredPeerWaitsBehindCleanOnes is NODE_REP's three-peer case through the router,
// on a simulated candidate list: the first peer fails unavailable, is avoided while it
// cools, then tried only after the clean peers while penalized, and returns to first place
// once successes have cleared its penalty. Decision.Penalized says when the order was
// shaped by a penalty.
func TestRecoveredPeerWaitsBehindCleanOnes(t *testing.T) {
	f := newFleet(t, "a", "b", "c")
	rep := newStore(t)
	s := &Snapshot{Peers: []Peer{f.peer("a", warm("m")), f.peer("b", warm("m")), f.peer("c", warm("m"))}, Rep: rep}
	req := request("m", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
	// Clean: a is first at some seeds.
	var seed uint64
	for ; f.render(Decide(req, s, now, seeded(seed)).Attempts)[0] != "peer:a"; seed++ {
	}
	a := reputation.Target{Model: "m", Peer: f.key("a")}
	rep.Record(a, reputation.Unavailable, now)

	// Cooling: a is not tried at all.
	at := now.Add(time.Second)
	for sd := range uint64(300) {
		if got := f.render(Decide(req, s, at, seeded(sd)).Attempts); slices.Contains(got, "peer:a") {
			t.Fatalf("seed %d while a cools: attempts %q", sd, got)
		}
	}
	// Out of cooldown, still penalized: a comes last, every time, for StaleAfter.
	at = now.Add(StaleAfter - time.Second)
	if st, _ := rep.TargetHealth(a, at); st.Cooling || st.Penalty == 0 {
		t.Fatalf("a at +%v: %+v, want penalized and not cooling", at.Sub(now), st)
	}
	for sd := range uint64(300) {
		dec := Decide(req, s, at, seeded(sd))
		if got := f.render(dec.Attempts); len(got) != 3 || got[2] != "peer:a" || !dec.Penalized {
			t.Fatalf("seed %d with a penalized: attempts %q (penalized %v), want a last", sd, got, dec.Penalized)
		}
	}
	// Its failure StaleAfter old, the stale-peer boost leads with it in about Exploration
	// (5 %) of the decisions, and puts it last in the others.
	at = now.Add(StaleAfter)
	led := 0
	for sd := range uint64(1000) {
		dec := Decide(req, s, at, seeded(sd))
		switch got := f.render(dec.Attempts); {
		case len(got) == 3 && got[0] == "peer:a" && !dec.Penalized:
			led++
		case len(got) != 3 || got[2] != "peer:a" || !dec.Penalized:
			t.Fatalf("seed %d with a's penalty stale: attempts %q (penalized %v), want a first or last", sd, got, dec.Penalized)
		}
	}
	if led < 25 || led > 80 {
		t.Fatalf("a led %d of 1000 decisions once its failure was stale, want about %v", led, 1000*reputation.DefaultExploration)
	}
	// Successes clear the penalty: a is first again at some seeds, and nothing is penalized.
	for i := 0; ; i++ {
		if _, ok := rep.TargetHealth(a, at); !ok {
			break
		}
		if i == 10 {
			t.Fatal("ten successes did not clear a's penalty")
		}
		rep.Record(a, reputation.Success, at)
	}
	count := map[string]int{}
	for sd := range uint64(300) {
		count[f.render(Decide(req, s, at, seeded(sd)).Attempts)[0]]++
	}
	if count["peer:a"] == 0 {
		t.Fatalf("first picks %v after a's penalty cleared, want a first at some seeds", count)
	}
	if dec := Decide(req, s, at, seeded(seed)); dec.Penalized {
		t.Fatalf("decision with no penalty left says penalized: %+v", dec)
	}
}

// TestDeterministic: the same seed gives the same decision, and the rng is what varies it.
func TestDeterministic(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e", "f"}
	f := newFleet(t, names...)
	var peers []Peer
	for _, n := range names {
		peers = append(peers, f.peer(n, warm("m"), cold("m2")))
	}
	s := &Snapshot{
		Local: Local{Accepting: true, Models: []LocalModel{lc("m")}},
		Peers: peers,
		Cloud: Cloud{Enabled: true},
		Rep:   newStore(t),
	}
	req := request("m", prefs(inference.PrivacyAny, inference.PriorityLatency, inference.RouteAuto))
	firsts := map[string]bool{}
	for seed := range uint64(100) {
		d1 := Decide(req, s, now, seeded(seed))
		d2 := Decide(req, s, now, seeded(seed))
		if !reflect.DeepEqual(d1.Attempts, d2.Attempts) || !slices.Equal(d1.Estimates, d2.Estimates) || d1.Model != d2.Model || d1.Speculative != d2.Speculative {
			t.Fatalf("seed %d: %+v then %+v", seed, d1, d2)
		}
		firsts[d1.Attempts[2].String()] = true
	}
	if len(firsts) < 2 {
		t.Errorf("100 seeds all chose %v first among peers: the rng does not reach the decision", firsts)
	}
}

// TestDecideReadsOnly: Decide leaves the snapshot as it found it.
func TestDecideReadsOnly(t *testing.T) {
	f := newFleet(t, "a", "b")
	s := &Snapshot{
		Local: Local{Accepting: true, Models: []LocalModel{lc("m")}},
		Peers: []Peer{f.peer("a", warm("m")), full(f.peer("b", cold("m")))},
		Cloud: Cloud{Enabled: true, Models: []string{"m"}},
		Rep:   newStore(t),
	}
	before := *s
	before.Local.Models = slices.Clone(s.Local.Models)
	before.Cloud.Models = slices.Clone(s.Cloud.Models)
	before.Peers = slices.Clone(s.Peers)
	for i := range before.Peers {
		before.Peers[i].Entry.Vector = s.Peers[i].Entry.Vector.Clone()
	}
	for seed := range uint64(20) {
		Decide(request("", prefs(inference.PrivacyAny, inference.PriorityBalanced, inference.RouteAuto)), s, now, seeded(seed))
		Decide(request("m", prefs(inference.PrivacyAny, inference.PriorityLatency, inference.RouteExplicit)), s, now, seeded(seed))
	}
	if !reflect.DeepEqual(s, &before) {
		t.Fatalf("snapshot changed:\n got %+v\nwant %+v", s, &before)
	}
}

func TestTargetStrings(t *testing.T) {
	f := newFleet(t, "a")
	for _, tc := range []struct {
		t           Target
		str, repKey string
	}{
		{Target{Tier: TierLocal, Model: "m"}, "local", reputation.LocalTarget},
		{Target{Tier: TierMesh, Peer: f.id("a"), Model: "m"}, "peer:" + f.key("a"), f.key("a")},
		{Target{Tier: TierCloud, Model: "m"}, "cloud", CloudTarget},
	} {
		if got := tc.t.String(); got != tc.str {
			t.Errorf("String() = %q, want %q", got, tc.str)
		}
		if got := tc.t.RepKey(); got != tc.repKey {
			t.Errorf("RepKey() = %q, want %q", got, tc.repKey)
		}
	}
}

// TestScratchReuse: a Scratch shared by decisions over different snapshots, models and
// modes leaves no trace in them: each equals the decision made with fresh memory.
func TestScratchReuse(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	f := newFleet(t, names...)
	rep := newStore(t)
	var big []Peer
	for i, n := range names {
		big = append(big, load(f.peer(n, warm("m"), cold("m2")), i, 10))
	}
	// Penalized and cooling peers, so that Rank moves some and drops others.
	rep.Record(reputation.Target{Model: "m", Peer: f.key("b")}, reputation.Timeout, now.Add(-time.Minute))
	rep.Record(reputation.Target{Model: "m", Peer: f.key("a")}, reputation.Timeout, now.Add(-time.Minute))
	rep.Record(reputation.Target{Model: "m", Peer: f.key("e")}, reputation.Timeout, now)
	rep.Observe(f.key("g"), reputation.VerificationFailed, now)
	snaps := []Snapshot{
		{Local: Local{Accepting: true, Models: []LocalModel{lc("m")}}, Peers: big, Cloud: Cloud{Enabled: true}, Rep: rep},
		{Peers: big[:3], Rep: rep},
		{Peers: big[5:], Cloud: Cloud{Enabled: true, Models: []string{"m2"}}},
		{Local: Local{Accepting: true, Models: []LocalModel{lw("x")}}},
		// Penalized a ahead of clean peers, then at another index: the matching of Rank's
		// output back to peers must not remember the previous call.
		{Peers: []Peer{big[0], big[2], big[3]}, Rep: rep},
		{Peers: []Peer{big[2], big[0], big[1], big[3]}, Rep: rep},
	}
	reqs := []*inference.Request{
		request("m", prefs(inference.PrivacyAny, inference.PriorityLatency, inference.RouteExplicit)),
		request("m2", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteAuto)),
		request("", prefs(inference.PrivacyAny, inference.PriorityCost, inference.RouteAuto)),
	}
	sc := new(Scratch)
	for seed := range uint64(30) {
		for i := range snaps {
			for _, req := range reqs {
				fresh := Decide(req, &snaps[i], now, seeded(seed))
				shared := snaps[i]
				shared.Scratch = sc
				got := Decide(req, &shared, now, seeded(seed))
				if !reflect.DeepEqual(got, fresh) {
					t.Fatalf("seed %d, snapshot %d, model %q: with a shared scratch %+v, fresh %+v", seed, i, req.Model, got, fresh)
				}
			}
		}
	}
}

// TestPeerMustHoldTheModelWhole: a peer whose announced memory budget is smaller than the
// model's announced size is not a candidate to serve it whole; one without either figure is.
func TestPeerMustHoldTheModelWhole(t *testing.T) {
	f := newFleet(t, "small", "big", "unsaid")
	sized := func(name string, budgetMB int64) Peer {
		p := f.peer(name, warm("m"))
		p.Entry.Vector.RAM.BudgetMB = budgetMB
		if name != "unsaid" {
			p.Entry.Vector.Models[0].Layers, p.Entry.Vector.Models[0].WeightBytes = 16, 480<<20
		}
		return p
	}
	s := &Snapshot{Peers: []Peer{sized("small", 256), sized("big", 1024), sized("unsaid", 256)}, Rep: newStore(t)}
	req := request("m", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
	for seed := range uint64(50) {
		got := f.render(Decide(req, s, now, seeded(seed)).Attempts)
		if slices.Contains(got, "peer:small") || !slices.Contains(got, "peer:big") || !slices.Contains(got, "peer:unsaid") {
			t.Fatalf("seed %d: attempts %q, want big and unsaid, never small (256 MB for a 480 MB model)", seed, got)
		}
	}
}

// TestModelTooBigForOnePeerIsPlannedAsAPipeline: peers that announce a model with its size
// but hold it only together serve it as one pipeline target whose stages cover every layer
// in order; a mesh that cannot hold it together says by how much.
func TestModelTooBigForOnePeerIsPlannedAsAPipeline(t *testing.T) {
	f := newFleet(t, "a", "b", "c")
	sized := func(name string, budgetMB int64) Peer {
		p := f.peer(name, warm("big"))
		p.Entry.Vector.RAM.BudgetMB = budgetMB
		p.Entry.Vector.Models[0].Layers, p.Entry.Vector.Models[0].WeightBytes = 16, 480<<20
		p.Entry.Vector.Models[0].KVBytesPerToken = 96 << 10
		return p
	}
	req := request("big", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
	s := &Snapshot{Peers: []Peer{sized("a", 256), sized("b", 256), sized("c", 256)}, Rep: newStore(t)}
	dec := Decide(req, s, now, seeded(1))
	if len(dec.Attempts) != 1 || len(dec.Attempts[0].Stages) < 2 {
		t.Fatalf("attempts %+v, want one pipeline of at least 2 stages", dec.Attempts)
	}
	next := 0
	for _, st := range dec.Attempts[0].Stages {
		if st.Lo != next || st.Hi <= st.Lo {
			t.Fatalf("stages %+v do not cover the layers in order", dec.Attempts[0].Stages)
		}
		next = st.Hi
	}
	if next != 16 || !strings.HasPrefix(dec.Attempts[0].String(), "pipeline:") {
		t.Fatalf("stages %+v end at %d, route %q", dec.Attempts[0].Stages, next, dec.Attempts[0])
	}
	// One 256 MB peer cannot hold a 480 MB model: nothing to try, and the reason says so.
	alone := &Snapshot{Peers: []Peer{sized("a", 256)}, Rep: newStore(t)}
	dec = Decide(req, alone, now, seeded(1))
	if len(dec.Attempts) != 0 || !strings.Contains(dec.Estimates[1].Why, "cannot hold the model") {
		t.Fatalf("alone: attempts %+v, mesh estimate %+v; want none and the shortfall", dec.Attempts, dec.Estimates[1])
	}
}

// TestPipelinePrefersWarmRanges: among four peers that could each hold half of a model, the
// pipeline is made of the two whose announced stages hold the halves warm, in their order,
// whatever the seed, though the other two are nearer; a range still loading counts for
// nothing.
func TestPipelinePrefersWarmRanges(t *testing.T) {
	f := newFleet(t, "a", "b", "c", "d")
	sized := func(name string, stages ...caps.Stage) Peer {
		p := f.peer(name, warm("big"))
		p.Entry.Vector.RAM.BudgetMB = 400
		p.Entry.Vector.Models[0].Layers, p.Entry.Vector.Models[0].WeightBytes = 16, 480<<20
		p.Entry.Vector.Models[0].KVBytesPerToken = 96 << 10
		p.Entry.Vector.Stages = stages
		return p
	}
	held := func(lo, hi int, state string) caps.Stage {
		return caps.Stage{Model: "big", Lo: lo, Hi: hi, State: state}
	}
	req := request("big", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
	near := func(p Peer) Peer { p.RTT = 2 * time.Millisecond; return p }
	s := &Snapshot{Peers: []Peer{near(sized("a")), near(sized("b", held(8, 16, caps.StageLoading))),
		sized("c", held(8, 16, caps.StageWarm)), sized("d", held(0, 8, caps.StageWarm), held(0, 4, caps.StageWarm))}, Rep: newStore(t)}
	for seed := range uint64(20) {
		dec := Decide(req, s, now, seeded(seed))
		if len(dec.Attempts) != 1 {
			t.Fatalf("seed %d: attempts %+v, want one pipeline", seed, dec.Attempts)
		}
		var got []string
		for _, st := range dec.Attempts[0].Stages {
			got = append(got, fmt.Sprintf("%s %d-%d", f.names[mustDecode(t, st.Peer)], st.Lo, st.Hi))
		}
		if want := []string{"d 0-8", "c 8-16"}; !slices.Equal(got, want) {
			t.Fatalf("seed %d: stages %q, want the warm ranges %q", seed, got, want)
		}
	}
}

func mustDecode(t *testing.T, s string) peer.ID {
	t.Helper()
	id, err := peer.Decode(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
