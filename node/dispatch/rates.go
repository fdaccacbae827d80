package dispatch

import (
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/mesh/route"
)

// What the viability gate (route.Gate) is told of a replacement and of a session is
// measured here, from the attempts the executor runs:
//
//   - a model's tokens: routing estimates a prompt at four bytes a token
//     (route.PromptTokens), which is a real tokenizer's average in English but not every
//     model's (the built-in synth models count about one token a byte). Every completed
//     attempt that did not take a cache over reports the prompt tokens its server
//     counted, and their ratio to the estimate, per model, turns the estimate into the
//     model's own tokens (promptTokens): the KV bytes a live transfer moves and the
//     positions a replay prefills are counted in them;
//   - a peer's prefill: an attempt's time to first token, less the round trip to the
//     peer, against the positions prefilled before it (timing.sample): the prompt, and
//     the tokens the peer replayed when the attempt went on from a cut (Result.Replayed;
//     a peer that generated them again prefilled the prompt only), from at least
//     minPrefillSample positions, fitted as a function of the length (route.PrefillFit:
//     attention makes a long prompt's tokens dearer than a short one's); the gate is given
//     the rate at the session's length. Replays are the samples the gate needs most: they
//     are what it estimates, at the lengths cut sessions have. An attempt that took a
//     cache over prefilled only what it lacked and is no sample. And its decode step, over
//     the tokens the client did not have yet after the first of them, at their mean
//     context, fitted as a function of the context (route.DecodeFit: attention makes a
//     long session's steps slower than a short one's); the gate is given the rate at the
//     context of the tokens still to come. Both per peer and model, dropped once the peer
//     has left the registry (checked when the rates outnumber the peers well,
//     forgetRates);
//   - a pipeline's, the same way, per chain (its route: the stages' peers and layers, in
//     order) and model, less the round trip to its first stage (the chain's other hops
//     are the prefill fit's constant term and part of each step); an attempt during which
//     a stage moved to other peers ended on another chain and is no sample;
//   - this node's, per local model, the same way (no round trip; no prefill sample while
//     the model was loading, whose time is the cold start's);
//   - the cloud's, the same way, its prefill from any length (its round trip is the fit's
//     constant term), restarts included (the cloud generates the tokens sent again: its
//     first token comes after the prompt). Routing's figures (one time to first token, one
//     rate, for this node and the cloud) are moving averages beside these.
//
// A peer could lie about its prompt tokens or what it replayed (held to what it was asked
// to replay), or serve its first token late on purpose; the ratio is held within
// [minTokenRatio, maxTokenRatio], and all of it only weighs estimates between ways on,
// never what a request is served or billed.

// rateKey is where a model is served (a peer's reputation key, a pipeline's route) and the
// model.
type rateKey struct{ where, model string }

// rates are what is measured of one place (a peer, a pipeline, this node, the cloud)
// serving a model.
type rates struct {
	// prefill is its first token's time (less the round trip to a peer, or to a
	// pipeline's first stage) by the positions prefilled before it.
	prefill route.PrefillFit
	// decode is its decode step by the context the step attends over.
	decode route.DecodeFit
}

// sample is what a completed attempt measured: its first token after first (less the
// round trip, a peer's) from a prefill of prefilled positions (0: not known), and its
// decode steps, step each on average at a mean context of ctx positions (0: not measured).
type sample struct {
	prefilled int
	first     time.Duration
	ctx       int
	step      time.Duration
}

// add folds s into r: its prefill when it prefilled at least minPrefill positions. The
// fits ignore what is not measured (a count or a time not positive).
func (r *rates) add(s sample, minPrefill int) {
	if s.prefilled >= minPrefill {
		r.prefill.Add(s.prefilled, s.first)
	}
	r.decode.Add(s.ctx, s.step)
}

// at is r's prefill rate for n positions and its decode rate for rest tokens after them,
// in tokens/s, 0 when not measured.
func (r *rates) at(n, rest int) (prefill, decode float64) {
	if t := r.prefill.At(n); t > 0 {
		prefill = float64(n) / t.Seconds()
	}
	return prefill, r.decode.Rate(n, rest)
}

const (
	// minPrefillSample is the shortest prompt (in the model's tokens) whose first token
	// measures a prefill rate.
	minPrefillSample = 32
	// minTokenRatio and maxTokenRatio bound a model's tokens per estimated token.
	minTokenRatio, maxTokenRatio = 1.0 / 8, 8.0
	// maxRatioModels bounds tokenRatio, localRates and pipeRates: model names come from
	// requests and vectors, and the pipelines planned change with the peers.
	maxRatioModels = 256
)

// promptTokens is req's prompt in its model's tokens, as measured so far: route.PromptTokens
// scaled by the model's token ratio (modelTokens).
func (d *Executor) promptTokens(req *inference.Request) int {
	return d.modelTokens(req.Model, route.PromptTokens(req))
}

// modelTokens is est tokens as routing estimates them (route.PromptTokens) in model's own
// tokens: scaled by its token ratio, est itself until one is measured.
func (d *Executor) modelTokens(model string, est int) int {
	d.mu.Lock()
	ratio := d.tokenRatio[model]
	d.mu.Unlock()
	if ratio == 0 {
		return est
	}
	return int(float64(est)*ratio + 0.5)
}

// noteTokens folds a completed attempt's prompt tokens as its server counted them
// (served) into model's token ratio; est is routing's estimate of the same prompt.
func (d *Executor) noteTokens(model string, est, served int) {
	if est <= 0 || served <= 0 {
		return
	}
	ratio := min(max(float64(served)/float64(est), minTokenRatio), maxTokenRatio)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.tokenRatio[model]; !ok && len(d.tokenRatio) >= maxRatioModels {
		clear(d.tokenRatio)
	}
	d.tokenRatio[model] = ewma(d.tokenRatio[model], ratio)
}

// notePeerRates folds a completed attempt on the peer whose reputation key is key into its
// rates for model, from minPrefillSample positions (a short prompt's first token is mostly
// fixed costs).
func (d *Executor) notePeerRates(key, model string, s sample) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ratesIn(d.peerRates, rateKey{key, model}, 0).add(s, minPrefillSample)
}

// measuredRates is what is measured of the peer whose reputation key is key serving model:
// its prefill rate for n positions and its decode rate for rest tokens after them, in
// tokens/s, 0 when not measured.
func (d *Executor) measuredRates(key, model string, n, rest int) (prefill, decode float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return ratesAt(d.peerRates, rateKey{key, model}, n, rest)
}

// notePipelineRates folds a completed attempt on the pipeline whose route is route
// (route.Target's String) into its rates for model, as a peer's. The pipelines planned
// change as peers come and go: their rates are bounded as the token ratios are.
func (d *Executor) notePipelineRates(route, model string, s sample) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ratesIn(d.pipeRates, rateKey{route, model}, maxRatioModels).add(s, minPrefillSample)
}

// measuredPipelineRates is what is measured of the pipeline whose route is route serving
// model, as measuredRates of a peer.
func (d *Executor) measuredPipelineRates(route, model string, n, rest int) (prefill, decode float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return ratesAt(d.pipeRates, rateKey{route, model}, n, rest)
}

// noteLocalRates folds a completed attempt on this node into model's rates, as a peer's.
// Called under d.mu. The local models are few, but a backend's list can change: the rates
// are bounded as the token ratios are.
func (d *Executor) noteLocalRates(model string, s sample) {
	ratesIn(d.localRates, model, maxRatioModels).add(s, minPrefillSample)
}

// measuredLocalRates is this node's measured prefill rate for n positions of model and its
// decode rate for rest tokens after them (tokens/s), 0 when not measured.
func (d *Executor) measuredLocalRates(model string, n, rest int) (prefill, decode float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return ratesAt(d.localRates, model, n, rest)
}

// ratesIn is m's rates for k, added when missing; with bound > 0, m is cleared first when
// it holds bound rates already.
func ratesIn[K comparable](m map[K]*rates, k K, bound int) *rates {
	r := m[k]
	if r == nil {
		if bound > 0 && len(m) >= bound {
			clear(m)
		}
		r = &rates{}
		m[k] = r
	}
	return r
}

// ratesAt is m's rates for k at n positions and rest tokens after them (rates.at), 0 when
// none are measured.
func ratesAt[K comparable](m map[K]*rates, k K, n, rest int) (prefill, decode float64) {
	if r := m[k]; r != nil {
		return r.at(n, rest)
	}
	return 0, 0
}

// cloudPrefillAt is the cloud's measured time to first token for a prompt of n tokens (its
// fit by length), 0 when not measured.
func (d *Executor) cloudPrefillAt(n int) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cloud.prefill.At(n)
}

// cloudDecodeRate is the cloud's measured decode rate for n tokens from a context of ctx
// positions (tokens/s), 0 when not measured.
func (d *Executor) cloudDecodeRate(ctx, n int) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cloud.decode.Rate(ctx, n)
}

// forgetRates drops the rates of peers not among entries. Called under d.mu, rarely (when
// the rates outnumber the peers well): a peer ID's string costs about 1.5 µs.
func (d *Executor) forgetRates(entries []registry.Entry) {
	known := make(map[string]bool, len(entries))
	for _, e := range entries {
		known[e.Peer.String()] = true
	}
	for k := range d.peerRates {
		if !known[k.where] {
			delete(d.peerRates, k)
		}
	}
}
