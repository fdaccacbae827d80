package dispatch

import (
	"maps"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/reputation"
)

// Who may vote in a verification, and which tasks are verified at all (verify.go: "Which
// tasks", "Who votes"), over scripted peers and the real reputation store with its default
// parameters, at the default voter thresholds unless a case says otherwise.

var (
	truth = []inference.Token{{Index: 0, Text: "a", ID: 1}, {Index: 1, Text: " mesh", ID: 2}}
	lie   = []inference.Token{{Index: 0, Text: "a", ID: 1}, {Index: 1, Text: " node", ID: 3}}
)

// earned is enough successful tasks for this node to reach DefaultVoterMinScore from
// neutral at once: 20 × 0.5 points = 10.
const earned = 20

// established is an honest peer that may vote at the default thresholds: known for an
// hour, connected, on a /24 of its own, and with earned reputation.
var established = peerScript{out: truth, deterministic: true, successes: earned}

// verifyWith has an executor with the default reputation store verify one task of model
// that "served" answered with sent, and returns the counters and the store.
func verifyWith(t *testing.T, seed uint64, cfg Config, model string, local []route.LocalModel, sent []inference.Token, peers scriptedPeers) (console.Verification, *reputation.Store) {
	t.Helper()
	cfg.VerifySample = 1
	m := newVerifyMesh(t, seed, cfg, newRep(t), model, local, peers)
	m.d.maybeVerify(m.run(sent, false), nil)
	m.d.Close() // waits for the verification
	return m.d.verificationStatus(), m.rep
}

var (
	passed   = console.Verification{Sampled: 1, Passed: 1}
	unvetted = console.Verification{Sampled: 1, Skipped: 1, SkippedUnvetted: 1}
)

// One honest served peer and one honest candidate voter, v: v votes (the outputs match:
// passed) only when it is vetted; otherwise the task is skipped for want of a vetted voter.
// Each case changes one thing of an established voter, or of the served peer.
func TestVoterVetting(t *testing.T) {
	ip := netip.MustParseAddr
	tests := []struct {
		name   string
		voters Voters
		served peerScript // "served" beyond its output
		v      func(*peerScript)
		want   console.Verification
	}{
		{"established", Voters{}, peerScript{}, func(*peerScript) {}, passed},
		{"not connected", Voters{}, peerScript{}, func(v *peerScript) { v.offline = true }, unvetted},
		{"stale", Voters{}, peerScript{}, func(v *peerScript) { v.stale = true }, unvetted},
		{"reached through a relay: no address", Voters{}, peerScript{}, func(v *peerScript) { v.noAddr = true }, unvetted},
		{"known a second short of 10 min", Voters{}, peerScript{}, func(v *peerScript) { v.known = DefaultVoterMinKnown - time.Second }, unvetted},
		{"known exactly 10 min", Voters{}, peerScript{}, func(v *peerScript) { v.known = DefaultVoterMinKnown }, passed},
		{"known 1 min, under a 1 min minimum", Voters{MinKnown: time.Minute}, peerScript{}, func(v *peerScript) { v.known = time.Minute }, passed},
		{"a fresh identity: score 50", Voters{}, peerScript{}, func(v *peerScript) { v.successes = 0 }, unvetted},
		{"score 59.5, one task short", Voters{}, peerScript{}, func(v *peerScript) { v.successes = earned - 1 }, unvetted},
		{"score 50 under a minimum of 50", Voters{MinScore: reputation.NeutralScore}, peerScript{}, func(v *peerScript) { v.successes = 0 }, passed},
		{"same IPv4 /24 as the served peer", Voters{}, peerScript{addr: ip("192.0.2.1")}, func(v *peerScript) { v.addr = ip("192.0.2.200") }, unvetted},
		{"next IPv4 /24", Voters{}, peerScript{addr: ip("192.0.2.1")}, func(v *peerScript) { v.addr = ip("192.0.3.1") }, passed},
		{"IPv4-mapped IPv6 is IPv4", Voters{}, peerScript{addr: ip("192.0.2.1")}, func(v *peerScript) { v.addr = ip("::ffff:192.0.2.9") }, unvetted},
		{"same IPv6 /48", Voters{}, peerScript{addr: ip("2001:db8:1:1::1")}, func(v *peerScript) { v.addr = ip("2001:db8:1:ffff::2") }, unvetted},
		{"next IPv6 /48", Voters{}, peerScript{addr: ip("2001:db8:1::1")}, func(v *peerScript) { v.addr = ip("2001:db8:2::1") }, passed},
		{"loopback: one /24", Voters{}, peerScript{addr: ip("127.0.0.2")}, func(v *peerScript) { v.addr = ip("127.0.0.3") }, unvetted},
		{"loopback hosts: each address", Voters{LoopbackHosts: true}, peerScript{addr: ip("127.0.0.2")}, func(v *peerScript) { v.addr = ip("127.0.0.3") }, passed},
		{"loopback hosts: the same address", Voters{LoopbackHosts: true}, peerScript{addr: ip("127.0.0.2")}, func(v *peerScript) { v.addr = ip("127.0.0.2") }, unvetted},
		{"the served peer's address is not known", Voters{}, peerScript{noAddr: true}, func(v *peerScript) { v.addr = ip("192.0.2.1") }, passed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			served := tt.served
			served.out, served.deterministic = truth, true
			v := established
			tt.v(&v)
			got, rep := verifyWith(t, 1, Config{Voters: tt.voters}, "synth-tiny", nil, truth, scriptedPeers{"served": served, "v": v})
			if got != tt.want {
				t.Fatalf("counters %+v, want %+v", got, tt.want)
			}
			if s := rep.Score(id("served"), time.Now()); s < reputation.NeutralScore {
				t.Fatalf("served peer scored %v", s)
			}
		})
	}
}

// The attack of issue #19 (finding 5): two colluding identities that lie identically are
// the only peers besides an honest served one. Each case is a price the attacker did or
// did not pay; the honest peer is convicted only when both identities are vetted voters on
// two networks apart, and otherwise keeps its score while nobody is penalized.
func TestSybilVoters(t *testing.T) {
	ip := netip.MustParseAddr
	sybil := func(addr string, known time.Duration, successes int) peerScript {
		return peerScript{out: lie, deterministic: true, addr: ip(addr), known: known, successes: successes}
	}
	tests := []struct {
		name      string
		s1, s2    peerScript
		want      console.Verification
		convicted bool
	}{
		// Fresh identities, each on a network of its own: not known long enough, no reputation.
		{"fresh identities", sybil("198.51.100.1", time.Second, 0), sybil("203.0.113.1", time.Second, 0),
			unvetted, false},
		// They waited ten minutes, but did no work for this node.
		{"old identities without reputation", sybil("198.51.100.1", time.Hour, 0), sybil("203.0.113.1", time.Hour, 0),
			unvetted, false},
		// They did the work, but just now.
		{"young identities with reputation", sybil("198.51.100.1", time.Minute, earned), sybil("203.0.113.1", time.Minute, earned),
			unvetted, false},
		// Established, but both on one /24 (one machine, one operator): one votes, the other
		// cannot be the third, and a mismatch nobody can settle penalizes nobody.
		{"established on one network", sybil("198.51.100.1", time.Hour, earned), sybil("198.51.100.2", time.Hour, earned),
			console.Verification{Sampled: 1, Inconclusive: 1}, false},
		// Established on two networks apart: the attack's full price paid, the vote stands.
		// This is the bound, not a success of the defence: README "Security model".
		{"established on two networks", sybil("198.51.100.1", time.Hour, earned), sybil("203.0.113.1", time.Hour, earned),
			console.Verification{Sampled: 1, Failed: 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			served := peerScript{out: truth, deterministic: true, addr: ip("192.0.2.1")}
			got, rep := verifyWith(t, 1, Config{}, "synth-tiny", nil, truth, scriptedPeers{"served": served, "s1": tt.s1, "s2": tt.s2})
			if got != tt.want {
				t.Fatalf("counters %+v, want %+v", got, tt.want)
			}
			now := time.Now()
			if convicted := rep.Excluded(id("served"), now); convicted != tt.convicted {
				t.Fatalf("honest served peer excluded: %v, want %v (score %v)", convicted, tt.convicted, rep.Score(id("served"), now))
			}
			if !tt.convicted && rep.Score(id("served"), now) != reputation.NeutralScore {
				t.Fatalf("honest served peer's score moved to %v", rep.Score(id("served"), now))
			}
		})
	}
}

// A fresh identity earns a vote with time and work, both within this node's memory:
// neither alone is enough, and work done before the waiting fades with the availability
// half-life. On virtual time, with the clock the executor reads.
func TestVoterEarnsItsVote(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rep := newRep(t)
		peers := scriptedPeers{
			"served": {out: truth, deterministic: true},
			"v":      {out: truth, deterministic: true, known: time.Nanosecond}, // first seen now
		}
		m := newVerifyMesh(t, 1, Config{VerifySample: 1}, rep, "synth-tiny", nil, peers)
		work := func(n int) {
			for range n {
				rep.Record(reputation.Target{Model: "synth-tiny", Peer: id("v")}, reputation.Success, time.Now())
			}
		}
		verdict := func(step string, want inference.Verdict) {
			t.Helper()
			if got := m.d.verify(m.run(truth, false)); got != want {
				t.Fatalf("%s: verdict %s, want %s (v scores %v)", step, got, want, rep.Score(id("v"), time.Now()))
			}
		}
		verdict("fresh", inference.VerdictSkipped)
		work(earned)
		verdict("reputed but new", inference.VerdictSkipped)
		time.Sleep(DefaultVoterMinKnown - time.Second)
		verdict("a second short of established", inference.VerdictSkipped)
		time.Sleep(time.Second)
		// Established now, but the work is ten minutes old: half of it faded (55 points).
		verdict("established, reputation faded", inference.VerdictSkipped)
		work(earned/2 + 1) // 60.5: clear of rounding in the decay
		verdict("established and reputed", inference.VerdictPassed)
		if v := m.d.verificationStatus(); v.Skipped != 4 || v.SkippedUnvetted != 4 || v.Passed != 1 {
			t.Fatalf("counters %+v: want 4 skipped for want of a vetted voter, then 1 passed", v)
		}
	})
}

// Whether a model is deterministic is this node's knowledge of the model, never the
// serving peer's claim: a liar announcing `deterministic: false` for a synthetic preset is
// sampled and caught all the same, and a model this node cannot classify is not sampled
// whatever the peers claim.
func TestVerifyDeterminismIsTheModels(t *testing.T) {
	voters := scriptedPeers{"h1": established, "h2": established}
	claims := func(out []inference.Token, det bool) scriptedPeers {
		ps := maps.Clone(voters)
		ps["served"] = peerScript{out: out, deterministic: det}
		return ps
	}
	caught := console.Verification{Sampled: 1, Failed: 1}
	tests := []struct {
		name     string
		model    string
		local    []route.LocalModel
		sent     []inference.Token
		peers    scriptedPeers
		want     console.Verification
		excluded bool // the served peer ends excluded
	}{
		{"a liar claiming non-determinism for a preset", "synth-tiny", nil, lie, claims(lie, false), caught, true},
		{"a liar claiming determinism for a preset", "synth-small", nil, lie, claims(lie, true), caught, true},
		{"an honest peer claiming non-determinism for a preset", "synth-tiny", nil, truth, claims(truth, false), passed, false},
		{"a model this node cannot classify, every peer claiming determinism", "house-llm", nil, lie, claims(lie, true),
			console.Verification{}, false},
		{"a model this node's backend serves deterministically", "house-llm", []route.LocalModel{{Name: "house-llm", Deterministic: true}},
			lie, claims(lie, false), caught, true},
		{"a model this node's backend serves, not deterministically", "house-llm", []route.LocalModel{{Name: "house-llm"}},
			lie, claims(lie, true), console.Verification{}, false},
		{"a preset this node's backend calls non-deterministic", "synth-tiny", []route.LocalModel{{Name: "synth-tiny"}},
			lie, claims(lie, true), caught, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, rep := verifyWith(t, 1, Config{}, tt.model, tt.local, tt.sent, tt.peers)
			if got != tt.want {
				t.Fatalf("counters %+v, want %+v", got, tt.want)
			}
			if ex := rep.Excluded(id("served"), time.Now()); ex != tt.excluded {
				t.Fatalf("served peer excluded %v, want %v", ex, tt.excluded)
			}
		})
	}
}

func TestHostOf(t *testing.T) {
	for _, tt := range []struct {
		addr     string
		loopback bool
		want     string
	}{
		{"192.0.2.77", false, "192.0.2.0/24"},
		{"::ffff:192.0.2.77", false, "192.0.2.0/24"},
		{"2001:db8:aa:bb::1", false, "2001:db8:aa::/48"},
		{"fe80::1%eth0", false, "fe80::/48"},
		{"127.0.0.9", false, "127.0.0.0/24"},
		{"127.0.0.9", true, "127.0.0.9/32"},
		{"::1", true, "::1/128"},
		{"192.0.2.77", true, "192.0.2.0/24"},
	} {
		if got := hostOf(netip.MustParseAddr(tt.addr), tt.loopback); got.String() != tt.want {
			t.Errorf("hostOf(%s, %v) = %s, want %s", tt.addr, tt.loopback, got, tt.want)
		}
	}
	if got := hostOf(netip.Addr{}, true); got.IsValid() {
		t.Errorf("hostOf(zero) = %s, want the zero Prefix", got)
	}
}

// Voter thresholds out of range are refused; zero takes the defaults.
func TestNewVoters(t *testing.T) {
	base := Config{Peers: scriptedPeers{}, Registry: entries{}, Rep: newRep(t)}
	for _, bad := range []Voters{{MinKnown: -time.Second}, {MinScore: -1}, {MinScore: 101}} {
		cfg := base
		cfg.Voters = bad
		if _, err := New(cfg); err == nil {
			t.Errorf("New with voters %+v: no error", bad)
		}
	}
	d := newExecutor(t, base)
	if v := d.cfg.Voters; v.MinKnown != DefaultVoterMinKnown || v.MinScore != DefaultVoterMinScore {
		t.Fatalf("default voters %+v", v)
	}
}
