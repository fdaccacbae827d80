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
//     peer, against the positions prefilled before it (timing.prefilled): the prompt, and
//     the tokens the peer replayed when the attempt went on from a cut (Result.Replayed;
//     a peer that generated them again prefilled the prompt only), from at least
//     minPrefillSample positions, fitted as a function of the length (route.PrefillFit:
//     attention makes a long prompt's tokens dearer than a short one's); the gate is given
//     the rate at the session's length. Replays are the samples the gate needs most: they
//     are what it estimates, at the lengths cut sessions have. An attempt that took a
//     cache over prefilled only what it lacked and is no sample. And its decode rate, the
//     tokens the client did not have yet after the first of them over the time they took
//     (EWMA, weight 1/4). Both per peer and model, dropped once the peer has left the
//     registry (checked when the rates outnumber the peers well, forgetRates);
//   - this node's prefill, per local model: its attempts' time to first token against the
//     positions prefilled, fitted the same way (no round trip; not while the model was
//     loading, whose time is the cold start's);
//   - the cloud's time to first token against the positions it prefilled, fitted the same
//     way (its round trip is the fit's constant term), restarts included (the cloud
//     generates the tokens sent again: its first token comes after the prompt), next to
//     its overall average.
//
// A peer could lie about its prompt tokens or serve its first token late on purpose; the
// ratio is held within [minTokenRatio, maxTokenRatio] and all of it only weighs estimates
// between ways on, never what a request is served or billed.

// rateKey is a peer's reputation key and a model.
type rateKey struct{ peer, model string }

// peerRate is a peer's measured rates for a model; 0 is not measured.
type peerRate struct {
	prefill   route.PrefillFit // time to first token less the round trip, by prompt length
	decodeTPS float64
}

const (
	// minPrefillSample is the shortest prompt (in the model's tokens) whose first token
	// measures a prefill rate.
	minPrefillSample = 32
	// minTokenRatio and maxTokenRatio bound a model's tokens per estimated token.
	minTokenRatio, maxTokenRatio = 1.0 / 8, 8.0
	// maxRatioModels bounds tokenRatio and localPrefill: model names come from requests
	// and vectors.
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

// noteTokens folds a completed fresh attempt's prompt tokens as its server counted them
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
// rates for model: ttft less rtt for a prefill of prompt positions (0: not known), and tps
// (0: not measured).
func (d *Executor) notePeerRates(key, model string, prompt int, ttft, rtt time.Duration, tps float64) {
	prefill := prompt >= minPrefillSample && ttft > rtt
	if !prefill && tps <= 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	k := rateKey{key, model}
	r := d.peerRates[k]
	if r == nil {
		r = &peerRate{}
		d.peerRates[k] = r
	}
	if prefill {
		r.prefill.Add(prompt, ttft-rtt)
	}
	if tps > 0 {
		r.decodeTPS = ewma(r.decodeTPS, tps)
	}
}

// measuredRates is what is measured of the peer whose reputation key is key serving model:
// its prefill rate for a prompt of n tokens and its decode rate, in tokens/s, 0 when not
// measured.
func (d *Executor) measuredRates(key, model string, n int) (prefill, decode float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.peerRates[rateKey{key, model}]
	if r == nil {
		return 0, 0
	}
	if t := r.prefill.At(n); t > 0 {
		prefill = float64(n) / t.Seconds()
	}
	return prefill, r.decodeTPS
}

// noteLocalPrefill folds a prefill of n positions on this node, its first token after
// took, into model's fit. Called under d.mu. The local models are few, but a backend's
// list can change: the fits are bounded as the token ratios are.
func (d *Executor) noteLocalPrefill(model string, n int, took time.Duration) {
	f := d.localPrefill[model]
	if f == nil {
		if len(d.localPrefill) >= maxRatioModels {
			clear(d.localPrefill)
		}
		f = &route.PrefillFit{}
		d.localPrefill[model] = f
	}
	f.Add(n, took)
}

// localPrefillRate is this node's measured prefill rate for n positions of model
// (tokens/s), 0 when not measured.
func (d *Executor) localPrefillRate(model string, n int) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f := d.localPrefill[model]; f != nil {
		if t := f.At(n); t > 0 {
			return float64(n) / t.Seconds()
		}
	}
	return 0
}

// cloudPrefillAt is the cloud's measured time to first token for a prompt of n tokens (its
// fit by length), 0 when not measured.
func (d *Executor) cloudPrefillAt(n int) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cloudPrefill.At(n)
}

// forgetRates drops the rates of peers not among entries. Called under d.mu, rarely (when
// the rates outnumber the peers well): a peer ID's string costs about 1.5 µs.
func (d *Executor) forgetRates(entries []registry.Entry) {
	known := make(map[string]bool, len(entries))
	for _, e := range entries {
		known[e.Peer.String()] = true
	}
	for k := range d.peerRates {
		if !known[k.peer] {
			delete(d.peerRates, k)
		}
	}
}
