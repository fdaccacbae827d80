package infer

import (
	"context"
	"encoding/json"
	"errors"
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
//	                     0x11 failed    JSON {"code", "message", "outcome", "usage"}
//
// The peer answers the client's offer on a one-shot PeerConnection and serves the request
// on the client's first data channel exactly as a stream of ID answers it: token frames,
// then one terminal frame (done, with the same receipt, or error). The client sends nothing
// on the channel (ReadAnswer). Then the peer writes one result frame to the coordinator: the
// task's result and receipt, or why it failed; the receipt is made out to the coordinator,
// which meters the task from it and never sees a token. A failed task's frame says what the
// client got before the end: usage has the tokens written to the channel (and the prompt's
// count when the peer has one), and outcome is "client_disconnected" when the client went
// away (its code is then peer_lost). The coordinator bounds those counts as it bounds a
// result's.
//
// Once the channel is up the peer reads on (and discards) the coordinator's stream: the
// coordinator closes its side when its client went away (the gateway connection ended or
// the client cancelled), and the peer then ends the task as if the client had closed the
// channel, so that a client cannot keep a channel running past the coordinator's record of
// it. The whole exchange is bounded by the set-up's timeout plus the generation's.
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

// ErrClientDisconnected is wrapped by the error DecodeResult returns for a direct task that
// ended because its client went away (outcome "client_disconnected"), and is what
// EncodeResult takes to say so.
var ErrClientDisconnected = errors.New(OutcomeClientDisconnected)

// failedResult is the JSON of a failed frame (0x11).
type failedResult struct {
	wireError
	Outcome string           `json:"outcome,omitempty"`
	Usage   *inference.Usage `json:"usage,omitempty"`
}

// EncodeResult is the result frame of a direct task: res (completed) or err. With err, the
// frame carries res.Usage (what the client got before the end) and, when err wraps
// ErrClientDisconnected, outcome client_disconnected.
func EncodeResult(res inference.Result, err error) []byte {
	if err != nil {
		f := failedResult{wireError: wireErrorOf(err)}
		if errors.Is(err, ErrClientDisconnected) {
			f.Outcome = OutcomeClientDisconnected
		}
		if res.Usage != (inference.Usage{}) {
			f.Usage = &res.Usage
		}
		b, _ := json.Marshal(f) // strings and ints always encode
		return append([]byte{frameFailed}, b...)
	}
	b, _ := json.Marshal(res) // strings and ints always encode
	return append([]byte{frameResult}, b...)
}

// DecodeResult reads a result frame: the task's result, or its typed error with the usage
// the peer reported for what the client got (wrapping ErrClientDisconnected when the client
// went away). The usage is the peer's word: the caller bounds it.
func DecodeResult(body []byte) (inference.Result, error) {
	if !IsResultFrame(body) {
		return inference.Result{}, fmt.Errorf("%w: not a result frame", errProtocol)
	}
	if body[0] == frameResult {
		return decodeTerminal(append([]byte{frameDone}, body[1:]...))
	}
	var f failedResult
	if err := json.Unmarshal(body[1:], &f); err != nil {
		return inference.Result{}, fmt.Errorf("%w: failed frame: %w", errProtocol, err)
	}
	code, ok := inference.ParseCode(f.Code)
	if !ok {
		code = inference.CodeUnavailable
	}
	var res inference.Result
	if f.Usage != nil {
		res.Usage = *f.Usage
	}
	if f.Outcome == OutcomeClientDisconnected {
		return res, inference.Errorf(code, "peer: %s: %w", f.Message, ErrClientDisconnected)
	}
	return res, inference.Errorf(code, "peer: %s", f.Message)
}

// EncodeRequest is the request frame of req (type 0x05 with wantReceipt), within
// MaxRequestFrame.
func EncodeRequest(req *inference.Request, wantReceipt bool) ([]byte, error) {
	return encodeBounded(req, requestOpts{receipt: wantReceipt, handover: req.Move != nil})
}

// encodeBounded is the request frame of req asking o, within MaxRequestFrame.
func encodeBounded(req *inference.Request, o requestOpts) ([]byte, error) {
	body, err := encodeRequestOpts(req, o)
	if err != nil {
		return nil, err
	}
	if len(body) > MaxRequestFrame {
		return nil, inference.Errorf(inference.CodeInvalidRequest, "request of %d bytes over the %d byte limit", len(body), MaxRequestFrame)
	}
	return body, nil
}

// DecodeRequest reads a request frame and whether it asks for a receipt. A frame that is
// not a request is a protocol error; one that does not decode is invalid_request. It
// ignores "handover" and "resume": a direct task's answer goes to a thin client, which
// takes no cache, and ServeRequest runs it as a plain request.
func DecodeRequest(body []byte) (*inference.Request, bool, error) {
	req, o, err := decodeRequest(body)
	return req, o.receipt, err
}

// ReadAnswer reads the answer to req, which reached peer p another way (a coordinator sent
// it), from st, with Generate's contract and its bounds: emit once per token, then the result
// or a typed error. It sends nothing on st, but keeps its write side open until the terminal
// frame, and resets st when ctx ends.
func (c *Client) ReadAnswer(ctx context.Context, st Stream, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	res, _, err := c.exchange(ctx, st, p, req, nil, emit, false)
	return res, err
}
