package dispatch

import (
	"slices"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/reputation"
)

// Isolation runs: which stage of an outvoted pipeline lied (verify.go, "Who is penalized").

// maxIsolations bounds the stages of one odd pipeline that are isolated (8). A pipeline
// has the fewest stages that hold the model (route.PlanStages), a handful on any mesh worth
// planning, so every stage is isolated in practice; past eight, eight stages drawn at
// random are, so that no place in a long pipeline is safe while a verification stays
// bounded: two plans, then one run per stage isolated and one more per stage convicted.
const maxIsolations = 8

// stageVerdict is what isolating one stage found.
type stageVerdict int

const (
	stageInconclusive stageVerdict = iota // no run, a failed run, or two runs disagreeing
	stageCleared                          // its isolated output is the majority's
	stageConvicted                        // it differs, with two sets of helpers apart
)

// isolate tells which stages of the pipeline p, outvoted two to one on r's request, lied:
// each of the stages isolationHops picks in turn (isolateStage). A convicted stage's peer
// takes reputation.VerificationFailed, once however many stages of p it holds; a cleared
// or inconclusive one gets no event. See "Who is penalized".
func (d *Executor) isolate(r *run, p route.Target, majority inference.Digest) {
	hops := d.isolationHops(p.Stages)
	d.ver.stagesInconclusive.Add(uint64(len(p.Stages) - len(hops)))
	var convicted []string
	for _, h := range hops {
		switch d.isolateStage(r, p, h, majority) {
		case stageInconclusive:
			d.ver.stagesInconclusive.Add(1)
		case stageCleared:
			d.ver.stagesIsolated.Add(1)
		case stageConvicted:
			d.ver.stagesIsolated.Add(1)
			d.ver.stagesConvicted.Add(1)
			if slices.Contains(convicted, h.Peer) {
				continue // a peer holding two stages of p: one penalty
			}
			convicted = append(convicted, h.Peer)
			log.Warnw("pipeline stage failed verification: run alone among vetted voters, twice, its output still differs from two other plans'",
				"peer", h.Peer, "route", p, "model", r.req.Model)
			d.cfg.Rep.Observe(h.Peer, reputation.VerificationFailed, d.now())
		}
	}
}

// isolateStage runs r's request again on a pipeline in which the stage h of p keeps its
// layers and vetted voters hold every other (route.PlanAround over voters): none a peer of
// p nor on one of p's hosts, this node heading. An output equal to majority, the digest the
// two other plans agreed on, clears h. One that differs is run once more with helpers
// apart from the first run's (neither the same peers nor on their hosts), and convicts h
// only if it differs again: a single vetted helper altering what it computes cannot frame
// an honest stage. The runs disagreeing, no pipeline to plan, or a run failing is
// inconclusive.
func (d *Executor) isolateStage(r *run, p route.Target, h inference.StageHop, majority inference.Digest) stageVerdict {
	model := r.req.Model
	used, hosts := planKeys(p), d.planHosts(r.snap, p)
	for i := range 2 {
		// Vetted as of each run: a verification of a long pipeline takes a while.
		vs := d.voters(r, used, hosts, d.now())
		t, err := route.PlanAround(&vs.snap, model, h, pipelinePositions(&r.req), d.now())
		if err != nil {
			log.Debugw("stage not isolated: no pipeline of vetted voters around it", "peer", h.Peer, "route", p, "model", model, "err", err)
			return stageInconclusive
		}
		sum, err := d.replay(t, r)
		switch {
		case err != nil:
			log.Debugw("stage not isolated: an isolation run failed", "peer", h.Peer, "route", t, "model", model, "err", err)
			return stageInconclusive
		case sum == majority && i == 0:
			log.Debugw("stage cleared: run alone among vetted voters, its output is the majority's", "peer", h.Peer, "route", t, "model", model)
			return stageCleared
		case sum == majority:
			log.Debugw("stage not isolated: its two isolation runs disagree", "peer", h.Peer, "route", t, "model", model)
			return stageInconclusive
		}
		for _, k := range planKeys(t) {
			if k != h.Peer {
				used, hosts = append(used, k), append(hosts, vs.hosts[k])
			}
		}
	}
	return stageConvicted
}

// isolationHops are the stages of stages to isolate, in pipeline order: all of them up to
// maxIsolations, else maxIsolations drawn at random (the executor's source, under mu).
func (d *Executor) isolationHops(stages []inference.StageHop) []inference.StageHop {
	if len(stages) <= maxIsolations {
		return stages
	}
	d.mu.Lock()
	pick := d.rng.Perm(len(stages))[:maxIsolations]
	d.mu.Unlock()
	slices.Sort(pick)
	out := make([]inference.StageHop, len(pick))
	for i, j := range pick {
		out[i] = stages[j]
	}
	return out
}
