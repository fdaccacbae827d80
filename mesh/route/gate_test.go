package route

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestGate(t *testing.T) {
	// A session of synth-base size: 200 prompt tokens, 100 generated, 100 to go; 2 MiB of KV.
	base := GateInput{PromptTokens: 200, Generated: 100, Remaining: 100, Deterministic: true,
		SourceUp: true, KVBytes: 2 << 20, Replacement: true, Bandwidth: 100e6 / 8, RTT: 20 * time.Millisecond,
		PrefillRate: 1000, DecodeRate: 20, Cloud: true, CloudTTFT: 400 * time.Millisecond, CloudRate: 40}
	with := func(f func(*GateInput)) GateInput { in := base; f(&in); return in }
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

	for _, tc := range []struct {
		name     string
		in       GateInput
		want     MoveOption
		estimate time.Duration
	}{
		// live: 20 ms + 2 MiB ÷ 12.5 MB/s (167.77 ms) + 100 ÷ 20 (5 s); replay: 20 ms + 300 ÷ 1000
		// (300 ms) + 5 s; the cloud: 400 ms + 200 ÷ 40 (5 s).
		{"fast link: live transfer", base, MoveLiveTransfer, ms(20+167.772) + 5*time.Second},
		{"slow link: replay", with(func(in *GateInput) { in.Bandwidth = 1e6 / 8 }), MoveReplay, ms(20+300) + 5*time.Second},
		{"source killed: replay", with(func(in *GateInput) { in.SourceUp = false }), MoveReplay, ms(20+300) + 5*time.Second},
		{"bandwidth not measured: no live transfer", with(func(in *GateInput) { in.Bandwidth = 0 }), MoveReplay, ms(20+300) + 5*time.Second},
		{"slow replacement: cloud", with(func(in *GateInput) { in.DecodeRate = 10 }), MoveRestartCloud, ms(400) + 5*time.Second},
		// The cloud's first token scales with the prompt it processes again: 200 × 30 ms =
		// 6 s, not the 400 ms measured on short prompts; 6 s + 5 s loses to the slow
		// replacement's 10.19 s.
		{"slow replacement, long prompt for the cloud: migrate", with(func(in *GateInput) { in.DecodeRate = 10; in.CloudTTFTPerToken = 0.03 }),
			MoveLiveTransfer, ms(20+167.772) + 10*time.Second},
		{"cloud quick per token: its measured TTFT stands", with(func(in *GateInput) { in.DecodeRate = 10; in.CloudTTFTPerToken = 0.0001 }),
			MoveRestartCloud, ms(400) + 5*time.Second},
		{"slow replacement, privacy mesh: migrate anyway", with(func(in *GateInput) { in.DecodeRate = 10; in.Cloud = false }),
			MoveLiveTransfer, ms(20+167.772) + 10*time.Second},
		// A killed source, a slow prefill and 10 tokens to go: replay's move is 20 ms + 300 ÷
		// 150 (2.02 s), then 10 ÷ 20 (500 ms): 2.52 s; the cloud 400 ms + 110 ÷ 40 = 3.15 s.
		// With 3.5 s left the move would take over half of it: the cloud at once, which ends
		// within the budget; with 5 s left, the replay.
		{"tight budget: cloud at once", with(func(in *GateInput) { tightBudget(in, 3500*time.Millisecond) }), MoveRestartCloud, ms(400) + 2750*time.Millisecond},
		{"loose budget: migrate", with(func(in *GateInput) { tightBudget(in, 5*time.Second) }), MoveReplay, ms(20+2000) + 500*time.Millisecond},
		{"budget too short, no cloud: migrate anyway", with(func(in *GateInput) { tightBudget(in, 3500*time.Millisecond); in.Cloud = false }),
			MoveReplay, ms(20+2000) + 500*time.Millisecond},
		// The rest of the generation is no part of the move: 100 tokens to go at 20 a second
		// (5 s) with 10 s left, but live transfer's move is 188 ms.
		{"long rest, short move: migrate", with(func(in *GateInput) { in.Budget = 10 * time.Second }), MoveLiveTransfer, ms(20+167.772) + 5*time.Second},
		{"cold replacement: cloud", with(func(in *GateInput) { in.ColdStart = 2 * time.Second }), MoveRestartCloud, ms(400) + 5*time.Second},
		{"no replacement: cloud", with(func(in *GateInput) { in.Replacement = false }), MoveRestartCloud, ms(400) + 5*time.Second},
		{"no replacement, no cloud: none", with(func(in *GateInput) { in.Replacement = false; in.Cloud = false }), MoveNone, 0},
		// Slow prefill and a non-deterministic model: replay 20 ms + 300 ÷ 10 = 30 s; no restart.
		{"huge context, slow link, no cloud: replay still", with(func(in *GateInput) {
			in.Bandwidth, in.PrefillRate, in.Cloud, in.Deterministic = 1e3, 10, false, false
		}), MoveReplay, ms(20) + 30*time.Second + 5*time.Second},
		// Prefill slower than decoding (a degenerate measure): restarting decodes less than
		// replaying prefills. replay 20 ms + 300 ÷ 5 = 60 s + 5 s; restart 20 ms + 200 ÷ 5 + 200 ÷ 20.
		{"prefill slower than decode: restart on the peer", with(func(in *GateInput) {
			in.Bandwidth, in.PrefillRate, in.Cloud = 0, 5, false
		}), MoveRestartPeer, ms(20) + 40*time.Second + 10*time.Second},
		// Equal estimates keep more: no KV, no context, no rest: every option is its RTT.
		{"tie: live transfer keeps more", with(func(in *GateInput) {
			in.PromptTokens, in.Generated, in.Remaining, in.KVBytes, in.Cloud = 0, 0, 0, 0, false
		}), MoveLiveTransfer, ms(20)},
		// Unmeasured rates take the defaults: replay 20 ms + 300 ÷ 500 (600 ms) + 100 ÷ 50 (2 s).
		{"defaults", with(func(in *GateInput) {
			in.PrefillRate, in.DecodeRate, in.Bandwidth, in.Cloud = 0, 0, 0, false
		}), MoveReplay, ms(20+600) + 2*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Gate(tc.in)
			if d.Choice != tc.want || (tc.estimate != 0 && absDur(d.Estimate-tc.estimate) > time.Millisecond) {
				t.Fatalf("Gate = %s (%v; %s), want %s (%v); options %v", d.Choice, d.Estimate, d.Why, tc.want, tc.estimate, d.Options)
			}
			if d.Why == "" {
				t.Fatal("no reason given")
			}
		})
	}
}

// Over random inputs the gate never migrates when a migration is not strictly faster than
// the cloud, never sends anything to a cloud the request does not allow, never leaves more
// than MaxMoveBudgetShare of the budget to a migration's move when the cloud could take over, and always
// picks the fastest migration it does take.
func TestGateProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 3))
	for i := range 20000 {
		in := GateInput{
			PromptTokens: rng.IntN(4096), Generated: rng.IntN(2048), Remaining: rng.IntN(2048),
			Deterministic: rng.IntN(2) == 0, SourceUp: rng.IntN(2) == 0, KVBytes: rng.Int64N(1 << 30),
			Replacement: rng.IntN(5) > 0, Bandwidth: float64(rng.IntN(3)) * rng.Float64() * 125e6,
			RTT: time.Duration(rng.Int64N(int64(500 * time.Millisecond))), PrefillRate: rng.Float64() * 5000,
			DecodeRate: rng.Float64() * 100, Cloud: rng.IntN(2) == 0, CloudTTFT: time.Duration(rng.Int64N(int64(3 * time.Second))),
			CloudRate: rng.Float64() * 200, Budget: time.Duration(rng.IntN(2)) * time.Duration(rng.Int64N(int64(10*time.Minute))),
		}
		d := Gate(in)
		cloud := d.Options[3]
		switch d.Choice {
		case MoveRestartCloud:
			if !in.Cloud {
				t.Fatalf("case %d: cloud chosen though not allowed: %+v", i, in)
			}
		case MoveNone:
			if in.Cloud || d.Options[0]+d.Options[1]+d.Options[2] != 0 {
				t.Fatalf("case %d: none chosen with the cloud allowed or a migration possible: %+v %v", i, in, d.Options)
			}
		default:
			k := map[MoveOption]int{MoveLiveTransfer: 0, MoveReplay: 1, MoveRestartPeer: 2}[d.Choice]
			if d.Options[k] == 0 || d.Estimate != d.Options[k] {
				t.Fatalf("case %d: %s chosen, options %v, estimate %v", i, d.Choice, d.Options, d.Estimate)
			}
			for j := range 3 {
				if d.Options[j] != 0 && d.Options[j] < d.Estimate {
					t.Fatalf("case %d: %s chosen (%v) though %s takes %v", i, d.Choice, d.Estimate, gateOrder[j], d.Options[j])
				}
			}
			if in.Cloud && d.Estimate >= cloud {
				t.Fatalf("case %d: %s (%v) chosen though the cloud takes %v", i, d.Choice, d.Estimate, cloud)
			}
			if mv := d.Moves[k]; in.Cloud && in.Budget > 0 && float64(mv) > MaxMoveBudgetShare*float64(in.Budget) {
				t.Fatalf("case %d: %s's move (%v) takes over half the budget %v", i, d.Choice, mv, in.Budget)
			}
			if mv := d.Moves[k]; mv <= 0 || mv > d.Estimate {
				t.Fatalf("case %d: %s's move %v, estimate %v", i, d.Choice, mv, d.Estimate)
			}
			if d.Choice == MoveLiveTransfer && (!in.SourceUp || in.Bandwidth <= 0) {
				t.Fatalf("case %d: live transfer without a source up and a measured bandwidth: %+v", i, in)
			}
			if d.Choice == MoveRestartPeer && !in.Deterministic {
				t.Fatalf("case %d: restart of a model that is not deterministic", i)
			}
		}
	}
}

// tightBudget makes in a killed source's session with a slow prefill and 10 tokens to go,
// and budget left.
func tightBudget(in *GateInput, budget time.Duration) {
	in.SourceUp, in.Remaining, in.PrefillRate, in.Budget = false, 10, 150, budget
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
