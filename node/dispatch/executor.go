package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	logging "github.com/ipfs/go-log/v2"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/infer"
	"github.com/meshinfer/meshinfer/transport/openai"
)

var log = logging.Logger("node/dispatch")

// Peers runs a request on a peer (transport/infer's Client).
type Peers interface {
	Generate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error)
}

// Registry lists the peers this node knows (mesh/registry's Registry).
type Registry interface {
	Entries(now time.Time) []registry.Entry
}

// Loader is implemented by backends that can load a model without running a request (the
// synthetic backend); speculative dispatch needs it.
type Loader interface {
	Load(ctx context.Context, model string) error
}

// Config is what an Executor uses. Peers, Registry and Rep are required.
type Config struct {
	// Mesh is the mesh's name, for error messages.
	Mesh string
	// Local is this node's backend as its owner's consent allows it; nil: none. When it is
	// a Loader, speculative decisions load it ahead of a request.
	Local inference.Backend
	// Peers runs requests on peers over libp2p streams.
	Peers Peers
	// Cloud is the cloud tier; nil: none. CloudModels are the models it is asked for
	// (empty: any), at CloudUSDPerMTok.
	Cloud           inference.Backend
	CloudModels     []string
	CloudUSDPerMTok float64
	// CloudAllowed reports whether the owner agreed to cloud fallback, asked per decision;
	// nil: allowed.
	CloudAllowed func() bool
	// Registry is the peer registry; Latency the measured round trip to a peer (0: unknown;
	// nil: none measured).
	Registry Registry
	Latency  func(peer.ID) time.Duration
	// Connected reports whether this node holds a connection to a peer now; nil: every
	// peer counts as connected. Routing tries clean connected peers first
	// (route.Peer.Unconnected).
	Connected func(peer.ID) bool
	// SilentAfter is how long a request of this node may wait on a peer for its first
	// token before the peer counts as silent, tried after the others until the request
	// hears from it or ends (route.Peer.Silent): a frozen peer is passed over by the
	// requests that come after the first one it holds, not met by each of them until
	// their first-token timeouts. 0: DefaultSilentAfter.
	SilentAfter time.Duration
	// Bandwidth is the measured bandwidth with a peer, bytes/s each way (0: unknown), for
	// the gate's live transfer (handover.go); it may probe the peer first, within the
	// probes' bounds. nil: none measured, and no live transfer is ever picked.
	Bandwidth func(ctx context.Context, p peer.ID) (down, up float64)
	// Rep is the reputation store every attempt's outcome goes to.
	Rep *reputation.Store
	// Degraded is called when a route degraded (a peer timed out, the cloud failed); the
	// node re-runs its capability probe. nil: nothing.
	Degraded func()
	// WebRTC opens data channels to peers and Streams runs requests on them, for requests
	// whose transport preference is webrtc (webrtc.go). nil: libp2p streams only.
	WebRTC  DirectPaths
	Streams StreamGenerator
	// VerifySample and VerifyProbationSample are the shares of mesh results for
	// deterministic models verified (verify.go); VerifyOff (or 0) for none.
	VerifySample, VerifyProbationSample float64
	// Voters vets the peers that may vote in a verification (verify.go); zero fields take
	// the defaults.
	Voters Voters
	// PeerAddr is the remote IP address of this node's direct connection to a peer (the
	// host's open connections), or the zero Addr when there is none: not connected, or
	// only through a relay. Voters need one; nil: no peer has one, so nothing is verified.
	PeerAddr func(peer.ID) netip.Addr
	// Self is this node's peer ID: serving peers make their receipts out to it.
	Self peer.ID
	// Meter meters finished requests on a coordinator; nil: nothing is metered.
	Meter Meter
	// Dialer opens direct-task streams to peers (direct.go); nil: no direct tasks.
	Dialer StreamOpener
	// Head runs the head's side of a pipeline (embeddings, sampling) and Pipelines opens
	// the chain of stages, for models no single peer holds (pipeline.go); nil: no pipelines.
	Head      inference.Head
	Pipelines PipelineOpener
	// AcceptsDirect reports whether a peer takes direct tasks (it answers WebRTC set-ups:
	// its owner enabled them); nil: every peer does. Direct tasks go only to those.
	AcceptsDirect func(peer.ID) bool
	// Now is the clock; nil: time.Now. Durations are measured on it too.
	Now func() time.Time
	// Seed seeds the executor's random source (weighted draws, exploration, sampling).
	Seed uint64
}

// DefaultSilentAfter (1 s) is far past a healthy peer's first token for a prompt of a few
// hundred tokens (tens of milliseconds on a LAN), and far short of the first-token
// timeout (30 s, which a cold model's load may need). A peer busy with a long prefill may
// count as silent too: it is then only tried after the others, which is where it belongs.
const DefaultSilentAfter = time.Second

// VerifyOff as a sample rate turns verification off.
const VerifyOff = -1.0

// Executor executes requests; see the package documentation. Its methods are safe for
// concurrent use.
type Executor struct {
	cfg Config

	stats routingStats
	ver   verification
	migr  migrations

	mu  sync.Mutex
	rng *rand.Rand
	// localTPS, localCold, cloudTTFT and cloudTPS are what routing is told of this node's
	// models and of the cloud (EWMA); the gate's finer figures are in localRates and cloud.
	localTPS  map[string]float64       // measured tokens/s per local model
	localCold map[string]time.Duration // measured cold start per local model
	cloudTTFT time.Duration            // measured cloud time to first token
	cloudTPS  float64                  // measured cloud tokens/s
	// tokenRatio is, per model, the prompt tokens servers report per token routing
	// estimates (route.PromptTokens; EWMA of completed attempts): the gate counts a
	// session's KV bytes and prefill time in the model's own tokens.
	tokenRatio map[string]float64
	// peerRates, pipeRates, localRates and cloud are the prefill and decode rates measured
	// of each peer per model, of each pipeline (by its route), of this node per model and
	// of the cloud, for the gate (rates.go).
	peerRates  map[rateKey]*rates
	pipeRates  map[rateKey]*rates
	localRates map[string]*rates
	cloud      rates
	keys       map[peer.ID]string // peer ID strings (encoding one costs ~1.5 µs)
	inflight   map[peer.ID]int    // requests this node has running on each peer
	// waiting are, per peer, when each of this node's requests that has not yet heard its
	// first token from it began (at most perPeerLimit a peer; Silent).
	waiting map[peer.ID][]time.Time
	scratch route.Scratch // Decide's working memory, used under mu
	closed  bool          // Close has begun: no more background work starts

	// Background work runs under bg: local loads that a speculative request started and no
	// longer waits for (the cloud won) until done, verifications (verify.go) and meter
	// writes. Close cancels bg and waits.
	bg       context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup
}

// New returns an executor over cfg.
func New(cfg Config) (*Executor, error) {
	switch {
	case cfg.Peers == nil:
		return nil, errors.New("dispatch: no peer client")
	case cfg.Registry == nil:
		return nil, errors.New("dispatch: no registry")
	case cfg.Rep == nil:
		return nil, errors.New("dispatch: no reputation store")
	case cfg.Voters.MinKnown < 0:
		return nil, fmt.Errorf("dispatch: voters known for %v: need a duration of at least 0", cfg.Voters.MinKnown)
	case !(cfg.Voters.MinScore >= 0 && cfg.Voters.MinScore <= reputation.MaxScore):
		return nil, fmt.Errorf("dispatch: voter score %v: need a score in [0, %v]", cfg.Voters.MinScore, reputation.MaxScore)
	}
	if cfg.Voters.MinKnown == 0 {
		cfg.Voters.MinKnown = DefaultVoterMinKnown
	}
	if cfg.Voters.MinScore == 0 {
		cfg.Voters.MinScore = DefaultVoterMinScore
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SilentAfter <= 0 {
		cfg.SilentAfter = DefaultSilentAfter
	}
	if cfg.Latency == nil {
		cfg.Latency = func(peer.ID) time.Duration { return 0 }
	}
	if cfg.Degraded == nil {
		cfg.Degraded = func() {}
	}
	bg, cancel := context.WithCancel(context.Background())
	return &Executor{
		cfg:      cfg,
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		localTPS: map[string]float64{}, localCold: map[string]time.Duration{},
		tokenRatio: map[string]float64{},
		peerRates:  map[rateKey]*rates{}, pipeRates: map[rateKey]*rates{}, localRates: map[string]*rates{},
		keys: map[peer.ID]string{}, inflight: map[peer.ID]int{}, waiting: map[peer.ID][]time.Time{},
		bg: bg, bgCancel: cancel,
	}, nil
}

// now is the executor's clock (Config.Now).
func (d *Executor) now() time.Time { return d.cfg.Now() }

// Close cancels the background work and waits for it. It is idempotent; requests running
// when it is called end on their own contexts.
func (d *Executor) Close() error {
	d.mu.Lock()
	d.closed = true // background adds to bgWG under mu only while !closed: no Add races Wait
	d.mu.Unlock()
	d.bgCancel()
	d.bgWG.Wait()
	return nil
}

// Models lists this node's models, every model announced by a fresh peer, and the cloud's.
func (d *Executor) Models(ctx context.Context) []openai.Model {
	byID := map[string]*openai.Model{}
	var order []string
	var local []route.LocalModel
	add := func(id string, where inference.Served, warm bool) {
		m, ok := byID[id]
		if !ok {
			m = &openai.Model{ID: id, Deterministic: deterministicModel(id, local)}
			byID[id] = m
			order = append(order, id)
		}
		m.Routes = append(m.Routes, where.Route())
		m.Warm = m.Warm || warm
	}
	if d.cfg.Local != nil {
		if infos, err := d.cfg.Local.Models(ctx); err == nil {
			for _, m := range infos {
				local = append(local, route.LocalModel{Name: m.Name, Deterministic: m.Deterministic})
				add(m.Name, inference.Served{Tier: inference.TierLocal}, m.Warm)
			}
		}
	}
	for _, e := range d.cfg.Registry.Entries(d.now()) {
		if e.Stale || !e.Contacted || e.Vector == nil {
			continue
		}
		for _, m := range e.Vector.Models {
			add(m.Name, inference.Served{Tier: inference.TierMesh, Peer: e.Peer.String()}, m.State == caps.ModelWarm)
		}
	}
	for _, m := range d.cfg.CloudModels {
		add(m, inference.Served{Tier: inference.TierCloud}, true)
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
// once with overloaded, so the executor does not try: a peer with that many of this node's
// requests running is left out of the decision, and a request that only such peers could
// serve is refused with overloaded here, without a round trip. That is what keeps a
// coordinator's refusals fast under load. The count is this node's own, exact; two
// decisions racing for a peer's last slot can still meet the peer's own refusal.
const perPeerLimit = infer.DefaultMaxInFlightPerPeer

// snapshot gathers what route.Decide needs, as of now. full are the peers left out for
// having perPeerLimit of this node's requests running. The backend's listing is read
// before the lock is taken: a backend answers it from memory (inference.Backend), and no
// decision or slot release waits behind it even if one does not.
func (d *Executor) snapshot(ctx context.Context, now time.Time) (s *route.Snapshot, full []registry.Entry) {
	s = &route.Snapshot{Rep: d.cfg.Rep, Tune: route.DefaultTuning()}
	var infos []inference.ModelInfo
	if d.cfg.Local != nil {
		if ms, err := d.cfg.Local.Models(ctx); err == nil {
			infos = ms
			s.Local.Accepting = len(ms) > 0
		}
	}
	// Only peers this node has been connected to are candidates: anyone can sign vectors of
	// made-up identities, and trying them would cost a request its time (registry.Entry).
	entries := slices.DeleteFunc(d.cfg.Registry.Entries(now), func(e registry.Entry) bool { return !e.Contacted })
	cloud := d.cfg.Cloud != nil && (d.cfg.CloudAllowed == nil || d.cfg.CloudAllowed())
	var cloudDet []string // the models the cloud says it serves deterministically
	if cloud {
		if models, err := d.cfg.Cloud.Models(ctx); err == nil {
			for _, m := range models {
				if m.Deterministic {
					cloudDet = append(cloudDet, m.Name)
				}
			}
		}
	}
	latency := make([]time.Duration, len(entries))
	unconnected := make([]bool, len(entries))
	for i, e := range entries {
		latency[i] = d.cfg.Latency(e.Peer)
		unconnected[i] = d.cfg.Connected != nil && !d.cfg.Connected(e.Peer)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range infos {
		s.Local.Models = append(s.Local.Models, route.LocalModel{
			Name: m.Name, Warm: m.Warm, Deterministic: m.Deterministic,
			TokensPerSec: d.localTPS[m.Name], ColdStart: d.localCold[m.Name],
		})
	}
	if len(d.keys) > 2*len(entries)+64 {
		clear(d.keys) // forgotten peers
	}
	if len(d.peerRates) > 4*len(entries)+64 {
		d.forgetRates(entries)
	}
	s.Peers = make([]route.Peer, 0, len(entries))
	for i, e := range entries {
		if d.inflight[e.Peer] >= perPeerLimit {
			full = append(full, e)
			continue
		}
		key, ok := d.keys[e.Peer]
		if !ok {
			key = e.Peer.String()
			d.keys[e.Peer] = key
		}
		s.Peers = append(s.Peers, route.Peer{Entry: e, Key: key, RTT: latency[i], Unconnected: unconnected[i],
			Silent: d.silentLocked(e.Peer, now)})
	}
	if cloud {
		s.Cloud = route.Cloud{
			Enabled: true, Models: d.cfg.CloudModels, Deterministic: cloudDet,
			TTFT: d.cloudTTFT, TokensPerSec: d.cloudTPS, USDPerMTok: d.cfg.CloudUSDPerMTok,
		}
	}
	return s, full
}

// Generate routes req and serves it; see the package documentation. emit receives each
// token with where it is being served; the returned Served says where the request ended.
func (d *Executor) Generate(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	now := d.now()
	snap, full := d.snapshot(ctx, now)
	dec := d.decide(req, snap, now)
	d.countPenalized(dec)
	if len(dec.Attempts) == 0 {
		d.stats.none.Add(1)
		return inference.Result{}, inference.Served{}, d.nothingServes(req, dec, full)
	}
	r := &run{d: d, snap: snap, emit: emit, req: *req}
	r.req.Model = dec.Model
	start := d.now()
	res, err := r.serve(ctx, dec)
	d.migr.done(r, d.now(), err)
	d.stats.count(r.last.Tier)
	// On a coordinator the task is metered, with the serving peer's receipt when it holds;
	// a verified task is metered once the verification has its verdict. Checking the
	// receipt, countersigning it and syncing the event take a few hundred microseconds,
	// which the client's response does not wait for: they run in the background, or here
	// when the executor is closing.
	at := r.served() // before r goes to the background
	metered := false
	if d.cfg.Meter != nil {
		billed := res
		if err != nil {
			// A request that ended early (the client hung up, a target failed mid-stream) is
			// metered with the tokens the client did get, and its prompt at the request's
			// bound: no target counted it back (inference.Request.UnfinishedUsage).
			billed.Usage = r.req.UnfinishedUsage(len(r.sent))
		}
		var ev gateway.MeterEvent
		if ev, metered = d.cfg.Meter.Event(ctx, r.req.Model, at, billed, err, d.now().Sub(start)); metered {
			rres := res
			if !d.background(func() { d.meter(r, rres, err, ev) }) {
				d.meter(r, rres, err, ev)
			}
		}
	}
	if !metered && err == nil {
		d.maybeVerify(r, nil) // in the background: the client's response does not wait
	}
	res.Receipt = "" // the peer's record, not the client's
	return res, at, err
}

// background runs fn on a goroutine Close waits for, and reports whether it did: false once
// Close has begun.
func (d *Executor) background(fn func()) bool {
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

// countPenalized counts, in reputation's routes_penalized, a decision whose attempt order
// the executor applies and that put a penalized peer behind a clean one.
func (d *Executor) countPenalized(dec route.Decision) {
	if dec.Penalized && d.cfg.Rep != nil {
		d.cfg.Rep.CountPenalizedRoute()
	}
}

// decide runs route.Decide over snap with the executor's working memory and random source,
// which it uses under mu. Decide is pure and does no I/O.
func (d *Executor) decide(req *inference.Request, snap *route.Snapshot, now time.Time) route.Decision {
	d.mu.Lock()
	defer d.mu.Unlock()
	snap.Scratch = &d.scratch
	defer func() { snap.Scratch = nil }()
	return route.Decide(req, snap, now, d.rng)
}

// nothingServes is the error for a decision without targets, saying why per tier: overloaded
// when a peer left out as full serves the model, model_not_found otherwise.
func (d *Executor) nothingServes(req *inference.Request, dec route.Decision, full []registry.Entry) error {
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
		"no target in mesh %q can serve model %q%s; GET /v1/models lists what is available", d.cfg.Mesh, model, why)
}

// hold counts a request of this node running on peer p (perPeerLimit) until the returned
// function is called.
func (d *Executor) hold(p peer.ID) (release func()) {
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

// await notes a request of this node on peer p waiting for its first token, until the
// returned function is called (at the first token, or the end; more calls do nothing).
func (d *Executor) await(p peer.ID) (heard func()) {
	began := d.now()
	d.mu.Lock()
	d.waiting[p] = append(d.waiting[p], began)
	d.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			w := d.waiting[p]
			if k := slices.Index(w, began); k >= 0 {
				w = slices.Delete(w, k, k+1)
			}
			if len(w) == 0 {
				delete(d.waiting, p)
			} else {
				d.waiting[p] = w
			}
		})
	}
}

// silentLocked reports whether a request of this node has waited on p for its first token
// for SilentAfter or longer.
func (d *Executor) silentLocked(p peer.ID, now time.Time) bool {
	for _, began := range d.waiting[p] {
		if now.Sub(began) >= d.cfg.SilentAfter {
			return true
		}
	}
	return false
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
