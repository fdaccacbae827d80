package dispatch

import (
	"slices"
	"sync/atomic"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// Sampled verification of mesh results.
//
// When a request completes on a peer serving its model deterministically, and the client
// got the whole stream from that one peer (no resumption), the executor draws whether to
// verify it: with probability Config.VerifySample, or Config.VerifyProbationSample when
// that is higher and the peer scores below probationScore. A verification runs in the
// background, owned by the executor (bg and bgWG: Close cancels it and waits), at most
// maxVerifications at a time, and never delays the client's response:
//
//  1. a second peer serving the same model deterministically, picked by route.Decide over
//     the request's own snapshot without the first peer, runs the identical request: the
//     same inference.Request through the same peer client as ordinary work, so that a peer
//     cannot tell a verification from a task;
//  2. the digests of the two outputs (token ids and texts) are compared; equal, both peers
//     get reputation.VerificationPassed;
//  3. different, a third peer runs it and two out of three decide (inference.Judge): the
//     odd one out gets VerificationFailed, the two that agree VerificationPassed. No third
//     peer, or three different outputs, is inconclusive and penalizes nobody; so is an
//     execution that fails (timeout, peer lost...): a transport fault says nothing about
//     integrity.
//
// With the default reputation parameters one VerificationFailed (-70 points) takes any peer
// below the exclusion threshold (at most 100 - 70 = 30 < 40), so a liar leaves the candidate
// set after its first failed verification, and stays out for about a day (12 h half-life).

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

// verification is the executor's verification state.
type verification struct {
	sampled, passed, failed, inconclusive, skipped atomic.Uint64
	// running counts verifications in progress; it grows only under Executor.mu.
	running atomic.Int32
}

// maybeVerify draws whether to verify r's successful request and, if so, starts the
// verification in the background. Nothing may use r afterwards but the verification.
//
// ev is the request's meter event on a coordinator (nil elsewhere). When maybeVerify
// returns true, the verification owns ev and records it once it has a verdict (a task that
// failed verification is metered as zero); otherwise the caller records it.
func (d *Executor) maybeVerify(r *run, ev *gateway.MeterEvent) bool {
	t := r.last
	if t.Tier != inference.TierMesh || r.resumed || !r.deterministic(t) {
		return false
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
// the peer that served r, inconclusive, or skipped when no other peer could run it.
func (d *Executor) verify(r *run) inference.Verdict {
	model := r.req.Model
	ran := []route.Target{r.last}
	first := inference.DigestOf(r.sent)
	if r.output != nil {
		first = *r.output // a direct task: the tokens went to the client only
	}
	sums := []inference.Digest{first}
	for {
		t, ok := d.pickVerifier(r, ran)
		if !ok {
			if len(ran) == 1 {
				d.ver.skipped.Add(1)
				log.Debugw("verification skipped: no other peer serves the model deterministically", "peer", r.last.Peer, "model", model)
				return inference.VerdictSkipped
			}
			d.ver.inconclusive.Add(1)
			log.Debugw("verification inconclusive: outputs differ and no third peer can decide", "peer", r.last.Peer, "model", model)
			return inference.VerdictInconclusive
		}
		sum, err := d.replay(t, r)
		if err != nil {
			d.ver.inconclusive.Add(1)
			log.Debugw("verification inconclusive: an execution failed", "peer", t.Peer, "model", model, "err", err)
			return inference.VerdictInconclusive
		}
		ran, sums = append(ran, t), append(sums, sum)
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

// pickVerifier picks a peer not in ran to run r's request again: route.Decide over the
// request's own snapshot, narrowed to the other peers announcing the model as
// deterministic, mesh tier only, this model only. Scores are read as of now, so a peer
// excluded since the request was decided is not picked.
func (d *Executor) pickVerifier(r *run, ran []route.Target) (route.Target, bool) {
	s := *r.snap
	s.Local, s.Cloud, s.Scratch = route.Local{}, route.Cloud{}, nil
	s.Peers = make([]route.Peer, 0, len(r.snap.Peers))
	for _, p := range r.snap.Peers {
		if deterministicIn(p.Entry.Vector, r.req.Model) &&
			!slices.ContainsFunc(ran, func(t route.Target) bool { return t.Peer == p.Entry.Peer }) {
			s.Peers = append(s.Peers, p)
		}
	}
	if len(s.Peers) == 0 {
		return route.Target{}, false
	}
	// The decision's own copy: the request sent to the peer stays exactly the client's.
	req := r.req
	req.Prefs.Privacy, req.Prefs.Route = inference.PrivacyMesh, inference.RouteExplicit
	dec := d.decide(&req, &s, d.now())
	for _, t := range dec.Attempts {
		if t.Tier == inference.TierMesh {
			return t, true
		}
	}
	return route.Target{}, false
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
// read before sampled, so sampled is never below their sum.
func (d *Executor) verificationStatus() console.Verification {
	v := &d.ver
	out := console.Verification{
		Passed: v.passed.Load(), Failed: v.failed.Load(),
		Inconclusive: v.inconclusive.Load(), Skipped: v.skipped.Load(),
	}
	out.Sampled = v.sampled.Load()
	return out
}
