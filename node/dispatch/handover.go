package dispatch

import (
	"context"
	"errors"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/route"
)

// Live transfer (inference/handover.go): a peer that leaves with notice (its owner paused
// it, it drains) while it serves one of this node's streams sends the generation's KV cache
// on the stream and keeps generating, then stops with a "moved" frame. This node relays the
// rows to the replacement as they come (the peer and the replacement need no connection
// of their own, and this node times both legs), and once the peer stopped, the replacement
// goes on from the tokens the client has, prefilling only the positions it was not sent.
//
// Every attempt on a single peer over libp2p, for a model served deterministically, offers
// to take a handover (Request.Move). At the first rows the viability gate decides, with the
// source up: the bytes to move (the positions so far × the model's KV bytes per position,
// from the peer's announcement), the bandwidth of the slower leg (Config.Bandwidth: the rows
// just received are a sample of the first), the replacement's round trip and rates, the
// cloud's. Only when it picks live_transfer is the replacement asked to resume: the first
// deterministic target after the source among the run's attempts, a peer or this node
// (then only the source's leg is timed and the rows load here); never a pipeline, whose
// stages hold no whole cache. When it picks another way (the link from
// the source is slow, the cloud is faster), the run stops the source at once and goes on
// that way: the decision is recorded, and applied at the cut (gateCut), not taken again.
// A transfer that fails halfway (the replacement refuses rows, its stream breaks) is
// dropped, and the source's "moved" is then a cut like any other: the gate decides again,
// with the source down. A source cut while its cache moves (killed, its stream broken, its
// drain's bound passed) leaves the replacement the rows it had relayed: the stream goes on
// there (run.go, try), the replacement prefilling only the positions it lacks.

// PeerResumer is Peers when it can also resume on a peer a generation another began
// (transport/infer's Client).
type PeerResumer interface {
	Resume(ctx context.Context, p peer.ID, req *inference.Request) (inference.Resumption, error)
}

// errDeclined stops a source whose handover the gate did not take.
var errDeclined = errors.New("handover declined: the gate chose another way on")

// decided is a gate decision taken at a handover and applied at the cut: the choice, and
// the replacement's and the cloud's offsets from the source among the run's attempts (-1:
// none, as gateInput gives them).
type decided struct {
	choice      route.MoveOption
	next, cloud int
}

// relay is one attempt's offer to take a handover from its peer. It is used on the run's
// goroutine only: the peer client calls send from within the attempt's Generate, and the
// run calls taken, resume and close after it returned.
type relay struct {
	r       *run
	ctx     context.Context
	source  route.Target
	pending []route.Target // the run's attempts after the source

	declined bool // the gate did not pick live transfer, or the transfer failed
	target   route.Target
	res      inference.Resumption
}

// offerMove returns the relay of an attempt on t, or nil when the attempt cannot hand over:
// not a single peer over libp2p, a model not served deterministically, or a Peers that
// cannot resume.
func (r *run) offerMove(ctx context.Context, t route.Target, det bool) *relay {
	if _, ok := r.d.cfg.Peers.(PeerResumer); !ok || !det || t.Tier != inference.TierMesh ||
		len(t.Stages) > 0 || r.via != inference.TransportLibp2p {
		return nil
	}
	if r.d.cfg.Bandwidth != nil {
		// The gate will want the bandwidth from the peer if it leaves, and a paused peer
		// answers no probe: measure it now, off the request's path (a probe happens only
		// when no recent sample exists, within the probes' rate limits).
		r.d.background(func() { r.d.cfg.Bandwidth(r.d.bg, t.Peer) })
	}
	return &relay{r: r, ctx: ctx, source: t, pending: r.pending}
}

// send takes rows from the source: the first ones decide, the rest go to the replacement.
// It never fails: a transfer that cannot go on is dropped and the stream keeps coming from
// the source until it stops.
func (rl *relay) send(rows inference.KVRows) error {
	if rl.declined {
		return nil
	}
	if rl.res == nil {
		ok, stop := rl.open()
		if !ok {
			rl.declined = true
			if stop {
				return errDeclined
			}
			return nil
		}
	}
	if err := rl.res.Load(rows); err != nil {
		log.Debugw("live transfer dropped: the replacement took no more rows", "target", rl.target, "err", err)
		rl.close()
	}
	return nil
}

// open asks the gate, and when it picks live transfer, asks the replacement to resume. ok
// is whether the transfer goes on; stop, when it does not, whether the source is to be
// stopped now because the gate chose another way on (recorded in the run: decided).
func (rl *relay) open() (ok, stop bool) {
	r := rl.r
	attempts := append([]route.Target{rl.source}, rl.pending...)
	in, next, cloud := r.gateInput(rl.ctx, attempts, 0)
	var resume func() (inference.Resumption, error)
	if next >= 0 {
		resume = r.resumer(rl.ctx, attempts[next])
	}
	if resume == nil {
		return false, false // nothing can take the cache: the cut decides
	}
	target := attempts[next]
	in.SourceUp = true
	in.KVBytes = int64(in.PromptTokens+in.Generated) * r.kvPerToken(rl.source.Peer)
	in.Bandwidth = r.d.legs(rl.ctx, rl.source.Peer, target.Peer)
	dec := route.Gate(in)
	if dec.Choice != route.MoveLiveTransfer {
		log.Debugw("live transfer declined", "source", rl.source, "target", target, "why", dec.Why,
			"kv_bytes", in.KVBytes, "bandwidth", in.Bandwidth)
		r.d.migr.add(r, r.d.now(), in, dec)
		r.decided = &decided{choice: dec.Choice, next: next, cloud: cloud}
		return false, true
	}
	res, err := resume()
	if err != nil {
		log.Debugw("live transfer refused by the replacement", "target", target, "err", err)
		return false, false
	}
	r.d.migr.add(r, r.d.now(), in, dec)
	rl.target, rl.res = target, res
	return true, false
}

// resumer returns how t resumes the run's generation from a cache, or nil when it cannot:
// a single peer through Peers (a PeerResumer), or this node when its backend is an
// inference.Resumer (the built-in models); never a pipeline, whose stages hold no whole
// cache, nor the cloud.
func (r *run) resumer(ctx context.Context, t route.Target) func() (inference.Resumption, error) {
	switch {
	case t.Tier == inference.TierMesh && len(t.Stages) == 0:
		pr, ok := r.d.cfg.Peers.(PeerResumer)
		if !ok {
			return nil
		}
		return func() (inference.Resumption, error) { return pr.Resume(ctx, t.Peer, r.resumeRequest()) }
	case t.Tier == inference.TierLocal:
		lr, ok := r.d.cfg.Local.(inference.Resumer)
		if !ok {
			return nil
		}
		return func() (inference.Resumption, error) { return lr.Resume(ctx, r.resumeRequest()) }
	}
	return nil
}

// taken returns the replacement that took the source's cache, if one did.
func (rl *relay) taken() (route.Target, bool) { return rl.target, rl.res != nil }

// resume goes on with the stream on the replacement that took the cache (taken).
func (rl *relay) resume(ctx context.Context, replay []int, emit func(inference.Token) error) (inference.Result, error) {
	res := rl.res
	rl.res = nil
	if res == nil {
		return inference.Result{}, inference.Errorf(inference.CodeUnavailable, "no replacement took the generation")
	}
	defer res.Close()
	return res.Generate(ctx, replay, emit)
}

// close drops a transfer not resumed: no more rows are taken.
func (rl *relay) close() {
	if rl.res != nil {
		rl.res.Close()
		rl.res = nil
	}
	rl.declined = true
}

// resumeRequest is the run's request as a replacement resumes it: no replay (it comes with
// Generate), no move.
func (r *run) resumeRequest() *inference.Request {
	req := r.req
	req.Replay, req.Move = nil, nil
	return &req
}

// replayIDs are the ids of the tokens the client has.
func (r *run) replayIDs() []int {
	ids := make([]int, len(r.sent))
	for i, tok := range r.sent {
		ids[i] = tok.ID
	}
	return ids
}

// kvPerToken is the KV bytes per position p announces for the run's model (0: unknown).
func (r *run) kvPerToken(p peer.ID) int64 {
	for _, pe := range r.snap.Peers {
		if pe.Entry.Peer == p {
			m, _ := modelIn(pe.Entry.Vector, r.req.Model)
			return m.KVBytesPerToken
		}
	}
	return 0
}

// legs is the bandwidth of a relayed transfer from src to dst through this node, bytes/s:
// the slower of src's downlink to here and this node's uplink to dst (no second leg when
// dst is "": the rows load here); 0 when a leg is unknown (Config.Bandwidth).
func (d *Executor) legs(ctx context.Context, src, dst peer.ID) float64 {
	if d.cfg.Bandwidth == nil {
		return 0
	}
	down, _ := d.cfg.Bandwidth(ctx, src)
	if dst == "" {
		return max(down, 0)
	}
	_, up := d.cfg.Bandwidth(ctx, dst)
	if down <= 0 || up <= 0 {
		return 0
	}
	return min(down, up)
}

// isMoved reports whether err is a source's handover, taken or declined.
func isMoved(err error) bool {
	_, ok := errors.AsType[*inference.Moved](err)
	return ok || errors.Is(err, errDeclined)
}
