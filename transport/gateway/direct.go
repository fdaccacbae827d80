package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meshinfer/meshinfer/inference"
)

// Direct requests: the client gets its answer over a WebRTC data channel straight from the
// serving peer; the gateway only relays the channel's signaling between the client and the
// coordinator's DirectRelay, which routes the request, carries the signaling to the peer and
// meters the task from the peer's receipt. See the package documentation for the messages.

// Message types of direct requests.
const (
	msgDirect     = "direct"      // client: a direct request
	msgSignal     = "signal"      // either way: one signaling message of the request's set-up
	msgDirectDone = "direct_done" // server: the peer finished the task; metered
)

// Bounds of direct requests.
const (
	// MaxSignalFrame bounds one signaling message in bytes: transport/webrtc's largest, an
	// SDP of 16 KiB plus its type byte.
	MaxSignalFrame = 16<<10 + 1
	// maxSignalQueue bounds the client's signaling messages waiting for the relay: an offer,
	// 32 candidates and the end, with slack. One more closes the request with an error.
	maxSignalQueue = 40
)

// DirectRelay serves one direct request of session s (node implements it): body is the
// chat completion request object as POST /v1/chat/completions takes it; sig carries the
// client's signaling messages (Recv) and the peer's (Send). It returns once the task ended at
// the peer, with its outcome as metered, or a typed error. ctx ends when the client cancels,
// its connection dies or the gateway closes.
type DirectRelay func(ctx context.Context, s Session, body json.RawMessage, sig *SignalPipe) (DirectResult, error)

// DirectResult is what the client hears about its finished direct task: where it ran, how
// it ended, and the metered record (the peer's receipt and the coordinator's
// countersignature). The tokens went to the client over its data channel only.
type DirectResult struct {
	Peer         string                 `json:"peer"`
	FinishReason inference.FinishReason `json:"finish_reason"`
	Usage        inference.Usage        `json:"usage"`
	Receipt      string                 `json:"receipt,omitempty"`
	Countersig   string                 `json:"countersig,omitempty"`
}

// WithDirect serves direct requests with relay. Without it, a direct request gets an
// unavailable error.
func WithDirect(relay DirectRelay) WSOption { return func(g *WebSocket) { g.direct = relay } }

// SignalPipe carries one direct request's signaling messages between its client and the
// relay.
type SignalPipe struct {
	id   string
	c    *conn
	in   chan []byte   // from the client, bounded by maxSignalQueue
	done chan struct{} // closed when the request ends: deliver stops
}

// Recv returns the client's next signaling message; it fails when ctx ends.
func (p *SignalPipe) Recv(ctx context.Context) ([]byte, error) {
	select {
	case b := <-p.in:
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Send sends a signaling message to the client.
func (p *SignalPipe) Send(msg []byte) error {
	if len(msg) == 0 || len(msg) > MaxSignalFrame {
		return fmt.Errorf("signaling message of %d bytes: 1 to %d", len(msg), MaxSignalFrame)
	}
	if !p.c.send(outMsg{b: encode(signalMessage{Type: msgSignal, ID: p.id, Frame: base64.StdEncoding.EncodeToString(msg)}), index: -1}) {
		return errors.New("client connection closed")
	}
	return nil
}

// deliver queues a signaling message from the client; false when the queue is full.
func (p *SignalPipe) deliver(b []byte) bool {
	select {
	case p.in <- b:
		return true
	case <-p.done:
		return true // the request ended: nothing to deliver to
	default:
		return false
	}
}

// directCall is a direct request in flight on a connection.
type directCall struct {
	pipe   *SignalPipe
	cancel context.CancelFunc
}

// directRequest starts the relay of a direct request message.
func (c *conn) directRequest(m clientMessage) {
	if c.g.direct == nil {
		c.sendError(m.ID, inference.CodeUnavailable, "this coordinator does not relay direct (WebRTC) requests: send a request message instead")
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	p := &SignalPipe{id: m.ID, c: c, in: make(chan []byte, maxSignalQueue), done: make(chan struct{})}
	c.mu.Lock()
	c.directs[m.ID] = &directCall{pipe: p, cancel: cancel}
	c.mu.Unlock()
	c.wg.Go(func() { // ends when the relay returns: the task ended, or ctx did
		defer cancel()
		res, err := c.g.direct(ctx, c.session, m.Body, p)
		close(p.done)
		c.mu.Lock()
		delete(c.directs, m.ID)
		c.mu.Unlock()
		if err != nil {
			e := terminal(err)
			c.sendError(m.ID, e.Code, e.Message)
			return
		}
		c.send(outMsg{b: encode(directDoneMessage{Type: msgDirectDone, ID: m.ID, DirectResult: res}), index: -1})
	})
}

// signal hands a client's signaling message to its direct request. A message for no
// request in flight is ignored (it may have just ended); one over the queue's bound ends
// the request.
func (c *conn) signal(m clientMessage) {
	c.mu.Lock()
	d := c.directs[m.ID]
	c.mu.Unlock()
	if d == nil {
		return
	}
	b, err := base64.StdEncoding.DecodeString(m.Frame)
	if err != nil || len(b) == 0 || len(b) > MaxSignalFrame {
		d.cancel()
		return
	}
	if !d.pipe.deliver(b) {
		d.cancel()
	}
}

// cancelDirect ends a direct request its client cancelled; false when none has that id.
func (c *conn) cancelDirect(id string) bool {
	c.mu.Lock()
	d := c.directs[id]
	c.mu.Unlock()
	if d != nil {
		d.cancel()
	}
	return d != nil
}

// Messages of direct requests from the server.
type (
	signalMessage struct {
		Type  string `json:"type"`
		ID    string `json:"id"`
		Frame string `json:"frame"`
	}
	directDoneMessage struct {
		Type string `json:"type"`
		ID   string `json:"id"`
		DirectResult
	}
)
