package infer

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/meshinfer/meshinfer/inference"
)

// Direct tasks: a coordinator's thin client gets its answer straight from the serving peer
// over a WebRTC data channel, while the coordinator routes, meters and verifies.
//
// The coordinator opens a stream to the serving peer with DirectID and writes, as frames
// (internal/frame):
//
//	coordinator → peer   0x05 request   the task, as the request frame of ID (asking for a
//	                                    receipt); read with frame.ReadOne, since what
//	                                    follows belongs to the WebRTC set-up
//	both ways            the relayed WebRTC signaling of transport/webrtc: the client's
//	                     offer and candidates one way, the peer's answer and candidates the
//	                     other, each message type below 0x10
//	peer → coordinator   0x10 result    JSON inference.Result, with the receipt
//	                     0x11 failed    JSON {"code", "message"}
//
// The peer answers the client's offer on a one-shot PeerConnection and serves the request
// on the client's first data channel exactly as a stream of ID answers it: token frames,
// then one terminal frame (done, with the same receipt, or error). The client sends nothing
// on the channel (ReadAnswer). Then the peer writes one result frame to the coordinator: the
// task's result and receipt, or why it failed; the receipt is made out to the coordinator,
// which meters the task from it and never sees a token. The whole exchange is bounded by
// the set-up's timeout plus the generation's.
const DirectID = protocol.ID("/meshinfer/infer-direct/1.0.0")

// Result frame types of DirectID: above every signaling message type.
const (
	frameResult byte = 0x10
	frameFailed byte = 0x11
)

// IsResultFrame reports whether a frame read from a DirectID stream is the peer's result
// frame (the exchange's last), rather than a signaling message to relay.
func IsResultFrame(body []byte) bool {
	return len(body) > 0 && (body[0] == frameResult || body[0] == frameFailed)
}

// EncodeResult is the result frame of a direct task: res (completed) or err.
func EncodeResult(res inference.Result, err error) []byte {
	if err != nil {
		b := encodeError(err)
		b[0] = frameFailed
		return b
	}
	b, _ := json.Marshal(res) // strings and ints always encode
	return append([]byte{frameResult}, b...)
}

// DecodeResult reads a result frame: the task's result, or its typed error.
func DecodeResult(body []byte) (inference.Result, error) {
	if !IsResultFrame(body) {
		return inference.Result{}, fmt.Errorf("%w: not a result frame", errProtocol)
	}
	b := append([]byte{frameDone}, body[1:]...)
	if body[0] == frameFailed {
		b[0] = frameError
	}
	return decodeTerminal(b)
}

// EncodeRequest is the request frame of req (type 0x05 with wantReceipt), within
// MaxRequestFrame.
func EncodeRequest(req *inference.Request, wantReceipt bool) ([]byte, error) {
	body, err := encodeRequest(req, wantReceipt)
	if err != nil {
		return nil, err
	}
	if len(body) > MaxRequestFrame {
		return nil, inference.Errorf(inference.CodeInvalidRequest, "request of %d bytes over the %d byte limit", len(body), MaxRequestFrame)
	}
	return body, nil
}

// DecodeRequest reads a request frame and whether it asks for a receipt. A frame that is
// not a request is a protocol error; one that does not decode is invalid_request.
func DecodeRequest(body []byte) (*inference.Request, bool, error) { return decodeRequest(body) }

// ReadAnswer reads the answer to req, which reached peer p another way (a coordinator sent
// it), from st, with Generate's contract and its bounds: emit once per token, then the result
// or a typed error. It sends nothing on st, but keeps its write side open until the terminal
// frame, and resets st when ctx ends.
func (c *Client) ReadAnswer(ctx context.Context, st Stream, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	res, _, err := c.exchange(ctx, st, p, req, nil, emit, false)
	return res, err
}
