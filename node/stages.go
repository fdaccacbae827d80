package node

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/node/dispatch"
	"github.com/meshinfer/meshinfer/transport/stage"
)

// Sharded inference on this node, both sides of it:
//   - as a stage, it runs layer ranges of the synthetic models it serves for the heads of
//     pipelines (transport/stage), within its participation policy and memory budget;
//   - as a head, it routes requests for models no single peer holds to a pipeline
//     (route.PlanStages picks it) and computes the embeddings and sampling itself, with a
//     synthetic backend that knows every preset and loads only their heads.

// startStages starts the stage server (when this node serves synthetic models) and the
// head. Both are closed with the node.
func (n *Node) startStages() error {
	names := make([]string, 0, len(synth.Presets()))
	for _, p := range synth.Presets() {
		names = append(names, p.Name)
	}
	head, err := synth.New(names...)
	if err != nil {
		return fmt.Errorf("pipeline head: %w", err)
	}
	n.head = head
	if n.stages == nil {
		return nil
	}
	// No KV budget of the server's own: the backend counts the sessions' caches with the
	// ranges against the one memory budget (synth: Stage memory), which the policy may
	// change while the server runs. A head that asks gets this node's signed receipt of
	// each session it closes in order, the same record as the session's line in the
	// receipts log.
	opts := []stage.ServerOption{stage.WithServerObserver(n.rep), stage.WithClock(n.cfg.Now),
		stage.WithServerTransfers(n.noteTransfer),
		stage.WithReceiptSigner(func(e stage.SessionEnd) (string, error) { return receipts.SignStage(n.key, n.stageReceipt(e)) })}
	if q := n.receiptQ; q != nil {
		// Each stage session is receipted like a served task, once it has ended (its
		// handler goroutine; the server's Close waits for it, before the queue stops).
		opts = append(opts, stage.WithOnSessionEnd(func(e stage.SessionEnd) { q.add(n.stageReceipt(e)) }))
	}
	n.stageSrv = stage.NewServer(n.host, admittedStages{n}, opts...)
	n.closers = append(n.closers, func() error { n.stageSrv.Close(); return nil })
	return nil
}

// stageReceipt is the receipt of one stage session: a pipeline stage's part of a task,
// made out to the pipeline's head (mesh/receipts: Receipt.Stage). The one a head gets and
// the log's line are made from the same SessionEnd: the same time and counts.
func (n *Node) stageReceipt(e stage.SessionEnd) receipts.Receipt {
	outcome := receipts.Completed // the chain closed in order
	if e.Outcome != stage.OutcomeClosed {
		outcome = e.Outcome
	}
	return receipts.Receipt{
		Time: e.Time.UTC(), Requester: e.Head.String(), Model: e.Model,
		Stage:      &receipts.Stage{Lo: e.Lo, Hi: e.Hi, Steps: e.Steps, Positions: e.Positions, Session: e.Session},
		DurationMS: e.Duration.Milliseconds(), Outcome: outcome,
	}
}

// checkStageReceipt checks a stage's receipt at the head: signed by the stage's peer, made
// out to this node, completed, for exactly the part the head ran (stage.WithReceipts).
func checkStageReceipt(part stage.Part, line string) error {
	_, err := receipts.CheckStage(line, receipts.Receipt{
		Server: part.Stage.Peer.String(), Requester: part.Head.String(), Model: part.Model, Outcome: receipts.Completed,
		Stage: &receipts.Stage{Lo: part.Stage.Lo, Hi: part.Stage.Hi, Steps: part.Steps, Positions: part.Positions, Session: part.Session},
	})
	return err
}

// admittedStages is the node's stage backend behind its participation policy: a paused node
// takes no stage. The memory budget is the backend's to keep (synth.WithStageBudget): it
// unloads ranges no session uses to make room, and refuses with overloaded when the ranges
// of open sessions leave none.
type admittedStages struct{ n *Node }

func (a admittedStages) Shape(model string) (inference.ModelShape, error) {
	return a.n.stages.Shape(model)
}

func (a admittedStages) OpenStage(ctx context.Context, model string, lo, hi, maxPositions int) (inference.StageSession, error) {
	if err := a.n.part.available(); err != nil {
		return nil, err
	}
	return a.n.stages.OpenStage(ctx, model, lo, hi, maxPositions)
}

// OpenPipeline opens the chain of stages of a pipeline this node heads (dispatch's
// PipelineOpener). It asks the stages for their receipts; its close returns those that
// held, countersigned by this node, and the pipeline's entry in /api/status lists them.
// A stage that sends a bad frame or a receipt that does not hold is recorded in
// reputation.
//
// With replace, the chain is movable: a stage that leaves with notice hands its layers and
// their KV cache over to the hops replace gives, and the generation goes on (the
// pipeline's entry lists the moves).
func (n *Node) OpenPipeline(ctx context.Context, model string, stages []inference.StageHop, maxPositions int, replace dispatch.ReplaceStage) (inference.Layers, func() []inference.StageReceipt, error) {
	hops, err := stageHops(stages)
	if err != nil {
		return nil, nil, err
	}
	opts := []stage.PipelineOption{stage.WithPipelineTransfers(n.noteTransfer),
		stage.WithReceipts(checkStageReceipt), stage.WithPipelineObserver(n.rep),
		stage.WithStepTimeouts(0, n.cfg.PeerInterTokenTimeout)}
	if replace != nil {
		opts = append(opts, stage.WithMoves(func(ctx context.Context, lo, hi int, leaving peer.ID, chain []stage.Hop) ([]stage.Hop, error) {
			repl, err := replace(ctx, lo, hi, leaving.String(), inferenceHops(chain))
			if err != nil {
				return nil, err
			}
			return stageHops(repl)
		}))
	}
	p, err := stage.Open(ctx, n.dialer, model, hops, maxPositions, opts...)
	if err != nil {
		n.pipelines.failed.Add(1)
		return nil, nil, err
	}
	n.pipelines.headed.Add(1)
	countersign := func(r string) (string, error) { return receipts.Countersign(n.key, r) }
	return p.Forward, n.pipelines.log.add(model, stages, n.cfg.Now(), p, countersign), nil
}

// stageHops is stages as transport/stage's hops.
func stageHops(stages []inference.StageHop) ([]stage.Hop, error) {
	hops := make([]stage.Hop, len(stages))
	for i, s := range stages {
		id, err := peer.Decode(s.Peer)
		if err != nil {
			return nil, inference.Errorf(inference.CodeInvalidRequest, "stage %d: %v", i, err)
		}
		hops[i] = stage.Hop{Peer: id, Lo: s.Lo, Hi: s.Hi}
	}
	return hops, nil
}

// pipelineStats counts the pipelines this node headed, and keeps the last ones (pipelines.go).
type pipelineStats struct {
	headed, failed atomic.Uint64
	log            headedLog
}

// pipelinesStatus is /api/status "pipelines".
func (n *Node) pipelinesStatus() console.Pipelines {
	out := console.Pipelines{Headed: n.pipelines.headed.Load(), OpenFailed: n.pipelines.failed.Load(),
		Recent: n.pipelines.log.status(), Sessions: n.stageSessions()}
	if n.stageSrv != nil {
		st := n.stageSrv.Stats()
		out.StageSessions, out.StageRefused, out.StageProtocolErrors = st.Sessions, st.Refused, st.ProtocolErrors
	}
	return out
}
