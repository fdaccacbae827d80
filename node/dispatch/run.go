package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/node/console"
)

// run is one request's way through its attempts.
type run struct {
	d    *Executor
	snap *route.Snapshot
	emit func(inference.Served, inference.Token) error
	req  inference.Request

	attempts int
	last     route.Target        // the target of the latest attempt
	via      inference.Transport // how the latest mesh attempt reached its peer
	sent     []inference.Token   // what the client has, in order
	// sentDet is true while every token the client has came from a deterministic target,
	// which is what makes a resumption possible.
	sentDet bool
	// resumed is true once an attempt continued a stream another target began: the client's
	// output then comes from more than one target and is not verified.
	resumed bool
	// output is the digest of what the client received when this node never saw it (a
	// direct task: the serving peer's receipt names it); nil: the digest of sent.
	output *inference.Digest
	// moves are the gate's decisions for the run's cuts (migrate.go), completed when it
	// ends.
	moves []*console.MigrationDecision
	// stageReceipts are the latest attempt's stages' receipts, countersigned, when it ran
	// on a pipeline that completed.
	stageReceipts []inference.StageReceipt
	// pending are the attempts after the one running: where a handover may go
	// (handover.go).
	pending []route.Target
	// decided is the gate's decision at a handover it did not take, which the next cut
	// applies (gateCut).
	decided *decided
}

// served says where the run's latest attempt ran.
func (r *run) served() inference.Served {
	if r.attempts == 0 {
		return inference.Served{}
	}
	return r.at(r.last)
}

// at is where an attempt of the run on t is served.
func (r *run) at(t route.Target) inference.Served {
	s := inference.Served{Tier: t.Tier, Attempts: r.attempts, Model: r.req.Model}
	switch {
	case t.Tier == inference.TierMesh && len(t.Stages) > 0:
		s.Stages, s.Transport = t.Stages, inference.TransportLibp2p
	case t.Tier == inference.TierMesh:
		s.Peer, s.Transport = t.Peer.String(), r.via
	}
	return s
}

// serve runs the decision's attempts until one completes or no target is left.
func (r *run) serve(ctx context.Context, dec route.Decision) (inference.Result, error) {
	attempts := dec.Attempts
	var lastErr error
	if ld, ok := r.d.cfg.Local.(Loader); ok && dec.Speculative {
		res, err, done, cloudLeft := r.speculate(ctx, ld, attempts[0], attempts[1])
		if done {
			return res, err
		}
		// Nothing reached the client and neither side completed. The remaining targets
		// follow, the cloud again if it was only cancelled.
		lastErr = err
		if cloudLeft {
			attempts = attempts[1:]
		} else {
			attempts = attempts[2:]
		}
	}
	// A backend that cannot load ahead (an upstream server) just runs the plan in order.
	replans := 0
	for i := 0; i < len(attempts); i++ {
		t := attempts[i]
		if len(r.sent) > 0 && !(r.sentDet && r.deterministic(t)) {
			continue // this target cannot continue the stream the client has
		}
		if r.attempts > 0 {
			if len(r.sent) > 0 {
				r.d.stats.resumptions.Add(1)
				log.Debugw("resuming a cut stream", "target", t, "model", r.req.Model, "sent", len(r.sent))
			} else {
				r.d.stats.failovers.Add(1)
				log.Debugw("target failed before streaming; trying the next", "target", t, "model", r.req.Model, "err", lastErr)
			}
		}
		r.pending = attempts[i+1:]
		res, err, final := r.try(ctx, t)
		r.pending = nil
		if final {
			return res, err
		}
		lastErr = err
		// A pipeline that lost a stage is planned again without it (the stage's peer now
		// cools down), and the stream goes on there like any resumption.
		if len(t.Stages) > 0 && replans < maxReplans {
			replans++
			if next, ok := r.replan(ctx, t); ok {
				attempts = slices.Insert(slices.Clone(attempts), i+1, next)
			}
		}
		// A request nothing has reached yet takes its next peers from a decision made now,
		// not from the one made when it began: in the seconds a silent peer cost, other
		// requests may have found peers stalled, gone or full.
		if len(r.sent) == 0 {
			attempts = r.refreshed(ctx, attempts, i)
		}
		// A stream cut mid-way goes on the way the viability gate picks (migrate.go).
		if len(r.sent) > 0 {
			var ok bool
			if attempts, ok = r.gateCut(ctx, attempts, i); !ok {
				break
			}
		}
	}
	if lastErr == nil {
		lastErr = inference.Errorf(inference.CodeUnavailable, "no target could serve model %q", r.req.Model)
	}
	return inference.Result{}, lastErr
}

// maxReplans bounds how many times one request's pipeline is planned again after a stage
// failed: each costs a regeneration of what was already sent.
const maxReplans = 2

// replan decides the run's request afresh after the pipeline failed lost a stage and
// returns the new pipeline, if it differs.
func (r *run) replan(ctx context.Context, failed route.Target) (route.Target, bool) {
	now := r.d.now()
	snap, _ := r.d.snapshot(ctx, now)
	snap.Local, snap.Cloud = route.Local{}, route.Cloud{} // the rest of the plan stands
	dec := r.d.decide(&r.req, snap, now)
	for _, t := range dec.Attempts {
		if len(t.Stages) > 0 && !slices.Equal(t.Stages, failed.Stages) {
			return t, true
		}
	}
	return route.Target{}, false
}

// refreshed returns attempts with its single peers after i decided again, as of now: the
// same number at most, the peers of attempts[:i+1] left out, the other targets where they
// were. The executor's view of the mesh then is what the next attempts go on: peers that
// other requests found silent or gone since are cooling down, peers with perPeerLimit of
// this node's requests running are left out, and peers that came since are candidates. A
// request thus spends its attempts on the peers that are best now, not on those that were
// when it began, which may be seconds ago (a first-token timeout).
func (r *run) refreshed(ctx context.Context, attempts []route.Target, i int) []route.Target {
	single := func(t route.Target) bool { return t.Tier == inference.TierMesh && len(t.Stages) == 0 }
	if !slices.ContainsFunc(attempts[i+1:], single) {
		return attempts
	}
	now := r.d.now()
	snap, _ := r.d.snapshot(ctx, now)
	dec := r.d.decide(&r.req, snap, now)
	tried := func(t route.Target) bool {
		return slices.ContainsFunc(attempts[:i+1], func(u route.Target) bool { return single(u) && u.Peer == t.Peer })
	}
	var fresh []route.Target
	for _, t := range dec.Attempts {
		if single(t) && !tried(t) {
			fresh = append(fresh, t)
		}
	}
	out := slices.Clone(attempts[:i+1])
	for _, t := range attempts[i+1:] {
		switch {
		case !single(t):
			out = append(out, t)
		case len(fresh) > 0:
			out, fresh = append(out, fresh[0]), fresh[1:]
		}
	}
	r.snap = snap // the peers' vectors as the next attempts were decided on
	return out
}

// errResumeMismatch stops an attempt whose regenerated prefix differs from what the client
// already has.
var errResumeMismatch = errors.New("resumed stream differs from the tokens already sent")

// try runs one attempt on t. final is true when the request must end with (res, err):
// success, the client gone, a mismatch, or an error that another target would not fix.
func (r *run) try(ctx context.Context, t route.Target) (res inference.Result, err error, final bool) {
	r.attempts++
	r.last = t
	r.via = r.d.transportFor(&r.req)
	r.stageReceipts = nil
	skip := len(r.sent)
	det := r.deterministic(t)
	if skip == 0 {
		r.sentDet = det
	} else {
		r.resumed = true
	}
	var (
		emitErr, mismatch error
		m                 = r.d.measure(&r.req)
		at                inference.Served // where the tokens come from: set at the first
	)
	m.skip = skip
	forward := func(tok inference.Token) error {
		if m.tokens == 0 {
			// The transport is settled by now (a WebRTC attempt falls back before its first
			// token), and the peer ID's string form costs about 1.5 µs: once per attempt.
			at = r.at(t)
		}
		m.token()
		if tok.Index < skip {
			// Ids are compared when both sides know them: an upstream streams text only.
			if had := r.sent[tok.Index]; had.Text != tok.Text || (had.ID >= 0 && tok.ID >= 0 && had.ID != tok.ID) {
				mismatch = fmt.Errorf("%w: token %d", errResumeMismatch, tok.Index)
				return mismatch
			}
			return nil
		}
		if emitErr = r.emit(at, tok); emitErr != nil {
			return emitErr
		}
		r.sent = append(r.sent, tok)
		return nil
	}
	req := &r.req
	if skip > 0 {
		// The target takes the stream on from the tokens the client has: one that can
		// (the built-in models, here, on a peer or heading a pipeline) prefills them with
		// the prompt as one batch, one that cannot generates them again. Either way they
		// come back first, checked against what was sent and skipped by forward.
		req = r.replaying()
	}
	rl := r.offerMove(ctx, t, det)
	if rl != nil {
		moving := *req
		moving.Move = &inference.Move{Send: rl.send}
		req = &moving
	}
	res, err = r.d.runOn(ctx, t, req, forward, &r.via, &r.stageReceipts, r.replaceStage(t, det, m))
	if rl != nil {
		if mismatch == nil && emitErr == nil && (isMoved(err) || cutMidTransfer(ctx, err)) {
			// The peer handed the generation over, or was cut while its cache moved: the
			// stream goes on from the replacement that took the cache (all of it, or the
			// rows it was sent before the cut: it prefills the positions it lacks), which
			// sends every token from index 0 again; forward skips those the client has.
			if next, ok := rl.taken(); ok {
				cut := err // a source cut is recorded as any; a leaving one is never penalized
				if isMoved(err) {
					cut = nil
				}
				r.d.observe(t, r.req.Model, false, cut, false, m)
				r.d.stats.resumptions.Add(1)
				r.attempts++
				t, r.last, r.resumed, skip, m = next, next, true, len(r.sent), r.d.measure(&r.req)
				m.skip, m.tookOver = skip, true
				res, err = rl.resume(ctx, r.replayIDs(), forward)
			}
		}
		rl.close()
	}
	if skip > 0 && inference.CodeOf(err) == inference.CodeInvalidRequest {
		// The request was served this far: ids a backend cannot replay (tokens a peer
		// sent that are none of the model's) mean the stream was not the model's.
		mismatch = fmt.Errorf("%w: %v", errResumeMismatch, err)
	}
	m.served, m.replayed = res.Usage.PromptTokens, min(max(res.Replayed, 0), len(req.Replay))
	// The request's context ending (the client gone, its time limit passed) ends the
	// attempt however the target was doing: a slow peer cut by a client's 2 s limit did
	// not time out by the mesh's bounds, and is neither penalized nor reported degraded.
	r.d.observe(t, r.req.Model, r.coldAt(t), err, emitErr != nil || ctx.Err() != nil, m)
	switch {
	case err == nil:
		return res, nil, true
	case mismatch != nil:
		r.d.stats.resumeMismatches.Add(1)
		return inference.Result{}, inference.Errorf(inference.CodeVerificationFailed,
			"resuming on %s: %v; the stream cannot be continued faithfully", t, mismatch), true
	case emitErr != nil || ctx.Err() != nil:
		return inference.Result{}, err, true
	case !inference.CodeOf(err).Retryable():
		return inference.Result{}, err, true
	}
	return inference.Result{}, err, false
}

// cutMidTransfer reports whether err, an attempt's end during a live transfer, is a cut the
// stream can go on from on the replacement: the source went (killed, its drain or pause
// bound passed, its stream broke) rather than the request ending, and the client is still
// there.
func cutMidTransfer(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && inference.CodeOf(err).Retryable()
}

// runOn runs req on one target. via is set to the transport a mesh attempt ended up on,
// and receipts to a pipeline's stage receipts.
func (d *Executor) runOn(ctx context.Context, t route.Target, req *inference.Request, emit func(inference.Token) error,
	via *inference.Transport, receipts *[]inference.StageReceipt, replace ReplaceStage) (inference.Result, error) {
	switch t.Tier {
	case inference.TierLocal:
		return d.cfg.Local.Generate(ctx, req, emit)
	case inference.TierCloud:
		return d.cfg.Cloud.Generate(ctx, req, emit)
	}
	if len(t.Stages) > 0 {
		*via = inference.TransportLibp2p
		res, rs, err := d.pipelineRun(ctx, t, req, emit, replace)
		*receipts = rs
		return res, err
	}
	return d.peerGenerate(ctx, t.Peer, req, emit, via)
}

// transportFor is the transport a mesh attempt of req starts on.
func (d *Executor) transportFor(req *inference.Request) inference.Transport {
	if req.Prefs.Transport == inference.TransportWebRTC && d.cfg.WebRTC != nil {
		return inference.TransportWebRTC
	}
	return inference.TransportLibp2p
}

// peerGenerate runs req on peer p, counted in the peer's in-flight requests from this node.
// via, when not nil, is set to the transport the attempt ended up on.
func (d *Executor) peerGenerate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error, via *inference.Transport) (inference.Result, error) {
	defer d.hold(p)()
	heard := d.await(p)
	defer heard()
	emitHeard := func(tok inference.Token) error {
		heard()
		return emit(tok)
	}
	if d.transportFor(req) == inference.TransportWebRTC {
		return d.viaWebRTC(ctx, p, req, emitHeard, via)
	}
	return d.cfg.Peers.Generate(ctx, p, req, emitHeard)
}

// replaying is the run's request continuing the stream the client has (Request.Replay):
// the ids of the tokens sent, or none when a token's id is not known (an upstream's).
func (r *run) replaying() *inference.Request {
	req := r.req
	if slices.ContainsFunc(r.sent, func(tok inference.Token) bool { return tok.ID < 0 }) {
		return &req
	}
	req.Replay = r.replayIDs()
	return &req
}

// deterministic reports whether t serves the run's model deterministically.
func (r *run) deterministic(t route.Target) bool {
	switch t.Tier {
	case inference.TierLocal:
		for _, m := range r.snap.Local.Models {
			if m.Name == r.req.Model {
				return m.Deterministic
			}
		}
	case inference.TierMesh:
		if len(t.Stages) > 0 {
			return deterministicModel(r.req.Model, r.snap.Local.Models)
		}
		for _, p := range r.snap.Peers {
			if p.Entry.Peer == t.Peer {
				return deterministicIn(p.Entry.Vector, r.req.Model)
			}
		}
	case inference.TierCloud:
		// Only when the cloud says so (another meshinfer node's API does, of the
		// built-in models): a cloud is not assumed to be.
		return slices.Contains(r.snap.Cloud.Deterministic, r.req.Model)
	}
	return false
}

// coldAt reports whether the run's model was cold at t when the request was decided.
func (r *run) coldAt(t route.Target) bool {
	if t.Tier != inference.TierLocal {
		return false
	}
	for _, m := range r.snap.Local.Models {
		if m.Name == r.req.Model {
			return !m.Warm
		}
	}
	return false
}

// timing measures one attempt on the executor's clock: when it started, its first and
// latest token, the first of the tokens the client did not have yet (fresh, the first
// after skip), and how many tokens came. prompt is the request's prompt in its model's
// tokens as measured so far (promptTokens), estimate the same as routing estimates it
// (route.PromptTokens); skip is the tokens the client had when the attempt started (sent
// again first, and replayed or generated again: replayed, the target's Result.Replayed);
// tookOver says the attempt went on from a cache another node handed over; restaged, that
// a stage of the attempt's pipeline moved to other peers during it (stagemove.go); served
// is the prompt tokens its server reported on completion (0: not known). What rates.go
// learns from an attempt is in observe.
type timing struct {
	now                       func() time.Time
	start, first, fresh, last time.Time
	tokens                    int
	prompt, estimate          int
	skip, replayed            int
	tookOver                  bool
	restaged                  atomic.Bool // set by the pipeline's goroutines
	served                    int
}

func (d *Executor) measure(req *inference.Request) *timing {
	est := route.PromptTokens(req)
	return &timing{now: d.cfg.Now, start: d.now(), prompt: d.modelTokens(req.Model, est), estimate: est}
}

// token notes a token's arrival.
func (m *timing) token() {
	t := m.now()
	if m.tokens == 0 {
		m.first = t
	}
	if m.tokens == m.skip {
		m.fresh = t
	}
	m.tokens++
	m.last = t
}

// sample is what the attempt measured for rates.go, its first token's time from its
// start: the positions the target prefilled before its first token, the prompt (as its
// server counted it, else as measured so far) and the tokens it replayed, none when it
// took a cache over (it prefilled only the positions it lacked); and its decode steps,
// over the tokens the client did not have yet after the first of them (those sent again
// come in a burst after a replay's prefill, and say nothing of the target's decoding), at
// their mean context: the step that makes token k attends over the prompt and k tokens.
func (m *timing) sample() sample {
	prompt := m.prompt
	if m.served > 0 {
		prompt = m.served
	}
	s := sample{first: m.first.Sub(m.start)}
	if !m.tookOver {
		s.prefilled = prompt + m.replayed
	}
	if n := m.tokens - m.skip; n >= 2 && m.last.After(m.fresh) {
		s.ctx = prompt + (m.skip+m.tokens)/2
		s.step = m.last.Sub(m.fresh) / time.Duration(n-1)
	}
	return s
}
