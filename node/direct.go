package node

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/transport/infer"
)

// Direct tasks (transport/infer's DirectID), the serving side: a coordinator's thin client
// gets its tokens over a WebRTC data channel straight from this node, if it accepts WebRTC
// set-ups (Config.WebRTCAccept; without it DirectID is not registered). The coordinator's side
// (routing, relaying the set-up, checking and metering the receipt) is the executor's
// (node/dispatch, Relay). The serving peer (serveDirect) answers the relayed offer on a
// one-shot PeerConnection, serves the request on the client's data channel with its
// inference server (the same limits, admission and receipt as a libp2p stream; the
// requester is the coordinator), and writes the result frame back on the coordinator's
// stream.

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
	dc, release, err := n.rtc.AcceptRelayed(ctx, coord, st)
	cancel()
	if err != nil {
		log.Debugw("direct task: no channel to the client", "coordinator", coord, "err", err)
		return // AcceptRelayed reset st
	}
	defer release()
	st.SetDeadline(time.Time{})
	// The coordinator sends nothing more once the channel is up, and closes its side when
	// its client went away: the task then ends as if the client had closed the channel.
	var served atomic.Bool
	coordGone := make(chan struct{})
	go func() { // ends at the coordinator's end or when the deadline below is set
		defer close(coordGone)
		io.Copy(io.Discard, io.LimitReader(st, maxCoordinatorTrailing))
		if !served.Load() {
			dc.Reset()
		}
	}()
	task := n.infer.ServeRequest(coord, req, wantReceipt, n.part.traffic.stream(dc))
	served.Store(true)
	st.SetReadDeadline(time.Now().Add(-time.Hour))
	<-coordGone
	usage := inference.Usage{PromptTokens: task.PromptTokens, CompletionTokens: task.CompletionTokens,
		TotalTokens: task.PromptTokens + task.CompletionTokens}
	switch task.Outcome {
	case infer.OutcomeCompleted:
		n.directResult(st, inference.Result{FinishReason: task.FinishReason, Receipt: task.Receipt, Usage: usage}, nil)
	case infer.OutcomeClientDisconnected:
		// The client's channel went away: the tokens written to it before are its to pay.
		n.directResult(st, inference.Result{Usage: usage},
			inference.Errorf(inference.CodePeerLost, "direct task ended: %w", infer.ErrClientDisconnected))
	default:
		code, ok := inference.ParseCode(task.Outcome)
		if !ok {
			code = inference.CodeUnavailable
		}
		n.directResult(st, inference.Result{Usage: usage}, inference.Errorf(code, "direct task ended: %s", task.Outcome))
	}
}

// maxCoordinatorTrailing bounds what the serving peer reads (and discards) of the
// coordinator's stream once the channel is up: the coordinator should send nothing, so
// anything past this ends the task like the coordinator's end does.
const maxCoordinatorTrailing = 64 << 10

// directResult writes a direct task's result frame and closes st.
func (n *Node) directResult(st network.Stream, res inference.Result, err error) {
	st.SetWriteDeadline(time.Now().Add(infer.WriteTimeout))
	if werr := frame.Write(st, infer.EncodeResult(res, err)); werr != nil {
		st.Reset()
		return
	}
	st.Close()
}
