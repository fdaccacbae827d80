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
// When a request completes on a peer, for a model this node knows to be deterministic, and
// the client got the whole stream from that one peer (no resumption), the executor draws
// whether to verify it: with probability Config.VerifySample, or Config.VerifyProbationSample
// when that is higher and the peer scores below probationScore. A verification runs in the
// background, owned by the executor (bg and bgWG: Close cancels it and waits), at most
// maxVerifications at a time, and never delays the client's response:
//
//  1. a second peer serving the same model, a vetted voter (below), picked by route.Decide
//     over the request's own snapshot without the first peer, runs the identical request:
//     the same inference.Request through the same peer client as ordinary work, so that a
//     peer cannot tell a verification from a task;
//  2. the digests of the two outputs (token ids and texts) are compared; equal, both peers
//     get reputation.VerificationPassed;
//  3. different, a third peer, vetted too and on another host than the first two, runs it
//     and two out of three decide (inference.Judge): the odd one out gets
//     VerificationFailed, the two that agree VerificationPassed. No third voter, or three
//     different outputs, is inconclusive and penalizes nobody; so is an execution that
//     fails (timeout, peer lost...): a transport fault says nothing about integrity.
//
// With the default reputation parameters one VerificationFailed (-70 points) takes any peer
// below the exclusion threshold (at most 100 - 70 = 30 < 40), so a liar leaves the candidate
// set after its first failed verification, and stays out for about a day (12 h half-life).
// That weight is why who may vote matters as much as who is checked.
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
// `deterministic` flags matter only to resumption (run.go), never here.
//
// # Who votes: vetted peers only
//
// Every peer that runs the request besides the serving one is a voter, and a voter must be
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
//   - diverse: on another host than the serving peer and the other voter, a host being the
//     peer's IPv4 /24 or IPv6 /48 (hostOf; Voters.LoopbackHosts makes each loopback address
//     a host of its own, for testnets on 127.0.0.x). A serving peer whose address is not
//     known constrains nobody.
//
// A sampled task with no vetted second voter is skipped (counted in skipped and in
// skipped_unvetted when peers serving the model were there but none was vetted), and a
// mismatch with no vetted third voter is inconclusive: nobody is penalized, or credited, by
// a vote an unvetted peer took part in. So fresh identities cannot vote, neither to convict
// an honest peer nor to clear each other. This raises the price of the attack, it does not
// rule it out: reputation counts completed tasks, not checked ones, so two identities that
// stay up for ten minutes, serve this very node about twenty tasks each (lies, while
// nothing can check them) and sit on two networks apart from each other and from their
// target do vote. The cost on the other side is that a node verifies nothing until two
// peers serving the model are established on hosts apart from the serving one: a liar
// serving a young mesh is not caught until then.

const (
	// probationScore is the score (points) under which a serving peer is verified at the
	// probation rate. New peers start at reputation.NeutralScore (50); an honest one passes
	// 60 after about twenty successful tasks, fewer with passed verifications. A peer with a
	// recent integrity penalty stays below it.
	probationScore = 60.0
	// maxVerifications bounds the verifications running at once (4). Each runs one or two
	// extra executions on peers; past four, a burst of sampled tasks would add a burst of
	// work to the mesh rather than a sample of it, so the excess is skipped and counted.
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
	if t.Tier != inference.TierMesh || len(t.Stages) > 0 || r.resumed || !deterministicModel(r.req.Model, r.snap.Local.Models) {
		return false // pipelines are not verified yet (issue 16, part 7)
	}
	rate := d.cfg.VerifySample
	if rate <= 0 { // VerifyOff, or no sampling
		return false
	}
	if d.cfg.VerifyProbationSample > rate && d.cfg.Rep.Score(t.RepKey(), d.now()) < probationScore {
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
		log.Debugw("verification skipped: too many running, or closing", "peer", t.Peer, "model", r.req.Model)
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

// verify checks the output r's client received against other peers' executions of the same
// request, gives the verdict to the reputation store and returns it: passed or failed for
// the peer that served r, inconclusive, or skipped when no vetted voter could run it.
func (d *Executor) verify(r *run) inference.Verdict {
	model := r.req.Model
	ran := []route.Target{r.last}
	first := inference.DigestOf(r.sent)
	if r.output != nil {
		first = *r.output // a direct task: the tokens went to the client only
	}
	sums := []inference.Digest{first}
	// The hosts each next voter must stand apart from: the serving peer's (read now, just
	// after its task, while it is still connected), then each voter's.
	var hosts []netip.Prefix
	if h := d.hostOfPeer(r.last.Peer); h.IsValid() {
		hosts = append(hosts, h)
	}
	for {
		v, ok := d.pickVerifier(r, ran, hosts)
		if !ok {
			if len(ran) == 1 {
				d.ver.skipped.Add(1)
				if v.unvetted {
					d.ver.skippedUnvetted.Add(1)
					log.Debugw("verification skipped: no peer serving the model is a vetted voter", "peer", r.last.Peer, "model", model)
				} else {
					log.Debugw("verification skipped: no other peer serves the model", "peer", r.last.Peer, "model", model)
				}
				return inference.VerdictSkipped
			}
			d.ver.inconclusive.Add(1)
			log.Debugw("verification inconclusive: outputs differ and no vetted third peer can decide", "peer", r.last.Peer, "model", model)
			return inference.VerdictInconclusive
		}
		sum, err := d.replay(v.t, r)
		if err != nil {
			d.ver.inconclusive.Add(1)
			log.Debugw("verification inconclusive: an execution failed", "peer", v.t.Peer, "model", model, "err", err)
			return inference.VerdictInconclusive
		}
		ran, sums, hosts = append(ran, v.t), append(sums, sum), append(hosts, v.host)
		odd, settled := inference.Judge(sums)
		switch {
		case settled:
			d.settle(model, ran, odd)
			if odd == 0 {
				return inference.VerdictFailed
			}
			return inference.VerdictPassed
		case len(sums) == 3:
			d.ver.inconclusive.Add(1)
			log.Debugw("verification inconclusive: three different outputs", "peer", r.last.Peer, "model", model)
			return inference.VerdictInconclusive
		}
	}
}

// settle records a verdict: VerificationFailed for ran[odd] (none when odd is -1),
// VerificationPassed for every other peer that ran the request.
func (d *Executor) settle(model string, ran []route.Target, odd int) {
	now := d.now()
	for i, t := range ran {
		e := reputation.VerificationPassed
		if i == odd {
			e = reputation.VerificationFailed
			log.Warnw("peer failed verification: its output differs from two other peers'", "peer", t.Peer, "model", model)
		}
		d.cfg.Rep.Observe(t.RepKey(), e, now)
	}
	if odd < 0 {
		d.ver.passed.Add(1)
	} else {
		d.ver.failed.Add(1)
	}
}

// voterPick is pickVerifier's answer: the voter and its host, or, when there is none,
// whether that is for want of vetting.
type voterPick struct {
	t    route.Target
	host netip.Prefix
	// unvetted is true when no voter was found although peers not in ran serve the model:
	// none of them is vetted, or none on a host of its own.
	unvetted bool
}

// pickVerifier picks a vetted voter not in ran and on none of hosts to run r's request
// again: route.Decide over the request's own snapshot, narrowed to those peers, mesh tier
// only, this model only. Vetting and scores are as of now, so a peer excluded since the
// request was decided is not picked.
func (d *Executor) pickVerifier(r *run, ran []route.Target, hosts []netip.Prefix) (voterPick, bool) {
	now := d.now()
	s := *r.snap
	s.Local, s.Cloud, s.Scratch = route.Local{}, route.Cloud{}, nil
	s.Peers = make([]route.Peer, 0, len(r.snap.Peers))
	var voterHosts []netip.Prefix // by index in s.Peers
	serving := false
	for _, p := range r.snap.Peers {
		if _, serves := modelIn(p.Entry.Vector, r.req.Model); !serves ||
			slices.ContainsFunc(ran, func(t route.Target) bool { return t.Peer == p.Entry.Peer }) {
			continue
		}
		serving = true
		key := p.Key
		if key == "" {
			key = p.Entry.Peer.String()
		}
		if host, ok := d.vet(p.Entry, key, now); ok && !slices.Contains(hosts, host) {
			s.Peers = append(s.Peers, p)
			voterHosts = append(voterHosts, host)
		}
	}
	if len(s.Peers) == 0 {
		return voterPick{unvetted: serving}, false
	}
	// The decision's own copy: the request sent to the peer stays exactly the client's.
	req := r.req
	req.Prefs.Privacy, req.Prefs.Route = inference.PrivacyMesh, inference.RouteExplicit
	dec := d.decide(&req, &s, now)
	for _, t := range dec.Attempts {
		if t.Tier != inference.TierMesh {
			continue
		}
		i := slices.IndexFunc(s.Peers, func(p route.Peer) bool { return p.Entry.Peer == t.Peer })
		return voterPick{t: t, host: voterHosts[i]}, true
	}
	return voterPick{}, false
}

// replay runs r's request on peer t as ordinary work and returns its output's digest. The
// outcome feeds the reputation store like any attempt's.
func (d *Executor) replay(t route.Target, r *run) (inference.Digest, error) {
	h := inference.NewDigester()
	m := d.measure()
	_, err := d.peerGenerate(d.bg, t.Peer, &r.req, func(tok inference.Token) error {
		m.token()
		h.Add(tok)
		return nil
	}, nil)
	d.observe(t, r.req.Model, false, err, false, m)
	return h.Sum(), err
}

// verificationStatus is the "routing.verification" object of /api/status. The outcomes are
// read before sampled, so sampled is never below their sum, and skipped_unvetted before
// skipped (counted after it), so it is never above it.
func (d *Executor) verificationStatus() console.Verification {
	v := &d.ver
	out := console.Verification{SkippedUnvetted: v.skippedUnvetted.Load()}
	out.Passed, out.Failed = v.passed.Load(), v.failed.Load()
	out.Inconclusive, out.Skipped = v.inconclusive.Load(), v.skipped.Load()
	out.Sampled = v.sampled.Load()
	return out
}
