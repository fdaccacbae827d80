package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/infer"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// Direct tasks (transport/infer's DirectID): a coordinator's thin client gets its tokens
// over a WebRTC data channel straight from the serving peer. The executor (Relay) routes the
// request to a mesh peer, sends it the request and relays the client's WebRTC signaling to
// it and back, then reads the peer's result frame: the receipt, which it checks (signed by
// that peer, made out to this node, for the model and the usage) and meters with its
// countersignature. It never sees a token. A task that ends early is metered from the
// peer's failed result: the tokens the peer wrote to the client's channel and the prompt at
// its bound; when the client goes away first, the executor closes its side of the stream,
// which ends the task at the peer, and waits for that report (directResultWait). A sample
// is verified like any mesh task, against the receipt's digest of the output. The serving
// side is the node's (node/direct.go).
//
// Of the body's "meshinfer" preferences (openai.BodyPrefs), a direct task keeps two: a
// timeout ends it as a request's would (timeout, metered so), and privacy local-only, which
// keeps a request on this node, is refused, a direct task being a mesh peer's. The others
// are the direct path's own (mesh, explicit model, WebRTC); no header reaches it.

// StreamOpener opens a libp2p stream to a peer (the node's routed host).
type StreamOpener interface {
	NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error)
}

// Relay is the coordinator's gateway.DirectRelay: see above.
func (d *Executor) Relay(ctx context.Context, s gateway.Session, body json.RawMessage, sig *gateway.SignalPipe) (gateway.DirectResult, error) {
	if d.cfg.Dialer == nil {
		return gateway.DirectResult{}, inference.Errorf(inference.CodeUnavailable, "this node does not relay direct tasks")
	}
	start := d.now()
	var req inference.Request
	if err := json.Unmarshal(body, &req); err != nil {
		return gateway.DirectResult{}, inference.Errorf(inference.CodeInvalidRequest, "body is not a chat completion request: %v", err)
	}
	if err := req.Validate(inference.DefaultLimits()); err != nil {
		return gateway.DirectResult{}, err
	}
	timeout, err := directPrefs(body)
	if err != nil {
		return gateway.DirectResult{}, err
	}
	client := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	// ended is why the task ended early when ctx did: its time limit, else the client gone.
	ended := func() error {
		if client.Err() == nil {
			return inference.Errorf(inference.CodeTimeout, "the request's %v time limit passed", timeout)
		}
		return inference.Errorf(inference.CodePeerLost, "direct task: the client went away: %w", infer.ErrClientDisconnected)
	}
	req.Stream = true
	t, r, err := d.directTarget(ctx, &req)
	if err != nil {
		return gateway.DirectResult{}, err
	}
	frameBody, err := infer.EncodeRequest(&r.req, true)
	if err != nil {
		return gateway.DirectResult{}, err
	}
	st, err := d.cfg.Dialer.NewStream(ctx, t.Peer, infer.DirectID)
	if err != nil {
		return gateway.DirectResult{}, inference.Errorf(inference.CodeUnavailable, "open a direct task on %s: %v", t.Peer, err)
	}
	defer d.hold(t.Peer)() // the task counts against the peer's per-requester limit
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
	// When the client goes away (ctx ends: it cancelled, or its connection ended), the
	// coordinator closes its side of the stream: the peer ends the task (as if the client had
	// closed its channel) and reports what the client got, which is metered. The report is
	// waited for directResultWait at most.
	gone := make(chan struct{})
	stopGone := context.AfterFunc(ctx, func() {
		defer close(gone)
		relayWG.Wait() // the relay ends with ctx: no write races the close
		st.CloseWrite()
		st.SetReadDeadline(time.Now().Add(directResultWait))
	})
	defer func() {
		if !stopGone() {
			<-gone
		}
	}()
	// The peer's signaling to the client, then its result.
	rd := frame.NewReader(st, max(gateway.MaxSignalFrame, infer.MaxTerminalFrame))
	var res inference.Result
	for {
		msg, err := rd.Next()
		if err != nil {
			st.Reset()
			if ctx.Err() != nil {
				return gateway.DirectResult{}, ended()
			}
			return gateway.DirectResult{}, inference.Errorf(inference.CodePeerLost, "direct task on %s ended without a result: %v", t.Peer, err)
		}
		if infer.IsResultFrame(msg) {
			res, err = infer.DecodeResult(msg)
			if _, typed := errors.AsType[*inference.Error](err); err != nil && !typed {
				err = inference.Errorf(inference.CodePeerLost, "direct task on %s: %v", t.Peer, err) // a malformed result
			}
			st.Close()
			if err == nil {
				// The client got the tokens, not this node: the peer's counts are believed
				// only as far as the request makes them possible.
				res.Usage = r.req.BoundUsage(res.Usage)
				break
			}
			// Ended early: the tokens the peer says it wrote to the client's channel (bounded
			// by max_tokens), and the prompt at its bound, as an unfinished mesh request is
			// metered. A client that went away is client_disconnected, whatever the peer
			// made of it; a task past its time limit, timeout.
			res.Usage = r.req.UnfinishedUsage(res.Usage.CompletionTokens)
			if ctx.Err() != nil {
				err = ended()
			}
			d.meterDirect(s, r, res, err, d.now().Sub(start))
			return gateway.DirectResult{}, err
		}
		if ctx.Err() != nil {
			continue // the client is gone: the peer's late signaling has no one to go to
		}
		if err := sig.Send(msg); err != nil {
			st.Reset()
			return gateway.DirectResult{}, fmt.Errorf("direct task: %w", err)
		}
	}
	stopRelay()
	out := gateway.DirectResult{Peer: r.served().Route(), FinishReason: res.FinishReason, Usage: res.Usage}
	out.Receipt, out.Countersig = d.meterDirect(s, r, res, nil, d.now().Sub(start))
	return out, nil
}

// directResultWait bounds the wait for a direct task's result once the client went away:
// the peer ends the task when it reads the coordinator's end, at once.
const directResultWait = 5 * time.Second

// meterDirect checks a direct task's receipt, meters the task (after its verification's
// verdict when it is sampled) and returns the receipt with its countersignature, both "" when
// the receipt was refused or the task failed.
func (d *Executor) meterDirect(s gateway.Session, r *run, res inference.Result, err error, took time.Duration) (rcpt, countersig string) {
	d.stats.direct.Add(1)
	if d.cfg.Meter == nil {
		return "", ""
	}
	ev := gateway.MeterEvent{
		Time: d.now(), KeyID: s.KeyID, Device: s.DeviceID, Model: r.req.Model, Peer: r.served().Route(),
		TokensIn: res.Usage.PromptTokens, TokensOut: res.Usage.CompletionTokens,
		DurationMS: took.Milliseconds(), Outcome: gateway.OutcomeCompleted,
	}
	if err != nil {
		ev.Outcome = string(inference.CodeOf(err))
		if errors.Is(err, infer.ErrClientDisconnected) {
			ev.Outcome = infer.OutcomeClientDisconnected
		}
		d.cfg.Meter.Write(ev)
		return "", ""
	}
	out, ok := d.receiptFor(r, res, nil)
	if ok {
		if sig, coord, err := d.cfg.Meter.Countersign(res.Receipt); err == nil {
			ev.Receipt, ev.Countersig, ev.Coordinator = res.Receipt, sig, coord
			countersig = sig
		}
		r.output = &out
	}
	// The same event; verified like any mesh task when sampled.
	if !(ok && d.maybeVerify(r, &ev)) {
		d.cfg.Meter.Write(ev)
	}
	if countersig != "" {
		return res.Receipt, countersig
	}
	return "", ""
}

// directPrefs reads the preferences of a direct task's body that apply to it, checked as
// the API checks them (openai.BodyPrefs): its time limit (0: none), and privacy, where
// local-only is refused.
func directPrefs(body json.RawMessage) (time.Duration, error) {
	p, err := openai.BodyPrefs(body)
	if err != nil {
		return 0, err
	}
	if p.Privacy == inference.PrivacyLocalOnly {
		return 0, inference.Errorf(inference.CodeInvalidRequest,
			"privacy %q keeps a request on this node, and a direct task runs on a mesh peer: ask without direct, or with privacy %q",
			inference.PrivacyLocalOnly, inference.PrivacyMesh)
	}
	return p.Timeout, nil
}

// directTarget picks the mesh peer that serves a direct task, as route.Decide would for a
// mesh request of that model, and the run that verification and metering use.
func (d *Executor) directTarget(ctx context.Context, req *inference.Request) (route.Target, *run, error) {
	req.Prefs = inference.Prefs{Privacy: inference.PrivacyMesh, Priority: inference.PriorityLatency, Route: inference.RouteExplicit}
	now := d.now()
	snap, full := d.snapshot(ctx, now)
	// The client wants a peer's channel, not this node's answer. The local models stay, not
	// accepting: verification asks them whether the model is deterministic (verify.go).
	snap.Local.Accepting = false
	snap.Cloud = route.Cloud{}
	// Only peers that take direct tasks may serve one; the others stay in snap, where a
	// verification (over libp2p) may pick them.
	pick := snap
	if d.cfg.AcceptsDirect != nil {
		only := *snap
		only.Peers = slices.DeleteFunc(slices.Clone(snap.Peers), func(p route.Peer) bool { return !d.cfg.AcceptsDirect(p.Entry.Peer) })
		if len(only.Peers) == 0 && len(snap.Peers) > 0 {
			d.stats.none.Add(1)
			return route.Target{}, nil, inference.Errorf(inference.CodeUnavailable,
				"no peer of mesh %q takes direct tasks (serving nodes enable them with --webrtc-accept or --webrtc); ask without direct", d.cfg.Mesh)
		}
		pick = &only
	}
	dec := d.decide(req, pick, now)
	d.countPenalized(dec)
	for _, t := range dec.Attempts {
		if t.Tier == inference.TierMesh {
			r := &run{d: d, snap: snap, req: *req, last: t, attempts: 1, via: inference.TransportWebRTC}
			return t, r, nil
		}
	}
	d.stats.none.Add(1)
	return route.Target{}, nil, d.nothingServes(req, dec, full)
}
