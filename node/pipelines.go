package node

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/transport/stage"
)

// What /api/status lists of the pipelines this node heads and the stage sessions it runs.
const (
	keptEnded  = 8  // the last pipelines headed that ended
	listedOpen = 32 // the pipelines headed now, newest first
)

// headedLog keeps the pipelines this node heads now and the last keptEnded it headed.
type headedLog struct {
	mu    sync.Mutex
	next  uint64
	open  map[uint64]*headedRun
	ended []*headedRun // oldest first
}

// headedRun is one pipeline this node headed: its chain, and its pipeline while open or
// what its steps took and its stages' receipts once it ended.
type headedRun struct {
	seq      uint64
	model    string
	stages   []inference.StageHop
	started  time.Time
	p        *stage.Pipeline // nil once ended
	final    stage.Stats
	receipts []inference.StageReceipt // per stage, in chain order, once ended; zero where none held
	moves    []stage.Move             // the stages moved live, once ended
	relinked []stage.Hop              // the chain after the moves, once ended
}

// add records p, a pipeline of model over stages opened at now, and returns its close: it
// closes p, keeps what its steps took, countersigns the stages' receipts that held with
// countersign and keeps them too, and returns them (only those). Idempotent: a second call
// returns nil.
func (l *headedLog) add(model string, stages []inference.StageHop, now time.Time, p *stage.Pipeline,
	countersign func(receipt string) (string, error)) func() []inference.StageReceipt {
	r := &headedRun{model: model, stages: slices.Clone(stages), started: now, p: p}
	l.mu.Lock()
	if l.open == nil {
		l.open = make(map[uint64]*headedRun)
	}
	l.next++
	r.seq = l.next
	l.open[r.seq] = r
	l.mu.Unlock()
	var once sync.Once
	return func() []inference.StageReceipt {
		var kept []inference.StageReceipt
		once.Do(func() {
			p.Close()
			st := p.Stats()
			all, held := countersigned(p.Receipts(), countersign)
			kept = held
			l.mu.Lock()
			defer l.mu.Unlock()
			delete(l.open, r.seq)
			r.p, r.final, r.receipts, r.moves, r.relinked = nil, st, all, p.Moves(), p.Stages()
			if l.ended = append(l.ended, r); len(l.ended) > keptEnded {
				l.ended = slices.Delete(l.ended, 0, len(l.ended)-keptEnded)
			}
		})
		return kept
	}
}

// countersigned countersigns each receipt of rs (a pipeline's, per stage, "" where none
// held) with countersign. It returns them per stage (zero where none) and the held ones
// alone. A receipt this node cannot countersign is left out, and logged.
func countersigned(rs []string, countersign func(string) (string, error)) (all, held []inference.StageReceipt) {
	if rs == nil {
		return nil, nil
	}
	all = make([]inference.StageReceipt, len(rs))
	for i, r := range rs {
		if r == "" {
			continue
		}
		sig, err := countersign(r)
		if err != nil {
			log.Errorw("stage receipt not countersigned", "err", err)
			continue
		}
		all[i] = inference.StageReceipt{Receipt: r, Countersig: sig}
		held = append(held, all[i])
	}
	return all, held
}

// status lists the pipelines open now (at most listedOpen) and the last that ended, newest
// first.
func (l *headedLog) status() []console.HeadedPipeline {
	l.mu.Lock()
	runs := make([]*headedRun, 0, len(l.open)+len(l.ended))
	for _, r := range l.open {
		runs = append(runs, r)
	}
	slices.SortFunc(runs, func(a, b *headedRun) int { return cmp.Compare(b.seq, a.seq) })
	runs = runs[:min(len(runs), listedOpen)]
	for i := len(l.ended) - 1; i >= 0; i-- {
		runs = append(runs, l.ended[i])
	}
	type snap struct {
		r    headedRun
		open bool
	}
	snaps := make([]snap, len(runs))
	for i, r := range runs {
		snaps[i] = snap{*r, r.p != nil}
	}
	l.mu.Unlock()

	out := make([]console.HeadedPipeline, 0, len(snaps))
	for _, s := range snaps {
		st, moves, chain := s.r.final, s.r.moves, s.r.relinked
		if s.open { // outside the log's lock: these wait for no step
			st, moves, chain = s.r.p.Stats(), s.r.p.Moves(), s.r.p.Stages()
		}
		hp := headedStatus(s.r, s.open, st)
		if len(moves) > 0 {
			relinked(&hp, moves, chain)
		}
		out = append(out, hp)
	}
	return out
}

// stageSessions lists the stage sessions this node runs for heads now.
func (n *Node) stageSessions() []console.StageSession {
	out := []console.StageSession{}
	if n.stageSrv == nil {
		return out
	}
	for _, s := range n.stageSrv.Running() {
		ss := console.StageSession{Model: s.Model, Lo: s.Lo, Hi: s.Hi, Head: s.Head.String(), Index: s.Index,
			Stages: s.Stages, Steps: s.Steps}
		if s.Steps > 0 {
			ss.ForwardMS = float64(s.Forward) / float64(s.Steps) / float64(time.Millisecond)
		}
		out = append(out, ss)
	}
	return out
}

// headedStatus is r as /api/status shows it, given what its steps took.
func headedStatus(r headedRun, open bool, st stage.Stats) console.HeadedPipeline {
	hp := console.HeadedPipeline{
		Model: r.model, Route: inference.Served{Tier: inference.TierMesh, Stages: r.stages}.Route(),
		Open: open, StartedAt: rfc3339(r.started), Steps: st.Steps,
		Stages: make([]console.PipelineStage, len(r.stages)),
	}
	perStep := func(d time.Duration) float64 {
		if st.Steps == 0 {
			return 0
		}
		return float64(d) / float64(st.Steps) / float64(time.Millisecond)
	}
	hp.StepMS = perStep(st.RoundTrip)
	for i, s := range r.stages {
		hp.Stages[i] = console.PipelineStage{Peer: s.Peer, Lo: s.Lo, Hi: s.Hi}
		if i < len(r.receipts) {
			hp.Stages[i].Receipt, hp.Stages[i].Countersig = r.receipts[i].Receipt, r.receipts[i].Countersig
		}
	}
	if len(st.Forward) == len(r.stages) {
		hops := st.RoundTrip
		for i, d := range st.Forward {
			ms := perStep(d)
			hp.Stages[i].ForwardMS = &ms
			hops -= d
		}
		ms := perStep(max(hops, 0)) // a stage may overstate its time
		hp.HopsMS = &ms
	}
	if st.Err != nil {
		hp.Failure = string(inference.CodeOf(st.Err))
	}
	return hp
}

// relinked shows in hp the stages moved live and the chain as re-linked: its stages (no
// receipts: a re-linked chain gives none) and route.
func relinked(hp *console.HeadedPipeline, moves []stage.Move, chain []stage.Hop) {
	for _, m := range moves {
		to := inference.Served{Tier: inference.TierMesh, Stages: inferenceHops(m.To)}.Route()
		hp.Moved = append(hp.Moved, console.PipelineMove{Index: m.Index, From: m.From.String(),
			To: strings.TrimPrefix(to, "pipeline:"), Positions: m.Positions, Bytes: m.Bytes,
			TookMS: float64(m.Took) / float64(time.Millisecond)})
	}
	hops := inferenceHops(chain)
	hp.Stages = make([]console.PipelineStage, len(hops))
	for i, h := range hops {
		hp.Stages[i] = console.PipelineStage{Peer: h.Peer, Lo: h.Lo, Hi: h.Hi}
	}
	hp.Route = inference.Served{Tier: inference.TierMesh, Stages: hops}.Route()
	hp.HopsMS = nil // the step times span both chains
}

// inferenceHops is hops as inference names them (stageHops's inverse).
func inferenceHops(hops []stage.Hop) []inference.StageHop {
	out := make([]inference.StageHop, len(hops))
	for i, h := range hops {
		out[i] = inference.StageHop{Peer: h.Peer.String(), Lo: h.Lo, Hi: h.Hi}
	}
	return out
}
