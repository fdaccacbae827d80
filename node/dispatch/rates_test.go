package dispatch

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/route"
)

// The gate is told what attempts measured: a model's own prompt tokens (from the counts its
// servers report), a peer's prefill rate (its first token less the round trip, over the
// prompt) and its decode rate; a cut generation's decision records them.
func TestGateUsesMeasuredRates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const firstToken, rtt = 300 * time.Millisecond, 20 * time.Millisecond
		a, b := newTarget(t, model), newTarget(t, model)
		a.firstToken, b.firstToken = firstToken, firstToken
		ps := peers{"a": a, "b": b}
		d := newExecutor(t, Config{
			Peers: ps, Registry: registryOf(model, "a", "b"), Rep: newRep(t), Seed: 3,
			Latency: func(peer.ID) time.Duration { return rtt },
		})
		long := chat(model, 8)
		long.Messages[0].Content = strings.Repeat("a longer prompt, ", 6) // 102 bytes
		est := route.PromptTokens(long)

		// A short prompt measures no prefill rate: its first token is mostly fixed costs.
		short := chat(model, 8)
		if _, _, at, err := collect(d, short); err != nil {
			t.Fatal(err)
		} else if prefill, _ := d.measuredRates(at.Peer, model, route.PromptTokens(short), 0); prefill != 0 {
			t.Fatalf("a %d-token prompt measured a prefill rate of %.0f tokens/s", route.PromptTokens(short), prefill)
		}
		if d.promptTokens(long) == est {
			t.Fatalf("the short request's reported prompt tokens left the ratio at 1 (%d estimated)", est)
		}

		// Until both peers have served the long prompt once.
		res, err := b.b.Generate(t.Context(), long, func(inference.Token) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		served := res.Usage.PromptTokens
		for i := 0; a.calledTimes() < 2 || b.calledTimes() < 2; i++ {
			if i == 64 {
				t.Fatal("64 requests never drew both peers")
			}
			if _, _, _, err := collect(d, long); err != nil {
				t.Fatal(err)
			}
		}
		// The ratio is an average over prompts (the short one's too: a chat template's
		// fixed tokens weigh more in it), so within 5 %.
		if got := d.promptTokens(long); got < served*95/100 || got > served*105/100 {
			t.Fatalf("prompt tokens as the gate counts them: %d, want about the %d the servers reported (%d estimated)", got, served, est)
		}
		want := float64(served) / (firstToken - rtt).Seconds()
		for _, p := range []peer.ID{"a", "b"} {
			prefill, _ := d.measuredRates(p.String(), model, served, 0)
			if diff := prefill/want - 1; diff < -1e-9 || diff > 1e-9 {
				t.Fatalf("peer %s: prefill rate %.2f tokens/s, want %.2f (%d tokens in %v)", p, prefill, want, served, firstToken-rtt)
			}
		}

		// A cut: the decision that moves the generation was given those figures.
		a.cutAfter, b.cutAfter = 3, 3
		if _, _, _, err := collect(d, long); err == nil {
			t.Fatal("both peers cut the stream, yet the request completed")
		}
		recent := d.Migration().Recent
		if len(recent) == 0 {
			t.Fatal("a cut with another peer left recorded no gate decision")
		}
		in := recent[0].Inputs
		if in.PromptTokens != d.promptTokens(long) || in.PrefillTPS < want*(1-1e-9) || in.PrefillTPS > want*(1+1e-9) {
			t.Fatalf("gate inputs: %d prompt tokens at %.2f tokens/s; want %d at %.2f", in.PromptTokens, in.PrefillTPS, d.promptTokens(long), want)
		}
	})
}

// A peer's prefill is fitted by prompt length (route.PrefillFit): after prompts of 200 and
// 800 tokens whose first tokens cost a quadratic curve, the rate the gate is given for a
// 1,600-token session is the curve's, not the average's.
func TestPrefillRateByLength(t *testing.T) {
	d := newExecutor(t, Config{Peers: peers{}, Registry: registryOf(model), Rep: newRep(t)})
	curve := func(n int) time.Duration { // 1 ms a token and attention: 1 µs × n²
		return time.Duration(n)*time.Millisecond + time.Duration(n*n)*time.Microsecond
	}
	for range 3 {
		for _, n := range []int{200, 800} {
			d.notePeerRates("p", model, sample{prefilled: n, first: curve(n)})
		}
	}
	for _, n := range []int{200, 800, 1600} {
		want := float64(n) / curve(n).Seconds()
		if got, _ := d.measuredRates("p", model, n, 0); got < want*0.98 || got > want*1.02 {
			t.Errorf("prefill rate for %d tokens: %.0f tokens/s, want %.0f", n, got, want)
		}
	}
	short, _ := d.measuredRates("p", model, 200, 0)
	long, _ := d.measuredRates("p", model, 1600, 0)
	if short < 2*long {
		t.Errorf("a 200-token prompt prefills at %.0f tokens/s, a 1,600-token one at %.0f: want over twice as fast", short, long)
	}
}

// A stream cut on peer a goes on by replay on b: b's first token came after a prefill of the
// prompt and the tokens sent, and teaches the gate b's prefill at that length, as a fresh
// prompt of it would. A peer that generated the tokens again (an upstream behind it)
// prefilled the prompt only, and a cloud restart too: each is timed at its own length.
func TestReplayTeachesPrefill(t *testing.T) {
	const firstToken, rtt, cut = 300 * time.Millisecond, 20 * time.Millisecond, 3
	long := chat(model, 8)
	long.Messages[0].Content = strings.Repeat("a longer prompt, ", 6) // 102 bytes
	for _, c := range []struct {
		name       string
		regenerate bool
		cloud      bool
		prefilled  func(prompt int) int
	}{
		{"replay", false, false, func(prompt int) int { return prompt + cut }},
		{"regenerate", true, false, func(prompt int) int { return prompt }},
		{"cloud", true, true, func(prompt int) int { return prompt }}, // an upstream API
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tg := newTarget(t, model)
				res, err := tg.b.Generate(t.Context(), long, func(inference.Token) error { return nil })
				if err != nil {
					t.Fatal(err)
				}
				want := c.prefilled(res.Usage.PromptTokens)
				for seed := uint64(0); ; seed++ {
					if seed == 64 {
						t.Fatal("64 seeds never sent the first attempt to the peer that cuts")
					}
					a, b := newTarget(t, model), newTarget(t, model)
					a.cutAfter, b.firstToken, b.regenerate = cut, firstToken, c.regenerate
					ps := peers{"a": a}
					cfg := Config{Peers: ps, Registry: registryOf(model, "a"), Rep: newRep(t), Seed: seed,
						Latency: func(peer.ID) time.Duration { return rtt }}
					req := *long
					if c.cloud {
						cfg.Cloud, cfg.CloudModels = b, []string{model}
						req.Prefs.Privacy = inference.PrivacyAny
					} else {
						ps["b"], cfg.Registry = b, registryOf(model, "a", "b")
					}
					d := newExecutor(t, cfg)
					_, _, at, err := collect(d, &req)
					if err != nil {
						t.Fatal(err)
					}
					if a.calledTimes() == 0 {
						continue // b took it first, with nothing to replay
					}
					if b.calledTimes() != 1 {
						t.Fatalf("a cut after %d tokens, ended at %+v: b called %d times, want once", cut, at, b.calledTimes())
					}
					if c.cloud {
						if got := d.cloudPrefillAt(want); got != firstToken {
							t.Fatalf("the cloud's first token for %d positions: %v, want the %v its restart took", want, got, firstToken)
						}
						return
					}
					rate := float64(want) / (firstToken - rtt).Seconds()
					if got, _ := d.measuredRates(peer.ID("b").String(), model, want, 0); got < rate*(1-1e-9) || got > rate*(1+1e-9) {
						t.Fatalf("b's prefill for %d positions: %.2f tokens/s, want %.2f (%d positions in %v)", want, got, rate, want, firstToken-rtt)
					}
					return
				}
			})
		})
	}
}

// This node's own prefill is measured as a peer's is (no round trip; not while its model
// was loading), and the gate is told it when this node takes a cut session over.
func TestLocalPrefillMeasured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const firstToken = 300 * time.Millisecond
		slow, err := synth.NewWith([]string{model}, []synth.Option{synth.WithLoadDelay(5 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		local := &target{b: slow, firstToken: firstToken, calls: make(chan struct{}, 8)}
		d := newExecutor(t, Config{Local: local, Peers: peers{}, Registry: entries{}, Rep: newRep(t)})
		long := chat(model, 8)
		long.Messages[0].Content = strings.Repeat("a longer prompt, ", 6) // 102 bytes
		res, err := newTarget(t, model).b.Generate(t.Context(), long, func(inference.Token) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		n := res.Usage.PromptTokens // counted on another backend: this node's model stays cold
		// The first request finds the model cold: its first token comes after the load.
		for range 2 {
			if _, _, at, err := collect(d, long); err != nil || at.Tier != inference.TierLocal {
				t.Fatalf("served at %+v: %v, want this node", at, err)
			}
		}
		want := float64(n) / firstToken.Seconds()
		if got, _ := d.measuredLocalRates(model, n, 0); got < want*(1-1e-9) || got > want*(1+1e-9) {
			t.Fatalf("this node's prefill for %d tokens: %.2f tokens/s, want %.2f", n, got, want)
		}
		r := &run{d: d, req: *long, snap: &route.Snapshot{Local: route.Local{Models: []route.LocalModel{{Name: model, Warm: true}}}}}
		in := route.GateInput{PromptTokens: n}
		r.measured(route.Target{Tier: inference.TierLocal}, &in)
		if in.PrefillRate < want*(1-1e-9) || in.PrefillRate > want*(1+1e-9) {
			t.Fatalf("the gate is told this node prefills %.2f tokens/s, want the %.2f measured", in.PrefillRate, want)
		}
	})
}

// A peer's decode rate is read at the context of the tokens still to come: its steps,
// measured at a short and a longer context, grow with it, and a cut session's 100 tokens
// after 2,000 positions come at the step of 2,050 positions, not at an average rate.
func TestDecodeRateByContext(t *testing.T) {
	d := newExecutor(t, Config{Peers: peers{}, Registry: registryOf(model), Rep: newRep(t)})
	step := func(x int) time.Duration { // 8 ms and 20 µs a position
		return 8*time.Millisecond + time.Duration(x)*20*time.Microsecond
	}
	for range 3 {
		for _, x := range []int{100, 1000} {
			d.notePeerRates("p", model, sample{ctx: x, step: step(x)})
		}
	}
	want := 1 / step(2050).Seconds()
	if _, got := d.measuredRates("p", model, 2000, 100); got < want*0.98 || got > want*1.02 {
		t.Errorf("decode rate of 100 tokens after 2,000 positions: %.1f tokens/s, want %.1f", got, want)
	}
}

// What an attempt measured: a replay's first token after the prompt and the tokens
// replayed, its decode steps over the tokens the client did not have (not the burst of
// those sent again) at their context; an attempt that took a cache over prefilled nothing
// to time.
func TestTimingSample(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	m := &timing{now: func() time.Time { return now }, start: t0, prompt: 90, skip: 3}
	now = t0.Add(300 * time.Millisecond)
	for range 3 { // the tokens the client had, at once after the prefill
		m.token()
	}
	for i := range 7 { // then one every 20 ms
		now = t0.Add(310*time.Millisecond + time.Duration(i)*20*time.Millisecond)
		m.token()
	}
	m.served, m.replayed = 100, 3
	want := sample{prefilled: 103, first: 300 * time.Millisecond, ctx: 106, step: 20 * time.Millisecond}
	if got := m.sample(); got != want {
		t.Fatalf("replay: %+v, want %+v", got, want)
	}
	m.replayed = 0 // it generated them again: it prefilled the prompt
	if got := m.sample(); got.prefilled != 100 {
		t.Fatalf("regenerated: %d positions prefilled, want the prompt's 100", got.prefilled)
	}
	m.tookOver = true
	if got := m.sample(); got.prefilled != 0 || got.step != want.step {
		t.Fatalf("took a cache over: %+v, want no prefill and the same steps", got)
	}
}

// A pipeline's rates are measured as a peer's, per chain: its two stages here take a fixed
// time a position, and a round trip each pass, so its prefill is one position per
// 2×perPosition (the round trip to the first stage taken off) and its decode one token per
// 2×perPosition + rtt, and the gate is told them when that chain is the replacement.
// Until the chain has served, and for the same peers in another order, the gate takes its
// defaults.
func TestPipelineRatesMeasured(t *testing.T) {
	const perPosition, rtt = 2 * time.Millisecond, 30 * time.Millisecond
	b, _ := loadedModel(t)
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Latency: func(peer.ID) time.Duration { return rtt }}
		// Peer IDs that decode, as a real chain's do: the round trip is looked up by ID.
		a, bb := keyedPeer(t, 1), keyedPeer(t, 2)
		w := newPipelineWorld(t, b, cfg, newRep(t), []meshNode{{id: a}, {id: bb}})
		for id, sb := range w.net.stages {
			w.net.stages[id] = slowStages{sb, perPosition, rtt}
		}
		req := pipeReq()
		req.Messages[0].Content = strings.Repeat("a longer prompt, ", 4) // 68 bytes
		in := route.GateInput{PromptTokens: 80, Remaining: 2}
		r := &run{d: w.d, req: req, snap: w.snap}
		r.measured(pipeline(a, bb), &in)
		if in.PrefillRate != 0 || in.DecodeRate != 0 {
			t.Fatalf("rates %.1f and %.1f tokens/s before any attempt, want none", in.PrefillRate, in.DecodeRate)
		}
		res, at, err := w.d.Generate(context.Background(), &req, func(inference.Served, inference.Token) error { return nil })
		if err != nil || len(at.Stages) != 2 {
			t.Fatalf("served at %+v: %v; want a pipeline of 2 stages", at, err)
		}
		served := route.Target{Tier: route.TierMesh, Model: pipeModel, Stages: at.Stages}
		other := pipeline(a, bb)
		if at.Stages[0].Peer == a.String() {
			other = pipeline(bb, a)
		}
		r.measured(other, &in) // the same peers the other way round: another chain
		if in.PrefillRate != 0 || in.DecodeRate != 0 {
			t.Fatalf("the chain %s took the rates of %s", other, served)
		}
		n := res.Usage.PromptTokens
		in = route.GateInput{PromptTokens: n, Remaining: 2}
		r.measured(served, &in)
		want := 1 / (2 * perPosition).Seconds()
		if in.PrefillRate < want*(1-1e-9) || in.PrefillRate > want*(1+1e-9) {
			t.Errorf("the gate is told the pipeline prefills %.2f tokens/s, want the %.2f measured", in.PrefillRate, want)
		}
		want = 1 / (2*perPosition + rtt).Seconds()
		if in.DecodeRate < want*(1-1e-9) || in.DecodeRate > want*(1+1e-9) {
			t.Errorf("the gate is told the pipeline decodes %.2f tokens/s, want the %.2f measured", in.DecodeRate, want)
		}
		if in.RTT != rtt {
			t.Errorf("round trip to the first stage %v, want %v", in.RTT, rtt)
		}
	})
}

// An attempt during which a stage of its pipeline moved to other peers ended on another
// chain: it is no sample of the pipeline it started on.
func TestPipelineRestagedNoSample(t *testing.T) {
	tg := pipeline("a", "b")
	for _, restaged := range []bool{false, true} {
		d := newExecutor(t, Config{Peers: peers{}, Registry: entries{}, Rep: newRep(t)})
		t0 := time.Unix(1000, 0)
		m := &timing{start: t0, first: t0.Add(100 * time.Millisecond), fresh: t0.Add(100 * time.Millisecond),
			last: t0.Add(300 * time.Millisecond), tokens: 3, prompt: 64, served: 64}
		m.restaged.Store(restaged)
		d.observe(tg, pipeModel, false, nil, false, m)
		prefill, decode := d.measuredPipelineRates(tg.String(), pipeModel, 64, 2)
		if measured := prefill > 0 && decode > 0; measured == restaged {
			t.Errorf("restaged %v: rates %.1f and %.1f tokens/s measured", restaged, prefill, decode)
		}
	}
}

// keyedPeer is the ID of an ed25519 key made from seed.
func keyedPeer(t *testing.T, seed byte) peer.ID {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(bytes.NewReader(bytes.Repeat([]byte{seed}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// slowStages are stage backends whose sessions take perPosition a position they forward;
// a first stage's (layer 0 on) takes rtt more a pass, the round trip through the chain.
type slowStages struct {
	inference.StageBackend
	perPosition, rtt time.Duration
}

func (s slowStages) OpenStage(ctx context.Context, model string, lo, hi, maxPositions int) (inference.StageSession, error) {
	ss, err := s.StageBackend.OpenStage(ctx, model, lo, hi, maxPositions)
	if err != nil {
		return nil, err
	}
	sl := slowSession{StageSession: ss, perPosition: s.perPosition}
	if lo == 0 {
		sl.pass = s.rtt
	}
	return sl, nil
}

type slowSession struct {
	inference.StageSession
	perPosition, pass time.Duration
}

func (s slowSession) Forward(ctx context.Context, hidden []float32, n int) ([]float32, error) {
	time.Sleep(s.pass + time.Duration(n)*s.perPosition)
	return s.StageSession.Forward(ctx, hidden, n)
}
