package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/infer"
)

// Direct tasks (transport/infer's DirectID): a coordinator's thin client gets its tokens
// over a WebRTC data channel straight from the serving peer.
//
//   - The coordinator (relayDirect) routes the request to a mesh peer, sends it the request
//     and relays the client's WebRTC signaling to it and back, then reads the peer's result
//     frame: the receipt, which it checks (signed by that peer, made out to this node, for
//     the model and the usage) and meters with its countersignature. It never sees a token.
//     A sample is verified like any mesh task, against the receipt's digest of the output.
//   - The serving peer (serveDirect) answers the relayed offer on a one-shot PeerConnection,
//     serves the request on the client's data channel with its inference server (the same
//     limits, admission and receipt as a libp2p stream; the requester is the coordinator),
//     and writes the result frame back on the coordinator's stream.

// directSetupTimeout bounds a direct task at the serving peer until its channel is up: the
// request frame (infer.RequestTimeout, 10 s) and the WebRTC set-up (5 s by default); then
// the generation's own bounds apply.
const directSetupTimeout = 15 * time.Second

// directServer serves DirectID streams; Close waits for them.
type directServer struct {
	n  *Node
	wg sync.WaitGroup

	mu     sync.Mutex
	closed bool
}

func (ds *directServer) handle(st network.Stream) {
	ds.mu.Lock()
	if ds.closed {
		ds.mu.Unlock()
		st.Reset()
		return
	}
	ds.wg.Add(1)
	ds.mu.Unlock()
	defer ds.wg.Done()
	ds.n.serveDirect(st)
}

// stop stops serving new direct tasks. The node closes the inference server and the WebRTC
// transport next, which ends those running, then waits for them (wait).
func (ds *directServer) stop() error {
	ds.n.host.RemoveStreamHandler(infer.DirectID)
	ds.mu.Lock()
	ds.closed = true
	ds.mu.Unlock()
	return nil
}

// wait waits for the direct tasks still running.
func (ds *directServer) wait() error {
	ds.wg.Wait()
	return nil
}

// serveDirect serves one direct task for the coordinator at the other end of st.
func (n *Node) serveDirect(st network.Stream) {
	coord := st.Conn().RemotePeer()
	st.SetDeadline(time.Now().Add(directSetupTimeout))
	body, err := frame.ReadOne(st, infer.MaxRequestFrame)
	if err != nil {
		st.Reset()
		return
	}
	req, wantReceipt, err := infer.DecodeRequest(body)
	var ie *inference.Error
	switch {
	case err != nil && errors.As(err, &ie):
		n.directResult(st, inference.Result{}, err) // invalid_request
		return
	case err != nil:
		st.Reset() // not a request frame
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), directSetupTimeout)
	dc, release, err := n.rtc.AcceptRelayed(ctx, st)
	cancel()
	if err != nil {
		log.Debugw("direct task: no channel to the client", "coordinator", coord, "err", err)
		return // AcceptRelayed reset st
	}
	defer release()
	st.SetDeadline(time.Time{})
	task := n.infer.ServeRequest(coord, req, wantReceipt, dc)
	if task.Outcome != infer.OutcomeCompleted {
		n.directResult(st, inference.Result{}, inference.Errorf(outcomeCode(task.Outcome), "direct task ended: %s", task.Outcome))
		return
	}
	n.directResult(st, inference.Result{
		FinishReason: task.FinishReason, Receipt: task.Receipt,
		Usage: inference.Usage{PromptTokens: task.PromptTokens, CompletionTokens: task.CompletionTokens,
			TotalTokens: task.PromptTokens + task.CompletionTokens},
	}, nil)
}

// outcomeCode is the typed code of a served task's outcome.
func outcomeCode(outcome string) inference.Code {
	if c, ok := inference.ParseCode(outcome); ok {
		return c
	}
	return inference.CodePeerLost // client_disconnected: the client's channel went away
}

// directResult writes a direct task's result frame and closes st.
func (n *Node) directResult(st network.Stream, res inference.Result, err error) {
	st.SetWriteDeadline(time.Now().Add(infer.WriteTimeout))
	if werr := frame.Write(st, infer.EncodeResult(res, err)); werr != nil {
		st.Reset()
		return
	}
	st.Close()
}

// relayDirect is the coordinator's gateway.DirectRelay: see the top of this file.
func (n *Node) relayDirect(ctx context.Context, s gateway.Session, body json.RawMessage, sig *gateway.SignalPipe) (gateway.DirectResult, error) {
	start := time.Now()
	var req inference.Request
	if err := json.Unmarshal(body, &req); err != nil {
		return gateway.DirectResult{}, inference.Errorf(inference.CodeInvalidRequest, "body is not a chat completion request: %v", err)
	}
	if err := req.Validate(inference.DefaultLimits()); err != nil {
		return gateway.DirectResult{}, err
	}
	req.Stream = true
	t, r, err := n.router.directTarget(ctx, &req)
	if err != nil {
		return gateway.DirectResult{}, err
	}
	frameBody, err := infer.EncodeRequest(&r.req, true)
	if err != nil {
		return gateway.DirectResult{}, err
	}
	st, err := n.dialer.NewStream(ctx, t.Peer, infer.DirectID)
	if err != nil {
		return gateway.DirectResult{}, inference.Errorf(inference.CodeUnavailable, "open a direct task on %s: %v", t.Peer, err)
	}
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	defer n.router.hold(t.Peer)() // the task counts against the peer's per-requester limit
	if err := frame.Write(st, frameBody); err != nil {
		st.Reset()
		return gateway.DirectResult{}, inference.Errorf(inference.CodePeerLost, "send the task to %s: %v", t.Peer, err)
	}
	// The client's signaling to the peer, until the task ends (ctx or the peer's result).
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	var relayWG sync.WaitGroup
	defer relayWG.Wait()
	relayWG.Go(func() {
		for {
			msg, err := sig.Recv(relayCtx)
			if err != nil {
				return
			}
			if frame.Write(st, msg) != nil {
				return
			}
		}
	})
	// The peer's signaling to the client, then its result.
	rd := frame.NewReader(st, max(gateway.MaxSignalFrame, infer.MaxTerminalFrame))
	var res inference.Result
	for {
		msg, err := rd.Next()
		if err != nil {
			st.Reset()
			if ctx.Err() != nil {
				return gateway.DirectResult{}, fmt.Errorf("direct task: %w", ctx.Err())
			}
			return gateway.DirectResult{}, inference.Errorf(inference.CodePeerLost, "direct task on %s ended without a result: %v", t.Peer, err)
		}
		if infer.IsResultFrame(msg) {
			res, err = infer.DecodeResult(msg)
			if _, typed := errors.AsType[*inference.Error](err); err != nil && !typed {
				err = inference.Errorf(inference.CodePeerLost, "direct task on %s: %v", t.Peer, err) // a malformed result
			}
			st.Close()
			if err != nil {
				n.meterDirect(s, r, res, err, time.Since(start))
				return gateway.DirectResult{}, err
			}
			break
		}
		if err := sig.Send(msg); err != nil {
			st.Reset()
			return gateway.DirectResult{}, fmt.Errorf("direct task: %w", err)
		}
	}
	stopRelay()
	out := gateway.DirectResult{Peer: t.String(), FinishReason: res.FinishReason, Usage: res.Usage}
	out.Receipt, out.Countersig = n.meterDirect(s, r, res, nil, time.Since(start))
	return out, nil
}

// meterDirect checks a direct task's receipt, meters the task (after its verification's
// verdict when it is sampled) and returns the receipt with its countersignature, both "" when
// the receipt was refused or the task failed.
func (n *Node) meterDirect(s gateway.Session, r *run, res inference.Result, err error, took time.Duration) (rcpt, countersig string) {
	d := n.router
	d.stats.direct.Add(1)
	ev := gateway.MeterEvent{
		Time: n.cfg.Now(), KeyID: s.KeyID, Model: r.req.Model, Peer: r.last.String(),
		TokensIn: res.Usage.PromptTokens, TokensOut: res.Usage.CompletionTokens,
		DurationMS: took.Milliseconds(), Outcome: gateway.OutcomeCompleted,
	}
	if err != nil {
		ev.Outcome = string(inference.CodeOf(err))
		n.tasks.write(ev)
		return "", ""
	}
	out, ok := d.receiptFor(r, res, nil)
	if ok {
		if sig, err := receipts.Countersign(n.key, res.Receipt); err == nil {
			ev.Receipt, ev.Countersig, ev.Coordinator = res.Receipt, sig, n.tasks.self
			countersig = sig
		}
		r.output = &out
	}
	// The same event, countersigned by write; verified like any mesh task when sampled.
	if !(ok && d.maybeVerify(r, &ev)) {
		n.tasks.write(ev)
	}
	if countersig != "" {
		return res.Receipt, countersig
	}
	return "", ""
}

// directTarget picks the mesh peer that serves a direct task, as route.Decide would for a
// mesh request of that model, and the run that verification and metering use.
func (d *dispatcher) directTarget(ctx context.Context, req *inference.Request) (route.Target, *run, error) {
	req.Prefs = inference.Prefs{Privacy: inference.PrivacyMesh, Priority: inference.PriorityLatency, Route: inference.RouteExplicit}
	now := d.n.cfg.Now()
	snap, full := d.snapshot(ctx, now)
	snap.Local = route.Local{} // the client wants a peer's channel, not this node's answer
	snap.Cloud = route.Cloud{}
	dec := d.decide(req, snap, now)
	for _, t := range dec.Attempts {
		if t.Tier == route.TierMesh {
			r := &run{d: d, snap: snap, req: *req, last: t, attempts: 1}
			return t, r, nil
		}
	}
	d.stats.none.Add(1)
	return route.Target{}, nil, d.nothingServes(req, dec, full)
}
