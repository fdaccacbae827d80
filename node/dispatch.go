package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/infer"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// dispatcher is the router's executor. For each API request that may leave this device
// (local-only ones never reach it: the API hands them to inference/localonly) it takes a
// snapshot of this node, the registry and the cloud tier, asks route.Decide where to go,
// and runs the attempts in order:
//
//   - a failure before the first token moves the whole request to the next target
//     (failover), with nothing kept of the failed attempt;
//   - a failure after tokens streamed resumes on the next target when both serve the model
//     deterministically: the new target regenerates from the start and the tokens the
//     client already has are checked against it and skipped, so the client sees one
//     contiguous stream; otherwise the request ends with the typed error;
//   - a speculative decision (a cold local model, the cloud allowed) loads the local model
//     while a cloud stream starts: whichever comes first — local ready or the cloud's first
//     token — serves, and a losing cloud stream is cancelled.
//
// Every attempt's outcome goes to the reputation store, and a degraded route (a peer timing
// out, the cloud failing) makes the capability probe re-run. A sample of the requests one
// peer served deterministically is verified afterwards on other peers (verify.go). On a
// coordinator each finished request is metered against its client's API key (gateway.go).
type dispatcher struct {
	n     *Node
	local inference.Backend // the node's backend as the owner's consent allows; nil: none
	peers peerGenerator     // the peer protocol's client
	cloud inference.Backend // the cloud tier; nil when none is configured
	// cloudModels are the models the cloud is asked for (empty: any).
	cloudModels []string

	stats routingStats
	ver   verification

	// rtc and direct carry mesh attempts over WebRTC data channels when a request asks for
	// them (webrtc.go); nil: libp2p streams only.
	rtc      directPaths
	direct   streamGenerator
	rtcStats struct{ dispatched, fallbacks atomic.Uint64 }

	mu        sync.Mutex
	rng       *rand.Rand
	localTPS  map[string]float64       // measured tokens/s per local model (EWMA)
	localCold map[string]time.Duration // measured cold start per local model (EWMA)
	cloudTTFT time.Duration            // measured cloud time to first token (EWMA)
	cloudTPS  float64                  // measured cloud tokens/s (EWMA)
	keys      map[peer.ID]string       // peer ID strings (encoding one costs ~1.5 µs)
	inflight  map[peer.ID]int          // requests this node has running on each peer
	scratch   route.Scratch            // Decide's working memory, used under mu
	closed    bool                     // Close has begun: no more background work starts

	// Background work runs under bg: local loads that a speculative request started and no
	// longer waits for (the cloud won) until done, and verifications (verify.go). Close
	// cancels bg and waits.
	bg       context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup
}

// peerGenerator runs a request on a peer (transport/infer's Client).
type peerGenerator interface {
	Generate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error)
}

// loader is implemented by backends that can load a model without running a request (the
// synthetic backend); speculative dispatch needs it.
type loader interface {
	Load(ctx context.Context, model string) error
}

// routingStats are the counters under /api/status "routing".
type routingStats struct {
	local, mesh, cloud, none             atomic.Uint64
	specStarted, specCancelled, specKept atomic.Uint64
	failovers, resumptions, probeReruns  atomic.Uint64
	resumeMismatches, receiptsRefused    atomic.Uint64
	fullRefusals, direct                 atomic.Uint64
}

func newDispatcher(n *Node, peers peerGenerator, cloud inference.Backend, cloudModels []string, seed uint64) *dispatcher {
	bg, cancel := context.WithCancel(context.Background())
	return &dispatcher{
		n: n, local: n.ownerBackend(), peers: peers, cloud: cloud, cloudModels: cloudModels,
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		localTPS: map[string]float64{}, localCold: map[string]time.Duration{},
		keys: map[peer.ID]string{}, inflight: map[peer.ID]int{}, bg: bg, bgCancel: cancel,
	}
}

// Close cancels the background work and waits for it.
func (d *dispatcher) Close() error {
	d.mu.Lock()
	d.closed = true // verify adds to bgWG under mu only while !closed: no Add races Wait
	d.mu.Unlock()
	d.bgCancel()
	d.bgWG.Wait()
	return nil
}

// Models lists this node's models, every model announced by a fresh peer, and the cloud's.
func (d *dispatcher) Models(ctx context.Context) []openai.Model {
	byID := map[string]*openai.Model{}
	var order []string
	add := func(id, where string, warm bool) {
		m, ok := byID[id]
		if !ok {
			m = &openai.Model{ID: id}
			byID[id] = m
			order = append(order, id)
		}
		m.Routes = append(m.Routes, where)
		m.Warm = m.Warm || warm
	}
	if d.local != nil {
		if local, err := d.local.Models(ctx); err == nil {
			for _, m := range local {
				add(m.Name, route.Target{Tier: route.TierLocal}.String(), m.Warm)
			}
		}
	}
	for _, e := range d.n.reg.Entries(d.n.cfg.Now()) {
		if e.Stale || e.Vector == nil {
			continue
		}
		for _, m := range e.Vector.Models {
			add(m.Name, route.Target{Tier: route.TierMesh, Peer: e.Peer}.String(), m.State == caps.ModelWarm)
		}
	}
	for _, m := range d.cloudModels {
		add(m, route.Target{Tier: route.TierCloud}.String(), true)
	}
	slices.Sort(order)
	out := make([]openai.Model, 0, len(order))
	for _, id := range order {
		out = append(out, *byID[id])
	}
	return out
}

// perPeerLimit is how many requests from one requester a peer runs at once
// (infer.DefaultMaxInFlightPerPeer; nodes do not change it). Past it the peer refuses at
// once with overloaded, so the dispatcher does not try: a peer with that many of this node's
// requests running is left out of the decision, and a request that only such peers could
// serve is refused with overloaded here, without a round trip. That is what keeps a
// coordinator's refusals fast under load. The count is this node's own, exact; two
// decisions racing for a peer's last slot can still meet the peer's own refusal.
const perPeerLimit = infer.DefaultMaxInFlightPerPeer

// snapshot gathers what route.Decide needs, as of now. full are the peers left out for
// having perPeerLimit of this node's requests running.
func (d *dispatcher) snapshot(ctx context.Context, now time.Time) (s *route.Snapshot, full []registry.Entry) {
	s = &route.Snapshot{Rep: d.n.rep, Tune: route.DefaultTuning()}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.local != nil {
		if infos, err := d.local.Models(ctx); err == nil {
			s.Local.Accepting = len(infos) > 0
			for _, m := range infos {
				s.Local.Models = append(s.Local.Models, route.LocalModel{
					Name: m.Name, Warm: m.Warm, Deterministic: m.Deterministic,
					TokensPerSec: d.localTPS[m.Name], ColdStart: d.localCold[m.Name],
				})
			}
		}
	}
	ps := d.n.host.Peerstore()
	entries := d.n.reg.Entries(now)
	if len(d.keys) > 2*len(entries)+64 {
		clear(d.keys) // forgotten peers
	}
	s.Peers = make([]route.Peer, 0, len(entries))
	for _, e := range entries {
		if d.inflight[e.Peer] >= perPeerLimit {
			full = append(full, e)
			continue
		}
		key, ok := d.keys[e.Peer]
		if !ok {
			key = e.Peer.String()
			d.keys[e.Peer] = key
		}
		s.Peers = append(s.Peers, route.Peer{Entry: e, Key: key, RTT: ps.LatencyEWMA(e.Peer)})
	}
	if d.cloud != nil && d.n.part.cloudAllowed() {
		s.Cloud = route.Cloud{
			Enabled: true, Models: d.cloudModels,
			TTFT: d.cloudTTFT, TokensPerSec: d.cloudTPS, USDPerMTok: d.n.cfg.CloudUSDPerMTok,
		}
	}
	return s, full
}

// Generate routes req and serves it; see the type's documentation.
func (d *dispatcher) Generate(ctx context.Context, req *inference.Request, emit func(openai.Served, inference.Token) error) (inference.Result, openai.Served, error) {
	now := d.n.cfg.Now()
	snap, full := d.snapshot(ctx, now)
	dec := d.decide(req, snap, now)
	if len(dec.Attempts) == 0 {
		d.stats.none.Add(1)
		return inference.Result{}, openai.Served{}, d.nothingServes(req, dec, full)
	}
	r := &run{d: d, snap: snap, emit: emit, req: *req}
	r.req.Model = dec.Model
	start := time.Now()
	res, err := r.serve(ctx, dec)
	switch r.last.Tier {
	case route.TierLocal:
		d.stats.local.Add(1)
	case route.TierMesh:
		d.stats.mesh.Add(1)
	case route.TierCloud:
		d.stats.cloud.Add(1)
	}
	// On a coordinator the task is metered, with the serving peer's receipt when it holds;
	// a verified task is metered once the verification has its verdict. Checking the
	// receipt, countersigning it and syncing the event take a few hundred microseconds,
	// which the client's response does not wait for: they run in the background, or here
	// when the dispatcher is closing.
	if ev, metered := d.n.tasks.event(ctx, r.req.Model, r.served(), res, err, time.Since(start)); metered {
		rr, rres := r, res
		if !d.background(func() { d.meter(rr, rres, err, ev) }) {
			d.meter(rr, rres, err, ev)
		}
	} else if err == nil {
		d.maybeVerify(r, nil) // in the background: the client's response does not wait
	}
	res.Receipt = "" // the peer's record, not the client's
	return res, r.served(), err
}

// meter records the meter event of r's request (result res, error err): with the serving
// peer's receipt when it holds, after the verification's verdict when it is verified.
func (d *dispatcher) meter(r *run, res inference.Result, err error, ev gateway.MeterEvent) {
	if err == nil && r.last.Tier == route.TierMesh {
		sent := inference.DigestOf(r.sent)
		if _, ok := d.receiptFor(r, res, &sent); ok {
			ev.Receipt = res.Receipt
		}
	}
	if !(err == nil && d.maybeVerify(r, &ev)) {
		d.n.tasks.write(ev)
	}
}

// background runs fn on a goroutine Close waits for, and reports whether it did: false once
// Close has begun.
func (d *dispatcher) background(fn func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.bgWG.Add(1)
	go func() {
		defer d.bgWG.Done()
		fn()
	}()
	return true
}

// decide runs route.Decide over snap with the dispatcher's working memory and random
// source, which it uses under mu.
func (d *dispatcher) decide(req *inference.Request, snap *route.Snapshot, now time.Time) route.Decision {
	d.mu.Lock()
	defer d.mu.Unlock()
	snap.Scratch = &d.scratch
	defer func() { snap.Scratch = nil }()
	return route.Decide(req, snap, now, d.rng)
}

// nothingServes is the error for a decision without targets, saying why per tier: overloaded
// when a peer left out as full serves the model, model_not_found otherwise.
func (d *dispatcher) nothingServes(req *inference.Request, dec route.Decision, full []registry.Entry) error {
	for _, e := range full {
		if _, serves := modelIn(e.Vector, req.Model); !e.Stale && (req.Model == "" || serves) {
			d.stats.fullRefusals.Add(1)
			return inference.Errorf(inference.CodeOverloaded,
				"every peer serving model %q that this node could use is busy with %d of its requests; retry shortly",
				req.Model, perPeerLimit)
		}
	}
	why := ""
	for _, e := range dec.Estimates {
		if !e.OK && e.Why != "" {
			why += fmt.Sprintf("; %s: %s", e.Tier, e.Why)
		}
	}
	model := dec.Model
	if model == "" {
		model = req.Model
	}
	return inference.Errorf(inference.CodeModelNotFound,
		"no target in mesh %q can serve model %q%s; GET /v1/models lists what is available", d.n.cfg.Mesh, model, why)
}

// run is one request's way through its attempts.
type run struct {
	d    *dispatcher
	snap *route.Snapshot
	emit func(openai.Served, inference.Token) error
	req  inference.Request

	attempts int
	last     route.Target      // the target of the latest attempt
	sent     []inference.Token // what the client has, in order
	// sentDet is true while every token the client has came from a deterministic target,
	// which is what makes a resumption possible.
	sentDet bool
	// resumed is true once an attempt continued a stream another target began: the client's
	// output then comes from more than one target and is not verified.
	resumed bool
	// output is the digest of what the client received when this node never saw it (a
	// direct task: the serving peer's receipt names it); nil: the digest of sent.
	output *inference.Digest
}

func (r *run) served() openai.Served {
	if r.attempts == 0 {
		return openai.Served{}
	}
	return openai.Served{Route: r.last.String(), Attempts: r.attempts, Model: r.req.Model}
}

// serve runs the decision's attempts until one completes or no target is left.
func (r *run) serve(ctx context.Context, dec route.Decision) (inference.Result, error) {
	attempts := dec.Attempts
	var lastErr error
	if dec.Speculative {
		if _, ok := r.d.n.backend.(loader); ok { // the backend itself can load ahead
			ld := r.d.local.(loader)
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
	}
	for _, t := range attempts {
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
		res, err, final := r.try(ctx, t)
		if final {
			return res, err
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = inference.Errorf(inference.CodeUnavailable, "no target could serve model %q", r.req.Model)
	}
	return inference.Result{}, lastErr
}

// errResumeMismatch stops an attempt whose regenerated prefix differs from what the client
// already has.
var errResumeMismatch = errors.New("resumed stream differs from the tokens already sent")

// try runs one attempt on t. final is true when the request must end with (res, err):
// success, the client gone, a mismatch, or an error that another target would not fix.
func (r *run) try(ctx context.Context, t route.Target) (res inference.Result, err error, final bool) {
	r.attempts++
	r.last = t
	at := openai.Served{Route: t.String(), Attempts: r.attempts, Model: r.req.Model}
	skip := len(r.sent)
	det := r.deterministic(t)
	if skip == 0 {
		r.sentDet = det
	} else {
		r.resumed = true
	}
	var (
		emitErr, mismatch error
		start             = time.Now()
		first, lastTok    time.Time
		got               int
	)
	forward := func(tok inference.Token) error {
		now := time.Now()
		if got == 0 {
			first = now
		}
		got++
		lastTok = now
		if tok.Index < skip {
			if had := r.sent[tok.Index]; had.Text != tok.Text || had.ID != tok.ID {
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
	res, err = r.d.runOn(ctx, t, &r.req, forward)
	r.d.observe(t, r.req.Model, r.coldAt(t), err, emitErr != nil, start, first, lastTok, got)
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

// runOn runs req on one target.
func (d *dispatcher) runOn(ctx context.Context, t route.Target, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	switch t.Tier {
	case route.TierLocal:
		return d.local.Generate(ctx, req, emit)
	case route.TierCloud:
		return d.cloud.Generate(ctx, req, emit)
	}
	return d.peerGenerate(ctx, t.Peer, req, emit)
}

// peerGenerate runs req on peer p, counted in the peer's in-flight requests from this node.
func (d *dispatcher) peerGenerate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	defer d.hold(p)()
	if req.Prefs.Transport == inference.TransportWebRTC && d.rtc != nil {
		return d.viaWebRTC(ctx, p, req, emit)
	}
	return d.peers.Generate(ctx, p, req, emit)
}

// hold counts a request of this node running on peer p (perPeerLimit) until the returned
// function is called.
func (d *dispatcher) hold(p peer.ID) (release func()) {
	d.mu.Lock()
	d.inflight[p]++
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		if d.inflight[p]--; d.inflight[p] <= 0 {
			delete(d.inflight, p)
		}
		d.mu.Unlock()
	}
}

// modelIn returns what v announces of model, and whether it announces it.
func modelIn(v *caps.Vector, model string) (caps.Model, bool) {
	if v != nil {
		for _, m := range v.Models {
			if m.Name == model {
				return m, true
			}
		}
	}
	return caps.Model{}, false
}

// deterministicIn reports whether v announces model as deterministic.
func deterministicIn(v *caps.Vector, model string) bool {
	m, _ := modelIn(v, model)
	return m.Deterministic
}

// deterministic reports whether t serves the run's model deterministically.
func (r *run) deterministic(t route.Target) bool {
	switch t.Tier {
	case route.TierLocal:
		for _, m := range r.snap.Local.Models {
			if m.Name == r.req.Model {
				return m.Deterministic
			}
		}
	case route.TierMesh:
		for _, p := range r.snap.Peers {
			if p.Entry.Peer == t.Peer {
				return deterministicIn(p.Entry.Vector, r.req.Model)
			}
		}
	}
	return false // the cloud is not assumed to be
}

// coldAt reports whether the run's model was cold at t when the request was decided.
func (r *run) coldAt(t route.Target) bool {
	if t.Tier != route.TierLocal {
		return false
	}
	for _, m := range r.snap.Local.Models {
		if m.Name == r.req.Model {
			return !m.Warm
		}
	}
	return false
}

// speculate races the local model's load against a cloud stream (see dispatcher). done is
// false when nothing reached the client and no side completed, so the caller goes on with
// the remaining targets; err is then the last failure, and cloudLeft says the cloud did not
// fail (local won the race, then failed) and may still be tried.
func (r *run) speculate(ctx context.Context, ld loader, local, cloud route.Target) (res inference.Result, err error, done, cloudLeft bool) {
	d := r.d
	d.stats.specStarted.Add(1)

	// The load runs under the dispatcher's context: when the cloud wins, it goes on warming
	// the model for the next request, owned by the dispatcher (Close waits for it).
	ready := make(chan error, 1)
	started := d.background(func() {
		start := time.Now()
		err := ld.Load(d.bg, r.req.Model)
		if err == nil {
			d.noteColdStart(r.req.Model, time.Since(start))
		}
		ready <- err
	})
	if !started { // Close has begun: start nothing it would not wait for
		return inference.Result{}, inference.Errorf(inference.CodeShuttingDown, "node is shutting down"), true, false
	}

	// The cloud stream runs on its own goroutine, which Generate waits for (cloudDone) on
	// every path. It may emit to the client only once it has claimed the race with its first
	// token; once local has claimed it, the cloud's next emit stops it.
	const (
		undecided = iota
		localWon
		cloudWon
	)
	var (
		claimMu sync.Mutex
		winner  = undecided
	)
	claim := func(w int) int {
		claimMu.Lock()
		defer claimMu.Unlock()
		if winner == undecided {
			winner = w
		}
		return winner
	}
	cctx, cancelCloud := context.WithCancel(ctx)
	defer cancelCloud()
	type outcome struct {
		res  inference.Result
		err  error
		last bool
	}
	cloudDone := make(chan outcome, 1)
	r.attempts++ // the cloud attempt
	cloudAttempt := r.attempts
	r.last = cloud
	go func() {
		at := openai.Served{Route: cloud.String(), Attempts: cloudAttempt, Model: r.req.Model}
		start := time.Now()
		var first, lastTok time.Time
		got := 0
		var emitErr error
		res, err := d.cloud.Generate(cctx, &r.req, func(tok inference.Token) error {
			if claim(cloudWon) != cloudWon {
				return errSpeculationLost
			}
			now := time.Now()
			if got == 0 {
				first = now
			}
			got++
			lastTok = now
			if emitErr = r.emit(at, tok); emitErr != nil {
				return emitErr
			}
			r.sent = append(r.sent, tok)
			return nil
		})
		if !errors.Is(err, errSpeculationLost) {
			d.observe(cloud, r.req.Model, false, err, emitErr != nil, start, first, lastTok, got)
		}
		cloudDone <- outcome{res, err, emitErr != nil}
	}()

	select {
	case lerr := <-ready:
		if lerr == nil && claim(localWon) == localWon {
			cancelCloud()
			<-cloudDone
			d.stats.specCancelled.Add(1)
			res, err, final := r.try(ctx, local)
			return res, err, final, true
		}
		// The cloud already streams, or the local load failed: the cloud goes on.
		o := <-cloudDone
		if len(r.sent) > 0 || o.err == nil {
			d.stats.specKept.Add(1)
			return o.res, o.err, true, false
		}
		return inference.Result{}, o.err, o.last || ctx.Err() != nil, false
	case o := <-cloudDone:
		if len(r.sent) > 0 || o.err == nil || o.last || ctx.Err() != nil {
			if len(r.sent) > 0 || o.err == nil {
				d.stats.specKept.Add(1)
			}
			return o.res, o.err, true, false
		}
		// The cloud failed before its first token: local serves once loaded.
		select {
		case lerr := <-ready:
			if lerr != nil {
				return inference.Result{}, o.err, false, false
			}
		case <-ctx.Done():
			return inference.Result{}, ctx.Err(), true, false
		}
		res, err, final := r.try(ctx, local)
		return res, err, final, false
	}
}

var errSpeculationLost = errors.New("speculative cloud stream lost the race to the local model")

// observe turns one attempt's outcome into reputation events and measurements, and re-runs
// the capability probe when a route degraded.
func (d *dispatcher) observe(t route.Target, model string, cold bool, err error, clientGone bool, start, first, last time.Time, tokens int) {
	now := d.n.cfg.Now()
	var o reputation.Outcome
	record := true
	switch code := inference.CodeOf(err); {
	case err == nil:
		o = reputation.Success
	case clientGone || errors.Is(err, context.Canceled):
		o = reputation.ClientDisconnected
	case code == inference.CodeTimeout:
		o = reputation.Timeout
	case code == inference.CodeUnavailable, code == inference.CodePeerLost, code == inference.CodeModelNotFound:
		o = reputation.Unavailable
	case code == inference.CodeContextOverflow:
		o = reputation.ContextOverflow
	case code == inference.CodeOverloaded, code == inference.CodePolicyPaused, code == inference.CodeShuttingDown:
		o = reputation.Rejected
	default:
		record = false // invalid_request and the like say nothing about the target
	}
	if record {
		d.n.rep.Record(reputation.Target{Model: model, Peer: t.RepKey()}, o, now)
	}
	if err != nil && (o == reputation.Timeout || (t.Tier == route.TierCloud && o == reputation.Unavailable)) {
		d.stats.probeReruns.Add(1)
		d.n.probe.Refresh()
	}
	if err != nil || tokens == 0 {
		return
	}
	ttft := first.Sub(start)
	var tps float64
	if tokens > 1 && last.After(first) {
		tps = float64(tokens-1) / last.Sub(first).Seconds()
	}
	switch t.Tier {
	case route.TierMesh:
		d.n.rep.RecordPerformance(t.RepKey(), ttft, tps, now)
	case route.TierLocal:
		d.mu.Lock()
		if tps > 0 {
			d.localTPS[model] = ewma(d.localTPS[model], tps)
		}
		d.mu.Unlock()
		if cold {
			d.noteColdStart(model, ttft)
		}
	case route.TierCloud:
		d.mu.Lock()
		d.cloudTTFT = time.Duration(ewma(float64(d.cloudTTFT), float64(ttft)))
		if tps > 0 {
			d.cloudTPS = ewma(d.cloudTPS, tps)
		}
		d.mu.Unlock()
	}
}

func (d *dispatcher) noteColdStart(model string, took time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.localCold[model] = time.Duration(ewma(float64(d.localCold[model]), float64(took)))
}

// ewma folds x into avg (0 = no sample yet) with weight 1/4.
func ewma(avg, x float64) float64 {
	if avg == 0 {
		return x
	}
	return avg + (x-avg)/4
}

// routing is the "routing" object of /api/status.
func (d *dispatcher) routing() console.Routing {
	s := &d.stats
	return console.Routing{
		Requests: console.TierCounts{
			Local: s.local.Load(), Mesh: s.mesh.Load(), Cloud: s.cloud.Load(), NoTarget: s.none.Load(),
		},
		Speculative: console.Speculative{
			Started: s.specStarted.Load(), Cancelled: s.specCancelled.Load(), Kept: s.specKept.Load(),
		},
		Failovers:        s.failovers.Load(),
		Resumptions:      s.resumptions.Load(),
		ResumeMismatches: s.resumeMismatches.Load(),
		ProbeReruns:      s.probeReruns.Load(),
		ReceiptsRefused:  s.receiptsRefused.Load(),
		BusyRefusals:     s.fullRefusals.Load(),
		Direct:           s.direct.Load(),
	}
}
