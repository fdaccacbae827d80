package dispatch

import (
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// Sampled verification of mesh results.
//
// A plan is what served a request on the mesh: one peer holding the model whole, or a
// pipeline of stages (pipeline.go), each a peer holding a range of its layers, headed by
// this node. When a request completes on a plan, for a model this node knows to be
// deterministic, and the client got the whole stream from that one plan (no resumption),
// the executor draws whether to verify it: with probability Config.VerifySample, or
// Config.VerifyProbationSample when that is higher and a peer of the plan (the lowest
// scoring, for a pipeline) scores below probationScore. A verification runs in the
// background, owned by the executor (bg and bgWG: Close cancels it and waits), at most
// maxVerifications at a time, and never delays the client's response:
//
//  1. another plan, made of vetted voters only (below), picked by route.Decide over the
//     request's own snapshot narrowed to them, runs the identical request: the same
//     inference.Request through the same peer client (or the same stage protocol, this node
//     heading) as ordinary work, so that a peer cannot tell a verification from a task.
//     Decide makes it one peer holding the model whole if a vetted one does, else a
//     pipeline over vetted peers;
//  2. the digests of the two outputs (token ids and texts) are compared; equal, every peer
//     of both plans gets reputation.VerificationPassed;
//  3. different, a third plan, vetted too and apart from the first two (below), runs it
//     and two out of three decide (inference.Judge): the plans that agree get
//     VerificationPassed for each of their peers, and the odd one out is judged by what
//     it is: a peer is penalized, a pipeline's stages are each isolated (next section).
//     No third plan, or three different outputs, is inconclusive and penalizes nobody; so
//     is an execution that fails (timeout, peer lost, a stage refusing...): a transport
//     fault says nothing about integrity.
//
// The verdict of the task is the same whatever the plans are: failed when the plan that
// served the client is the odd one out (a coordinator meters the task as zero), passed when
// another plan is, inconclusive or skipped otherwise.
//
// # Who is penalized: the liar, a peer or a stage
//
// An odd plan of one peer (a peer serving the model whole, or a pipeline of a single stage:
// its head is this node) gets VerificationFailed. An odd pipeline of several peers proves
// that at least one of its stages altered what it computed, not which: the head sees only
// what the last stage returns, and an honest stage chained behind a liar passes on wrong
// hidden states faithfully. Penalizing every stage (−70 points excludes any peer for about
// a day) would let one liar exclude every honest peer the planner chains with it, a
// cheaper attack on honest peers than lying is on clients. So each stage is isolated
// instead (isolate.go): the identical request runs again on a pipeline in which that
// stage keeps exactly its layers [lo, hi) and every other layer is held by vetted voters
// (route.PlanAround), this node heading as for any pipeline. The helpers are vetted as in
// "Who votes", none is a stage of the odd pipeline nor on the host of one (another liar of
// the pipeline could frame the stage, or cover for it), and the peers of the two plans
// that outvoted it may help. Then, against the digest those two plans agreed on:
//
//   - equal: the stage is cleared, and gets no event. It computed its range correctly in
//     this run, but it is a stage of a plan just outvoted, and a credit would pay a stage
//     that lies only on first sight of an input (below) for each of its lies caught;
//   - different: it is run once more, with helpers apart from the first run's (other
//     peers, on other hosts). Different again, the stage altered its own computation with
//     honest peers all around it, twice: it gets VerificationFailed, and is excluded like
//     a lying single peer. Equal this time, the two runs disagree (a helper of one of them
//     lied, or the stage lies only sometimes): inconclusive. A single vetted helper
//     altering what it computes so frames no honest stage, as a single vetted voter
//     convicts no honest peer: it takes two, on hosts apart;
//   - no pipeline can be planned around it (the vetted peers left cannot hold the layers
//     before and after it), or a run fails (timeout, a stage refusing...): inconclusive,
//     nobody penalized, as in a vote.
//
// The task's verdict is the vote's, whatever isolation finds; it is counted, and a
// coordinator's meter event written, once the isolation runs are done. They run one at a
// time inside the same background verification, under the same maxVerifications slot: up
// to k more runs for an odd pipeline of k stages, one more for each stage convicted, each
// as long as the request, on up to maxIsolations stages (8; past that, 8 drawn at random).
// Counted in stages_isolated (a stage cleared or convicted), stages_convicted (a part of
// it) and stages_inconclusive, so isolated + inconclusive is the stages of odd pipelines;
// a conviction logs a warning naming the stage's peer.
//
// Several liars in one pipeline: each stage is isolated alone, beside helpers and never
// beside another stage of its pipeline, so each liar is convicted on its own lie, and
// colluding stages of one pipeline gain nothing from each other: neither is in the other's
// isolation run to cover for it or to frame it. An honest stage is convicted only when
// helpers of both its runs lie, the same bound as a vote (two vetted identities on hosts
// apart: see "Who votes").
//
// What this leaves open. A stage whose earlier stages were honest sees, in its isolation
// run, the very hidden states it computed on in the task: a stage that remembers its
// inputs and lies only on first sight of one is caught at each sampled lie (the task fails
// verification, metered as zero) but cleared, never convicted. A stage that refuses its
// isolation runs, or lies only sometimes, is inconclusive (a refusal cools it down as
// unavailable, which excludes nothing). Checking a stage on the request the vote settled
// is what makes its isolated output comparable without another vote; the price is that
// the stage may recognize the request. And a mesh without the vetted peers to hold the
// layers around a stage twice over, on hosts apart, convicts nobody.
//
// # Which tasks: determinism is the model's, as this node knows it
//
// Whether a model is deterministic is decided here, never taken from the serving peer's
// capability vector, which would let a liar opt out of verification by announcing
// `deterministic: false`. A model is deterministic when its name is one of the built-in
// synthetic presets (inference/synth: their output is a function of the request alone on
// every node, by construction, so those names are reserved: serving anything else under
// one is lying), or when this node's own backend serves it and says so
// (inference.ModelInfo.Deterministic). A model this node cannot classify (an upstream model
// it does not serve itself, whatever peers announce) is not verified: two honest peers may
// legitimately disagree on it, and a verdict would punish one of them. Peers' announced
// `deterministic` flags matter only to resumption (run.go), never here. A pipeline's output
// is a deterministic model's exactly, token for token (transport/stage), so pipelines of
// such models are verified like single peers.
//
// # Who votes: vetted peers only
//
// Every peer of a plan that runs the request besides the serving one is a voter: one peer,
// or every stage of a pipeline, and every helper of an isolation run. A voter must be
// vetted (vet), as of the verification:
//
//   - connected: a direct libp2p connection exists now (registry Entry.Connected) and its
//     remote address is known (Config.PeerAddr; a peer reached only through a relay has
//     none);
//   - established: known for at least Voters.MinKnown (DefaultVoterMinKnown, 10 min) since
//     its first verified announcement here (Entry.FirstSeen; a peer forgotten after a
//     minute of silence starts over);
//   - reputed: scoring at least Voters.MinScore (DefaultVoterMinScore, 60) in this node's
//     reputation store, which only this node's own observations feed: a fresh identity
//     scores 50, and reaching 60 takes about twenty tasks completed for this node within
//     the availability half-life (10 min), fewer when it is fast or passes verifications;
//   - diverse: on another host than every peer of the plans already run (the serving
//     plan's, the second plan's), a host being the peer's IPv4 /24 or IPv6 /48 (hostOf;
//     Voters.LoopbackHosts makes each loopback address a host of its own, for testnets on
//     127.0.0.x). A serving peer whose address is not known constrains nobody. The stages
//     of one verification plan may share a host: together they are one vote.
//
// and no peer of an earlier plan may be part of a later one, so the plans are disjoint: a
// verification pipeline never reuses a stage of the pipeline it checks, which could repeat
// that stage's lie in both outputs. A plan is usable only if every one of its peers passes;
// a peer that fails is left out before the plan is made, so Decide plans around it when
// the vetted peers left can still hold the model.
//
// A sampled task with no vetted second plan is skipped (counted in skipped and in
// skipped_unvetted when peers serving the model were left out for vetting), and a
// mismatch with no vetted third plan is inconclusive: nobody is penalized, or credited, by
// a vote an unvetted peer took part in. So fresh identities cannot vote, neither to convict
// an honest peer nor to clear each other. This raises the price of the attack, it does not
// rule it out: reputation counts completed tasks, not checked ones, so two identities that
// stay up for ten minutes, serve this very node about twenty tasks each (lies, while
// nothing can check them) and sit on two networks apart from each other and from their
// target do vote. The cost on the other side is that a node verifies nothing until two
// plans' worth of peers serving the model are established on hosts apart from the serving
// plan's: a liar serving a young mesh is not caught until then, and a pipeline of k stages
// needs k more vetted peers with the memory to hold the model for each vote.

const (
	// probationScore is the score (points) under which a serving peer is verified at the
	// probation rate. New peers start at reputation.NeutralScore (50); an honest one passes
	// 60 after about twenty successful tasks, fewer with passed verifications. A peer with a
	// recent integrity penalty stays below it.
	probationScore = 60.0
	// maxVerifications bounds the verifications running at once (4). Each runs one or two
	// extra executions on peers (and, when a pipeline is outvoted, its isolation runs, one
	// at a time); past four, a burst of sampled tasks would add a burst of work to the mesh
	// rather than a sample of it, so the excess is skipped and counted.
	maxVerifications = 4
)

// Default voter thresholds (Voters).
const (
	// DefaultVoterMinKnown (10 min) is how long a voter must have been known: 40
	// heartbeats at the default period, which an identity made for an attack must keep
	// announcing before it may vote in it, and the availability half-life, over which the
	// score below is earned and fades.
	DefaultVoterMinKnown = 10 * time.Minute
	// DefaultVoterMinScore (60 points) is the score a voter must have: past probation, the
	// score under which a peer is itself verified more often. A peer still under suspicion,
	// or one this node knows nothing of (50), does not judge others.
	DefaultVoterMinScore = probationScore
)

// Voters vets the peers that may vote in a verification: see "Who votes" above. A zero
// MinKnown or MinScore takes its default; tests that start their peers just before lower
// them (a nanosecond: known at all; reputation.ExcludeBelow: any peer not excluded).
type Voters struct {
	// MinKnown is how long before now a voter's first verified announcement must be.
	MinKnown time.Duration
	// MinScore is the reputation score (points) a voter must have here, at least.
	MinScore float64
	// LoopbackHosts counts each loopback address as a host of its own (testnets binding
	// nodes to 127.0.0.x); otherwise 127.0.0.0/24 is one host like any /24.
	LoopbackHosts bool
}

// verification is the executor's verification state.
type verification struct {
	sampled, passed, failed, inconclusive, skipped atomic.Uint64
	// skippedUnvetted counts the skipped verifications whose only possible voters were not
	// vetted (a subset of skipped).
	skippedUnvetted atomic.Uint64
	// stagesIsolated counts the stages of outvoted pipelines that isolation cleared or
	// convicted, stagesConvicted those of them convicted (the stage's peer penalized), and
	// stagesInconclusive the others: no run could be made or completed, the runs disagreed,
	// or the stage was past maxIsolations (isolate.go).
	stagesIsolated, stagesConvicted, stagesInconclusive atomic.Uint64
	// running counts verifications in progress; it grows only under Executor.mu.
	running atomic.Int32
}

// deterministicModel reports whether model is deterministic by its identity as this node
// knows it (see "Which tasks"): a synthetic preset, or a model its own backend serves and
// calls deterministic. local is the request's snapshot of this node's backend.
func deterministicModel(model string, local []route.LocalModel) bool {
	if _, ok := synth.LookupPreset(model); ok {
		return true
	}
	i := slices.IndexFunc(local, func(m route.LocalModel) bool { return m.Name == model })
	return i >= 0 && local[i].Deterministic
}

// hostOf is the host a peer at addr counts as for voter diversity: its IPv4 /24 or IPv6 /48
// (what one operator typically holds), or with loopbackHosts a loopback address itself. The
// zero Prefix when addr is not valid (not known).
func hostOf(addr netip.Addr, loopbackHosts bool) netip.Prefix {
	addr = addr.Unmap().WithZone("")
	bits := 48
	switch {
	case !addr.IsValid():
		return netip.Prefix{}
	case loopbackHosts && addr.IsLoopback():
		bits = addr.BitLen()
	case addr.Is4():
		bits = 24
	}
	p, _ := addr.Prefix(bits) // bits is within addr's length
	return p
}

// hostOfPeer is the host of this node's direct connection to p; zero when none is known.
func (d *Executor) hostOfPeer(p peer.ID) netip.Prefix {
	if d.cfg.PeerAddr == nil {
		return netip.Prefix{}
	}
	return hostOf(d.cfg.PeerAddr(p), d.cfg.Voters.LoopbackHosts)
}

// vet reports whether the peer of e (keyed key in the reputation store) may vote as of now,
// and the host it votes from; see "Who votes". Diversity is the caller's: it needs the
// other hosts.
func (d *Executor) vet(e registry.Entry, key string, now time.Time) (netip.Prefix, bool) {
	v := d.cfg.Voters
	if e.Stale || !e.Connected || now.Sub(e.FirstSeen) < v.MinKnown || d.cfg.Rep.Score(key, now) < v.MinScore {
		return netip.Prefix{}, false
	}
	host := d.hostOfPeer(e.Peer)
	return host, host.IsValid()
}

// maybeVerify draws whether to verify r's successful request and, if so, starts the
// verification in the background. Nothing may use r afterwards but the verification.
//
// ev is the request's meter event on a coordinator (nil elsewhere). When maybeVerify
// returns true, the verification owns ev and records it once it has a verdict (a task that
// failed verification is metered as zero); otherwise the caller records it.
func (d *Executor) maybeVerify(r *run, ev *gateway.MeterEvent) bool {
	t := r.last
	if t.Tier != inference.TierMesh || r.resumed || !deterministicModel(r.req.Model, r.snap.Local.Models) {
		return false
	}
	rate := d.cfg.VerifySample
	if rate <= 0 { // VerifyOff, or no sampling
		return false
	}
	if d.cfg.VerifyProbationSample > rate && d.lowestScore(t) < probationScore {
		rate = d.cfg.VerifyProbationSample
	}
	d.mu.Lock()
	sampled := d.rng.Float64() < rate
	start := sampled && !d.closed && d.ver.running.Load() < maxVerifications
	if start {
		d.ver.running.Add(1)
		d.bgWG.Add(1)
	}
	d.mu.Unlock()
	if !sampled {
		return false
	}
	d.ver.sampled.Add(1)
	if !start {
		d.ver.skipped.Add(1)
		log.Debugw("verification skipped: too many running, or closing", "route", t, "model", r.req.Model)
		if ev != nil {
			ev.Verification = inference.VerdictSkipped
		}
		return false
	}
	// Ends when verify returns: its executions run under d.bg, which Close cancels. The
	// meter closes after the executor, so the event is recorded before it does.
	go func() {
		defer d.bgWG.Done()
		defer d.ver.running.Add(-1)
		verdict := d.verify(r)
		if ev != nil {
			ev.Verification, ev.Verified = verdict, verdict == inference.VerdictPassed
			if verdict == inference.VerdictFailed {
				ev.Outcome = gateway.OutcomeVerificationFailed
			}
			d.cfg.Meter.Write(*ev)
		}
	}()
	return true
}

// verify checks the output r's client received against other plans' executions of the
// same request, gives the verdict to the reputation store and returns it: passed or failed
// for the plan that served r, inconclusive, or skipped when no vetted plan could run it.
func (d *Executor) verify(r *run) inference.Verdict {
	model := r.req.Model
	ran := []route.Target{r.last}
	first := inference.DigestOf(r.sent)
	if r.output != nil {
		first = *r.output // a direct task: the tokens went to the client only
	}
	sums := []inference.Digest{first}
	// The hosts each next plan must stand apart from: the serving plan's peers' (read now,
	// just after its task, while they are still connected), then each voter's.
	hosts := d.planHosts(r.snap, r.last)
	for {
		v, ok := d.pickVerifier(r, ran, hosts)
		if !ok {
			if len(ran) == 1 {
				d.ver.skipped.Add(1)
				if v.unvetted {
					d.ver.skippedUnvetted.Add(1)
					log.Debugw("verification skipped: no plan of vetted voters can run the model", "route", r.last, "model", model)
				} else {
					log.Debugw("verification skipped: no other peer serves the model", "route", r.last, "model", model)
				}
				return inference.VerdictSkipped
			}
			d.ver.inconclusive.Add(1)
			log.Debugw("verification inconclusive: outputs differ and no vetted third plan can decide", "route", r.last, "model", model)
			return inference.VerdictInconclusive
		}
		sum, err := d.replay(v.t, r)
		if err != nil {
			d.ver.inconclusive.Add(1)
			log.Debugw("verification inconclusive: an execution failed", "route", v.t, "model", model, "err", err)
			return inference.VerdictInconclusive
		}
		ran, sums, hosts = append(ran, v.t), append(sums, sum), append(hosts, v.hosts...)
		odd, settled := inference.Judge(sums)
		switch {
		case settled:
			d.settle(model, ran, odd)
			if odd >= 0 && len(planKeys(ran[odd])) > 1 {
				d.isolate(r, ran[odd], sums[(odd+1)%len(sums)])
			}
			// Counted once the isolation runs are done too: sampled less the outcomes is
			// what is still running.
			if odd < 0 {
				d.ver.passed.Add(1)
			} else {
				d.ver.failed.Add(1)
			}
			if odd == 0 {
				return inference.VerdictFailed
			}
			return inference.VerdictPassed
		case len(sums) == 3:
			d.ver.inconclusive.Add(1)
			log.Debugw("verification inconclusive: three different outputs", "route", r.last, "model", model)
			return inference.VerdictInconclusive
		}
	}
}

// settle records a verdict: VerificationPassed for every peer of every plan in ran but
// ran[odd], and VerificationFailed for ran[odd]'s peer when that plan is one peer (a
// pipeline's stages are isolated next: see "Who is penalized"); odd is -1 when every plan
// agreed.
func (d *Executor) settle(model string, ran []route.Target, odd int) {
	now := d.now()
	for i, t := range ran {
		keys := planKeys(t)
		switch {
		case i != odd:
			for _, k := range keys {
				d.cfg.Rep.Observe(k, reputation.VerificationPassed, now)
			}
		case len(keys) == 1:
			log.Warnw("peer failed verification: its output differs from two other plans'", "route", t, "model", model)
			d.cfg.Rep.Observe(keys[0], reputation.VerificationFailed, now)
		default:
			log.Warnw("pipeline failed verification: its output differs from two other plans'; "+
				"each of its stages is isolated next", "route", t, "model", model)
		}
	}
}

// planKeys are the reputation keys of t's peers, distinct, in plan order: its one peer, or
// each stage's.
func planKeys(t route.Target) []string {
	if len(t.Stages) == 0 {
		return []string{t.RepKey()}
	}
	keys := make([]string, 0, len(t.Stages))
	for _, s := range t.Stages {
		if !slices.Contains(keys, s.Peer) {
			keys = append(keys, s.Peer)
		}
	}
	return keys
}

// lowestScore is the lowest score among t's peers.
func (d *Executor) lowestScore(t route.Target) float64 {
	now := d.now()
	low := reputation.MaxScore
	for _, k := range planKeys(t) {
		low = min(low, d.cfg.Rep.Score(k, now))
	}
	return low
}

// planHosts are the hosts of t's peers as far as they are known: snap has the peer IDs of
// a pipeline's stages.
func (d *Executor) planHosts(snap *route.Snapshot, t route.Target) []netip.Prefix {
	var hosts []netip.Prefix
	add := func(p peer.ID) {
		if h := d.hostOfPeer(p); h.IsValid() && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	if len(t.Stages) == 0 {
		add(t.Peer)
		return hosts
	}
	for _, k := range planKeys(t) {
		for _, p := range snap.Peers {
			if peerKey(p) == k {
				add(p.Entry.Peer)
				break
			}
		}
	}
	return hosts
}

// peerKey is p's key in the reputation store.
func peerKey(p route.Peer) string {
	if p.Key != "" {
		return p.Key
	}
	return p.Entry.Peer.String()
}

// voterPick is pickVerifier's answer: the plan and its peers' hosts, or, when there is
// none, whether that is for want of vetting.
type voterPick struct {
	t     route.Target
	hosts []netip.Prefix
	// unvetted is true when no plan was found although peers in no plan of ran serve the
	// model: some were left out as not vetted, or on the host of a peer already run.
	unvetted bool
}

// pickVerifier picks a plan of vetted voters, none of them a peer of a plan in ran nor on
// one of hosts, to run r's request again: route.Decide over the request's own snapshot,
// narrowed to those peers (voters), this model only; one peer holding the model whole if
// one can, else a pipeline. Vetting and scores are as of now, so a peer excluded since the
// request was decided is not picked.
func (d *Executor) pickVerifier(r *run, ran []route.Target, hosts []netip.Prefix) (voterPick, bool) {
	now := d.now()
	var used []string // the peers of the plans already run
	for _, t := range ran {
		used = append(used, planKeys(t)...)
	}
	vs := d.voters(r, used, hosts, now)
	if len(vs.snap.Peers) == 0 {
		return voterPick{unvetted: vs.serving}, false
	}
	// The decision's own copy: the request sent to the peer stays exactly the client's.
	req := r.req
	req.Prefs.Privacy, req.Prefs.Route = inference.PrivacyMesh, inference.RouteExplicit
	dec := d.decide(&req, &vs.snap, now)
	for _, t := range dec.Attempts {
		if t.Tier != inference.TierMesh {
			continue
		}
		v := voterPick{t: t}
		for _, k := range planKeys(t) {
			if h := vs.hosts[k]; !slices.Contains(v.hosts, h) {
				v.hosts = append(v.hosts, h)
			}
		}
		return v, true
	}
	// The vetted peers cannot hold the model together, say: the others might have.
	return voterPick{unvetted: vs.leftOut}, false
}

// voterSet is voters' answer.
type voterSet struct {
	// snap is the request's snapshot narrowed to the voters: peers only, no local or cloud
	// tier.
	snap route.Snapshot
	// hosts are the voters' hosts by reputation key.
	hosts map[string]netip.Prefix
	// serving: some peer outside used serves the model; leftOut: some such peer is not a
	// voter (not vetted, or on one of the hosts).
	serving, leftOut bool
}

// voters are the peers of r's snapshot serving its model that may vote as of now (vet):
// none of them a peer in used, nor on one of hosts.
func (d *Executor) voters(r *run, used []string, hosts []netip.Prefix, now time.Time) voterSet {
	s := *r.snap
	s.Local, s.Cloud, s.Scratch = route.Local{}, route.Cloud{}, nil
	s.Peers = make([]route.Peer, 0, len(r.snap.Peers))
	vs := voterSet{hosts: map[string]netip.Prefix{}}
	for _, p := range r.snap.Peers {
		key := peerKey(p)
		if _, serves := modelIn(p.Entry.Vector, r.req.Model); !serves || slices.Contains(used, key) {
			continue
		}
		vs.serving = true
		if host, ok := d.vet(p.Entry, key, now); ok && !slices.Contains(hosts, host) {
			s.Peers = append(s.Peers, p)
			vs.hosts[key] = host
		} else {
			vs.leftOut = true
		}
	}
	vs.snap = s
	return vs
}

// replay runs r's request on the plan t (a peer, or a pipeline this node heads) as ordinary
// work and returns its output's digest. The outcome feeds the reputation store like any
// attempt's.
func (d *Executor) replay(t route.Target, r *run) (inference.Digest, error) {
	h := inference.NewDigester()
	m := d.measure(&r.req)
	emit := func(tok inference.Token) error {
		m.token()
		h.Add(tok)
		return nil
	}
	var (
		res inference.Result
		err error
	)
	if len(t.Stages) > 0 {
		res, _, err = d.pipelineRun(d.bg, t, &r.req, emit, nil)
	} else {
		res, err = d.peerGenerate(d.bg, t.Peer, &r.req, emit, nil)
	}
	m.served = res.Usage.PromptTokens
	d.observe(t, r.req.Model, false, err, false, m)
	return h.Sum(), err
}

// verificationStatus is the "routing.verification" object of /api/status. The outcomes are
// read before sampled, so sampled is never below their sum, skipped_unvetted before skipped
// (counted after it), so it is never above it, and stages_convicted before stages_isolated
// likewise.
func (d *Executor) verificationStatus() console.Verification {
	v := &d.ver
	out := console.Verification{SkippedUnvetted: v.skippedUnvetted.Load()}
	out.Passed, out.Failed = v.passed.Load(), v.failed.Load()
	out.Inconclusive, out.Skipped = v.inconclusive.Load(), v.skipped.Load()
	out.Sampled = v.sampled.Load()
	out.StagesConvicted = v.stagesConvicted.Load()
	out.StagesIsolated, out.StagesInconclusive = v.stagesIsolated.Load(), v.stagesInconclusive.Load()
	return out
}
