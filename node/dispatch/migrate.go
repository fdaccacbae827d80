package dispatch

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/node/console"
)

// Moving a cut generation: when a target fails after the client got tokens, the viability
// gate (route.Gate) picks how the stream goes on, from what this node has measured:
//
//   - replay on the next target that serves the model deterministically (a peer, this
//     node, a pipeline): the tokens sent are prefilled with the prompt (Request.Replay);
//   - restart_peer there: the estimate of generating the tokens sent again, picked over
//     replay only when the replacement decodes faster than it prefills. The request is the
//     same either way (it carries Request.Replay): a target that can replay does, one that
//     cannot (an upstream) generates them again, whichever the gate picked;
//   - restart_cloud: the cloud generates the completion again, when the request allows
//     the cloud and the cloud says it serves the model deterministically (another
//     meshinfer node's API says so of the built-in models, route.Cloud.Deterministic); the
//     gate picks it only when it is strictly faster than any migration, or when a
//     migration's move (the transfer or the prefill before new tokens) would take more
//     than route.MaxMoveBudgetShare of the time left before the request's deadline;
//   - none: nothing can continue the stream (within the deadline): the request ends with
//     the cut's error.
//
// live_transfer is decided at a handover (handover.go), when a peer that leaves with notice
// starts sending its KV cache: the gate is told the source is up, the bytes to move and
// the bandwidth measured on the way. At a cut the source is down and the gate never picks
// it. The inputs not measured yet take the gate's defaults: the replacement's prefill rate
// (a pipeline's until that chain has served the model, a stage's that replaces a leaving
// one always), and a peer's decode rate (the default scaled by its performance). Every
// decision is counted, and the last recentMigrations are kept with their inputs, estimate
// and the time the request really took from there (/api/status "migration").

// recentMigrations is how many decisions /api/status keeps (8).
const recentMigrations = 8

// migrations is the executor's record of its gate decisions.
type migrations struct {
	mu     sync.Mutex
	counts map[route.MoveOption]uint64
	recent []*console.MigrationDecision // oldest first, at most recentMigrations
}

// gateCut decides how the run goes on after attempts[i] cut its stream: it returns the
// attempts to go on with (the chosen target moved to i+1) and false when the gate says
// nothing can continue the stream.
func (r *run) gateCut(ctx context.Context, attempts []route.Target, i int) ([]route.Target, bool) {
	if d := r.decided; d != nil {
		// The gate decided at the source's handover, with the source up, and the run
		// stopped the source to act on it (handover.go).
		r.decided = nil
		return applyMove(attempts, i, d.choice, i+d.next, i+d.cloud)
	}
	in, next, cloud := r.gateInput(ctx, attempts, i)
	dec := route.Gate(in)
	r.d.migr.add(r, r.d.now(), in, dec)
	return applyMove(attempts, i, dec.Choice, next, cloud)
}

// applyMove is the attempts to go on with after attempts[i] cut its stream and the gate
// chose choice, with the replacement at next and the cloud at cloud.
func applyMove(attempts []route.Target, i int, choice route.MoveOption, next, cloud int) ([]route.Target, bool) {
	switch choice {
	case route.MoveNone:
		return attempts, false
	case route.MoveRestartCloud:
		return moveTo(attempts, cloud, i+1), true
	default:
		return moveTo(attempts, next, i+1), true
	}
}

// gateInput is what the gate is told of the run after attempts[i], its stream's source,
// and the indices of the replacement (the first deterministic target after i that is not
// the cloud) and of the cloud, -1 for none. The source is down (SourceUp false): a
// handover's caller (handover.go) adds what a live transfer needs.
func (r *run) gateInput(ctx context.Context, attempts []route.Target, i int) (in route.GateInput, next, cloud int) {
	next, cloud = -1, -1
	for j := i + 1; j < len(attempts); j++ {
		t := attempts[j]
		switch {
		case !r.sentDet || !r.deterministic(t):
			// Only a deterministic target continues a stream, and only one that came from
			// deterministic targets: with none, the gate says none (serve would skip them).
		case t.Tier == inference.TierCloud:
			cloud = max(cloud, j) // the cloud is the last attempt of a decision
		case next < 0:
			next = j
		}
	}
	in = r.session(ctx)
	in.Replacement, in.Cloud = next >= 0, cloud >= 0
	if next >= 0 {
		r.measured(attempts[next], &in)
	}
	return in, next, cloud
}

// session is what the gate is told of the run's generation wherever it goes on: the
// prompt and tokens so far, those still to come, whether it is deterministic, the cloud's
// measured figures and the time left before ctx's deadline.
func (r *run) session(ctx context.Context) route.GateInput {
	in := route.GateInput{
		PromptTokens: r.d.promptTokens(&r.req), Generated: len(r.sent),
		Remaining:     max(r.req.EffectiveMaxTokens()-len(r.sent), 0),
		Deterministic: r.sentDet,
		CloudTTFT:     r.snap.Cloud.TTFT, CloudRate: r.snap.Cloud.TokensPerSec,
	}
	if in.PromptTokens > 0 {
		in.CloudTTFTPerToken = r.d.cloudPrefillAt(in.PromptTokens).Seconds() / float64(in.PromptTokens)
	}
	// A cloud restart decodes the tokens sent and those to come from the prompt on.
	in.CloudRate = cmp.Or(r.d.cloudDecodeRate(in.PromptTokens, in.Generated+in.Remaining), in.CloudRate)
	if dl, ok := ctx.Deadline(); ok {
		in.Budget = max(dl.Sub(r.d.now()), time.Nanosecond)
	}
	return in
}

// measured fills in what this node knows of the replacement t: this node's measured prefill
// and decode rates (rates.go) and cold start when t is this node; for a peer, the round trip
// to it, its measured prefill and decode rates for the model (rates.go; the decode rate,
// when none is measured, as route.Decide estimates it: the default rate scaled by its
// performance in the reputation store) and the default cold start when its copy of the
// model is cold; for a pipeline, the round trip to its first stage and the rates measured
// of that chain.
func (r *run) measured(t route.Target, in *route.GateInput) {
	tune := r.snap.Tune
	switch {
	case t.Tier == inference.TierLocal:
		if k := slices.IndexFunc(r.snap.Local.Models, func(m route.LocalModel) bool { return m.Name == r.req.Model }); k >= 0 {
			m := r.snap.Local.Models[k]
			var decode float64
			in.PrefillRate, decode = r.d.measuredLocalRates(r.req.Model, in.PromptTokens+in.Generated, in.Remaining)
			in.DecodeRate = cmp.Or(decode, m.TokensPerSec)
			if !m.Warm {
				in.ColdStart = cmp.Or(m.ColdStart, tune.DefaultColdStart)
			}
		}
	case t.Tier == inference.TierMesh && len(t.Stages) > 0:
		if k := slices.IndexFunc(r.snap.Peers, func(p route.Peer) bool { return p.Entry.Peer.String() == t.Stages[0].Peer }); k >= 0 {
			in.RTT = r.snap.Peers[k].RTT
		}
		in.PrefillRate, in.DecodeRate = r.d.measuredPipelineRates(t.String(), r.req.Model, in.PromptTokens+in.Generated, in.Remaining)
	case t.Tier == inference.TierMesh:
		k := slices.IndexFunc(r.snap.Peers, func(p route.Peer) bool { return p.Entry.Peer == t.Peer })
		if k < 0 {
			return
		}
		p := r.snap.Peers[k]
		in.RTT = p.RTT
		in.PrefillRate, in.DecodeRate = r.d.measuredRates(p.Key, r.req.Model, in.PromptTokens+in.Generated, in.Remaining)
		if in.DecodeRate == 0 {
			in.DecodeRate = r.snap.PeerTokensPerSec(p.Key, r.d.now())
		}
		if m, ok := modelIn(p.Entry.Vector, r.req.Model); ok && m.State != caps.ModelWarm {
			in.ColdStart = tune.DefaultColdStart
		}
	}
}

// moveTo moves attempts[from] to index to (to ≤ from), on a copy.
func moveTo(attempts []route.Target, from, to int) []route.Target {
	out := slices.Clone(attempts)
	t := out[from]
	out = slices.Delete(out, from, from+1)
	return slices.Insert(out, to, t)
}

// add records a decision of r's, made at now; the run completes it when it ends (done).
func (m *migrations) add(r *run, now time.Time, in route.GateInput, dec route.GateDecision) {
	d := &console.MigrationDecision{
		At: now.UTC(), Model: r.req.Model, Choice: string(dec.Choice), Why: dec.Why,
		EstimateMS: ms(dec.Estimate), Outcome: "running",
		Inputs: console.GateInputs{
			PromptTokens: in.PromptTokens, Generated: in.Generated, Remaining: in.Remaining,
			Deterministic: in.Deterministic, SourceUp: in.SourceUp, KVBytes: in.KVBytes,
			Replacement: in.Replacement, BandwidthMbps: in.Bandwidth * 8 / 1e6, RTTMS: ms(in.RTT),
			PrefillTPS: in.PrefillRate, DecodeTPS: in.DecodeRate, ColdStartMS: ms(in.ColdStart),
			Cloud: in.Cloud, CloudTTFTMS: ms(in.CloudTTFT), CloudTPS: in.CloudRate, BudgetMS: ms(in.Budget),
		},
		OptionsMS: map[string]float64{},
	}
	for o, est := range dec.Possible() {
		d.OptionsMS[string(o)] = ms(est)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.counts == nil {
		m.counts = map[route.MoveOption]uint64{}
	}
	m.counts[dec.Choice]++
	if len(m.recent) == recentMigrations {
		m.recent = slices.Delete(m.recent, 0, 1)
	}
	m.recent = append(m.recent, d)
	r.moves = append(r.moves, d)
}

// done completes the run's decisions: the request ended at now with err (nil: completed)
// on the route served.
func (m *migrations) done(r *run, now time.Time, err error) {
	if len(r.moves) == 0 {
		return
	}
	outcome := "completed"
	if err != nil {
		outcome = string(inference.CodeOf(err))
	}
	route := r.served().Route()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range r.moves {
		d.TookMS, d.Outcome, d.Route = ms(now.Sub(d.At)), outcome, route
	}
}

// status is /api/status "migration".
func (m *migrations) status() console.Migration {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := console.Migration{Decisions: map[string]uint64{}, Recent: make([]console.MigrationDecision, 0, len(m.recent))}
	for _, c := range []route.MoveOption{route.MoveLiveTransfer, route.MoveReplay, route.MoveRestartPeer, route.MoveRestartCloud, route.MoveNone} {
		out.Decisions[string(c)] = m.counts[c]
	}
	// Copies, as done completes them; OptionsMS is never written once add recorded it.
	for _, d := range m.recent {
		out.Recent = append(out.Recent, *d)
	}
	return out
}

// Migration is the "migration" object of /api/status.
func (d *Executor) Migration() console.Migration { return d.migr.status() }

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
