package dispatch

import (
	"context"
	"fmt"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/route"
)

// Moving a pipeline's stage (transport/stage, "Moves"): a stage that leaves with notice
// (its node pauses or drains) tells the head, which re-links the chain around it at the
// next step; every other stage keeps its KV cache, and the leaving stage's rows go to the
// hops that replace it. The generation goes on in the same Head.GenerateWith, with no
// replay, and the client's stream does not notice.
//
// The run gives the pipeline its replacement function (replaceStage): it plans the
// leaving stage's layers over the stage candidates of the run's snapshot, leaving out the
// chain's peers (route.PlanReplacement), and asks the viability gate, as a handover from
// a single peer does (handover.go): the source is up, the bytes to move are the positions
// so far × the model's KV bytes per position × the range's share of the layers, the
// bandwidth is the slower leg through this node (the leaving stage's downlink here, this
// node's uplink to the first replacement; measured in the background when the attempt
// starts, as a paused peer answers no probe). Only when the gate picks live_transfer is the
// stage moved; the decision is recorded under /api/status.migration either way. Any other
// choice keeps the chain as it is: the stage leaves at the end of its grace, the pipeline
// fails as it would have, and the cut is decided again (gateCut), with the source down.

// replaceStage returns the run's ReplaceStage for an attempt on t, timed by m (a stage
// moved makes the attempt no sample of t's rates), or nil when t is no pipeline or the
// model is not served deterministically (a moved cache must give the very tokens the
// stream would have had).
func (r *run) replaceStage(t route.Target, det bool, m *timing) ReplaceStage {
	if len(t.Stages) == 0 || !det {
		return nil
	}
	if r.d.cfg.Bandwidth != nil {
		// The gate will want the bandwidth from a stage that leaves, which answers no
		// probe once paused: measure it now, off the request's path (within the probes'
		// rate limits; nothing when a recent sample exists).
		for _, s := range t.Stages {
			if id, err := peer.Decode(s.Peer); err == nil {
				r.d.background(func() { r.d.cfg.Bandwidth(r.d.bg, id) })
			}
		}
	}
	return func(ctx context.Context, lo, hi int, leaving string, chain []inference.StageHop) ([]inference.StageHop, error) {
		exclude := []string{leaving}
		for _, s := range chain {
			exclude = append(exclude, s.Peer)
		}
		hops, shape, err := route.PlanReplacement(r.snap, r.req.Model, lo, hi, exclude, pipelinePositions(&r.req), r.d.now())
		if err != nil {
			return nil, err
		}
		in := r.session(ctx)
		in.SourceUp, in.Replacement = true, true
		if shape.Layers > 0 {
			in.KVBytes = int64(in.PromptTokens+in.Generated) * shape.KVBytesPerToken * int64(hi-lo) / int64(shape.Layers)
		}
		src, err1 := peer.Decode(leaving)
		dst, err2 := peer.Decode(hops[0].Peer)
		if err1 == nil && err2 == nil {
			in.Bandwidth = r.d.legs(ctx, src, dst)
		}
		r.measured(route.Target{Tier: inference.TierMesh, Model: r.req.Model, Stages: hops}, &in)
		dec := route.Gate(in)
		r.d.migr.add(r, r.d.now(), in, dec)
		if dec.Choice != route.MoveLiveTransfer {
			log.Debugw("pipeline stage not moved live", "peer", leaving, "why", dec.Why, "kv_bytes", in.KVBytes, "bandwidth", in.Bandwidth)
			return nil, fmt.Errorf("the gate chose %s: %s", dec.Choice, dec.Why)
		}
		m.restaged.Store(true)
		return slices.Clone(hops), nil
	}
}
