package dispatch

import (
	"context"
	"errors"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport/stage"
)

// Pipelines: a model no single peer holds runs on a chain of stages, each a peer holding a
// contiguous range of its layers (route.PlanStages picks them). This node is the head: it
// opens the chain (transport/stage), and its Head computes the embeddings and samples each
// token while the stages compute the layers. The client sees one stream like any other;
// where it was served reads "pipeline:<peer>[0-7],<peer>[8-15]".

// PipelineOpener opens a chain of stages for model, sized for maxPositions positions. The
// Layers it returns run every layer through the chain; close ends the stages' sessions
// and returns the stages' receipts that held, countersigned by this node (none when the
// chain broke or gives none). replace, when not nil, makes the chain movable: a stage that
// leaves with notice hands its layers over to the hops replace gives (stagemove.go).
type PipelineOpener interface {
	OpenPipeline(ctx context.Context, model string, stages []inference.StageHop, maxPositions int, replace ReplaceStage) (layers inference.Layers, close func() []inference.StageReceipt, err error)
}

// ReplaceStage gives the hops that take over layers [lo, hi) of a running pipeline from
// leaving, one of its stages, which is leaving: contiguous, covering [lo, hi), none of
// them a peer of chain (the stages now). An error keeps the chain as it is.
type ReplaceStage func(ctx context.Context, lo, hi int, leaving string, chain []inference.StageHop) ([]inference.StageHop, error)

// pipelineRun runs req on the pipeline t. A stage that fails is recorded against its peer
// in reputation (the pipeline itself has no reputation key), and the error, naming the
// stage, fails the attempt over like a peer's. A result comes with the stages' receipts
// that held, countersigned by this node: the chain is closed before it returns (one more
// pass along it, for the receipts to come back).
func (d *Executor) pipelineRun(ctx context.Context, t route.Target, req *inference.Request, emit func(inference.Token) error, replace ReplaceStage) (inference.Result, []inference.StageReceipt, error) {
	if d.cfg.Head == nil || d.cfg.Pipelines == nil {
		return inference.Result{}, nil, inference.Errorf(inference.CodeUnavailable, "this node cannot head a pipeline")
	}
	layers, closeChain, err := d.cfg.Pipelines.OpenPipeline(ctx, req.Model, t.Stages, pipelinePositions(req), replace)
	if err != nil {
		d.blameStage(req.Model, err)
		return inference.Result{}, nil, err
	}
	res, err := d.cfg.Head.GenerateWith(ctx, req, layers, emit)
	receipts := closeChain()
	if err != nil {
		d.blameStage(req.Model, err)
		return inference.Result{}, nil, err
	}
	for _, s := range t.Stages {
		d.cfg.Rep.Record(reputation.Target{Model: req.Model, Peer: s.Peer}, reputation.Success, d.now())
	}
	return res, receipts, nil
}

// pipelinePositions is what a pipeline's stages are sized for: req's prompt bound and its
// completion, as route.Decide plans them.
func pipelinePositions(req *inference.Request) int {
	return req.PromptTokensBound() + max(req.EffectiveMaxTokens(), 1)
}

// blameStage records a failed pipeline against the stage its error names, if any. Any
// retryable failure (gone, timed out, refusing, shutting down) counts as unavailable: the
// stage cools down for the model, so planning again leaves it out.
func (d *Executor) blameStage(model string, err error) {
	var fs *stage.FailedStage
	if !errors.As(err, &fs) || fs.Peer == "" || !inference.CodeOf(err).Retryable() {
		return
	}
	d.cfg.Rep.Record(reputation.Target{Model: model, Peer: fs.Peer.String()}, reputation.Unavailable, d.now())
}
