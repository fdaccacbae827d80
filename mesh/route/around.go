package route

import (
	"fmt"
	"slices"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// PlanAround plans a pipeline of model in which the stage pin keeps its peer and its layers
// [pin.Lo, pin.Hi), and the other peers of s hold the rest: the layers before it, [0, Lo),
// and after it, [Hi, Layers), each placed by PlanRange over the candidates Decide would
// plan a pipeline on (not stale, spare capacity, the model's shape announced with a budget;
// excluded, paused and cooling peers left out), pin's peer never among them. A peer holds
// one part at most: the first part planned takes its peers out of the second's candidates.
// Planning the part before first fails when the part after needed one of its peers while
// another order fits (a large peer taken by a small part), so the other order is tried
// then. The head is the caller, as for any pipeline; positions is what the stages are
// sized for, as Decide sizes them (the request's prompt bound and its completion).
//
// Like Decide it reads s, s.Rep for scores and cooling, and nothing else. The error says
// why no such pipeline exists: no candidate announces the model, pin's range is not within
// its layers, or the candidates cannot hold a part (a *ShortfallError).
//
// It is what isolating one stage of a pipeline takes (node/dispatch, verify.go: "Who is
// penalized"): the stage run with every other layer on other peers.
func PlanAround(s *Snapshot, model string, pin inference.StageHop, positions int, now time.Time) (Target, error) {
	// pin's peer is left out before the shape is read: what it announces counts for nothing.
	others := *s
	others.Peers = slices.DeleteFunc(slices.Clone(s.Peers), func(p Peer) bool { return p.Entry.Peer.String() == pin.Peer })
	shape, cands := stageCandidates(&others, model, now)
	if len(cands) == 0 {
		return Target{}, fmt.Errorf("route: no peer but %s can hold a stage of %s", pin.Peer, model)
	}
	if pin.Lo < 0 || pin.Lo >= pin.Hi || pin.Hi > shape.Layers {
		return Target{}, fmt.Errorf("route: stage [%d, %d) is not within the %d layers of %s", pin.Lo, pin.Hi, shape.Layers, model)
	}
	before, after := [2]int{0, pin.Lo}, [2]int{pin.Hi, shape.Layers}
	var first error
	for _, parts := range [][2][2]int{{before, after}, {after, before}} {
		plans, err := planParts(shape, positions, cands, parts)
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		// plans are in the order planned: put the part before first.
		if parts[0] != before {
			plans[0], plans[1] = plans[1], plans[0]
		}
		t := Target{Tier: TierMesh, Model: model}
		t.Stages = appendHops(t.Stages, plans[0])
		t.Stages = append(t.Stages, pin)
		t.Stages = appendHops(t.Stages, plans[1])
		return t, nil
	}
	return Target{}, first
}

// planParts plans the layer ranges parts in turn over cands, each on candidates the ones
// before did not take; an empty range has no stages.
func planParts(shape inference.ModelShape, positions int, cands []StageCandidate, parts [2][2]int) ([2]StagePlan, error) {
	var plans [2]StagePlan
	left := cands
	for i, r := range parts {
		if r[0] == r[1] {
			continue
		}
		sp, err := PlanRange(shape, positions, r[0], r[1], left, nil)
		if err != nil {
			return plans, err
		}
		plans[i] = sp
		left = slices.DeleteFunc(slices.Clone(left), func(c StageCandidate) bool {
			return slices.ContainsFunc(sp.Stages, func(st PlannedStage) bool { return st.Peer == c.Peer })
		})
	}
	return plans, nil
}

// appendHops appends the stages of sp to hops.
func appendHops(hops []inference.StageHop, sp StagePlan) []inference.StageHop {
	for _, st := range sp.Stages {
		hops = append(hops, inference.StageHop{Peer: st.Peer.String(), Lo: st.Lo, Hi: st.Hi})
	}
	return hops
}

// PlanReplacement plans the layers [lo, hi) of model that a leaving stage of a running
// pipeline holds, over the candidates Decide would plan a pipeline on (as PlanAround),
// leaving out the peers of exclude: the leaving stage's and the chain's other stages'
// (a peer holds one stage of a chain). It returns the hops in order, and the model's
// shape as the candidates announce it (the gate's KV bytes come from it). It reads s, s.Rep
// for scores and cooling, and nothing else; the error says why no replacement exists.
func PlanReplacement(s *Snapshot, model string, lo, hi int, exclude []string, positions int, now time.Time) ([]inference.StageHop, inference.ModelShape, error) {
	others := *s
	others.Peers = slices.DeleteFunc(slices.Clone(s.Peers), func(p Peer) bool { return slices.Contains(exclude, p.Entry.Peer.String()) })
	shape, cands := stageCandidates(&others, model, now)
	if len(cands) == 0 {
		return nil, shape, fmt.Errorf("route: no peer outside the chain can hold a stage of %s", model)
	}
	if lo < 0 || lo >= hi || hi > shape.Layers {
		return nil, shape, fmt.Errorf("route: layers [%d, %d) are not within the %d layers of %s", lo, hi, shape.Layers, model)
	}
	sp, err := PlanRange(shape, positions, lo, hi, cands, nil)
	if err != nil {
		return nil, shape, err
	}
	return appendHops(nil, sp), shape, nil
}
