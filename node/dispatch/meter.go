package dispatch

import (
	"context"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// Meter meters the finished requests of a coordinator's clients (the node's task meter
// over transport/gateway's Meter).
type Meter interface {
	// Event returns the meter event of one finished request: its client's key (from the
	// session in ctx), model, where it was served, tokens and time. ok is false when the
	// request is not metered (no client session in ctx).
	Event(ctx context.Context, model string, at inference.Served, res inference.Result, err error, took time.Duration) (ev gateway.MeterEvent, ok bool)
	// Write records ev, countersigning its receipt first when it has one.
	Write(ev gateway.MeterEvent)
	// Countersign countersigns a serving peer's task receipt as this coordinator.
	Countersign(receipt string) (sig, coordinator string, err error)
}

// meter records the meter event of r's request (result res, error err): with the serving
// peer's receipt when it holds, after the verification's verdict when it is verified. A
// pipeline's request is metered here, at its head, like any other: its event's peer is the
// route ("pipeline:<peer>[0-7],…"), and it has no task receipt but its stages' receipts,
// each checked and countersigned by this node as the pipeline closed (r.stageReceipts).
func (d *Executor) meter(r *run, res inference.Result, err error, ev gateway.MeterEvent) {
	switch {
	case err != nil || r.last.Tier != inference.TierMesh:
	case len(r.last.Stages) == 0:
		sent := inference.DigestOf(r.sent)
		if _, ok := d.receiptFor(r, res, &sent); ok {
			ev.Receipt = res.Receipt
		}
	case len(r.stageReceipts) > 0:
		ev.StageReceipts, ev.Coordinator = r.stageReceipts, d.cfg.Self.String()
	}
	if !(err == nil && d.maybeVerify(r, &ev)) {
		d.cfg.Meter.Write(ev)
	}
}

// receiptFor checks the task receipt the serving peer sent with res: signed by the peer of
// r's last attempt, made out to this node, for r's model, completed, with the usage's token
// counts. sent, when non-nil, is the digest of the tokens the client received through this
// node, which the receipt must name; a direct task's client got them without this node, and
// the digest the receipt names is the peer's word, which verification checks. It returns
// that digest. A receipt that does not hold is counted as refused and ok is false: a missing
// or forged receipt changes nothing else (the client has its tokens; verification judges the
// output).
func (d *Executor) receiptFor(r *run, res inference.Result, sent *inference.Digest) (out inference.Digest, ok bool) {
	why := ""
	rc, err := receipts.ParseTask(res.Receipt)
	if err == nil {
		out, err = inference.ParseDigest(rc.Result)
	}
	switch {
	case res.Receipt == "":
		why = "no receipt"
	case err != nil:
		why = err.Error()
	case rc.Server != r.last.Peer.String():
		why = "signed by " + rc.Server + ", not the serving peer"
	case rc.Requester != d.cfg.Self.String():
		why = "made out to " + rc.Requester
	case rc.Model != r.req.Model || rc.Outcome != receipts.Completed:
		why = "wrong model or outcome"
	case rc.TokensIn != res.Usage.PromptTokens || rc.TokensOut != res.Usage.CompletionTokens:
		why = "token counts differ from the usage"
	case sent != nil && out != *sent:
		why = "result differs from the tokens received"
	}
	if why != "" {
		d.stats.receiptsRefused.Add(1)
		log.Warnw("serving peer's receipt refused; the task is metered without one", "peer", r.last.Peer, "model", r.req.Model, "why", why)
		return out, false
	}
	return out, true
}
