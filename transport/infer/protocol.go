package infer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/reputation"
)

// ID is the protocol ID of peer inference: one request per stream.
const ID = protocol.ID("/meshinfer/infer/1.0.0")

// ReuseID is the same protocol with requests one after another on a stream: after the
// terminal frame the server waits for the next request frame instead of closing. Clients
// ask for it first and fall back to ID.
const ReuseID = protocol.ID("/meshinfer/infer/1.1.0")

// Sizes and timeouts. Each is the default a Server or Client uses.
const (
	// MaxRequestFrame bounds a request frame: the API's body cap (256 KiB) plus room for the
	// frame type. A request that passed the API's limits always fits.
	MaxRequestFrame = 256<<10 + 1
	// MaxTokenFrame bounds a token frame. One token's text is a few bytes; 4 KiB leaves room
	// for upstream backends that stream text in chunks.
	MaxTokenFrame = 4 << 10
	// MaxTerminalFrame bounds a done or error frame (a usage object or a message).
	MaxTerminalFrame = 4 << 10
	// maxFrame is the largest frame a client accepts from a server.
	maxFrame = max(MaxTokenFrame, MaxTerminalFrame)
	// RequestTimeout bounds the wait for a request frame after a stream opens (slowloris).
	RequestTimeout = 10 * time.Second
	// WriteTimeout bounds one frame write; a client that stops reading is cut off.
	WriteTimeout = 30 * time.Second
	// DefaultFirstTokenTimeout bounds the client's wait from sending a request to its first
	// token frame (or a terminal frame before any). It is the only wait in which a healthy
	// peer may stay silent for long: it loads the model if it is cold (the built-in presets
	// in about a second, a multi-gigabyte model from disk in tens of seconds) and processes
	// the prompt, and a resumed request's replay with it. 30 s leaves room for that; the
	// router's TTFT estimate of a peer is no bound to derive it from (a peer's cold start
	// there is a fixed 2 s guess), and a deadline a healthy peer misses costs it a cooldown
	// and the request a restart from scratch.
	DefaultFirstTokenTimeout = 30 * time.Second
	// DefaultInterTokenTimeout bounds the client's wait for each frame after the first
	// token: the next token or the terminal frame. A token takes milliseconds to a few
	// hundred (a 70 B model on a CPU: about one a second), a non-streaming answer's batching
	// adds at most batchDelay (100 ms), and the time the caller's emit takes is not counted.
	// A peer silent for 5 s mid-stream is frozen (SIGSTOP, a hung process, a machine
	// swapping to a halt) or gone, and the executor moves the stream to another peer
	// (node/dispatch): 5 s is the longest stall a frozen peer causes mid-stream.
	DefaultInterTokenTimeout = 5 * time.Second
	// DefaultMaxInFlight bounds concurrent requests a node serves for peers.
	DefaultMaxInFlight = 64
	// DefaultMaxInFlightPerPeer bounds concurrent requests from one peer.
	DefaultMaxInFlightPerPeer = 8
	// maxGeneration bounds one whole generation at the server.
	maxGeneration = 15 * time.Minute
	// DefaultSessionIdle bounds the server's wait for the next request on a reused stream.
	DefaultSessionIdle = 60 * time.Second
	// poolIdle bounds how long a client keeps an idle stream for reuse: well inside the
	// server's wait, so that a pooled stream is rarely one the server just closed.
	poolIdle = 30 * time.Second
	// maxPooledPerPeer bounds the idle streams a client keeps to one peer.
	maxPooledPerPeer = 4
)

// Frame types.
const (
	frameRequest        byte = 0x01
	frameRequestReceipt byte = 0x05 // a request whose client wants a signed receipt in the done frame
	frameToken          byte = 0x02
	frameDone           byte = 0x03
	frameError          byte = 0x04
)

var errProtocol = errors.New("infer protocol violation")

// Observer records a peer's malformed frames and protocol violations in its score;
// reputation.Store is one.
type Observer interface {
	Observe(peer string, e reputation.Event, now time.Time)
}

// violation is the reputation event err stands for when the remote peer broke the protocol
// (a frame over its bound or with a malformed length: MalformedFrame; a well-formed frame
// out of place or past the request's bounds: ProtocolViolation), and false for anything
// else (timeouts, resets, cancellation say nothing about integrity).
func violation(err error) (reputation.Event, bool) {
	switch {
	case errors.Is(err, frame.ErrTooLarge), errors.Is(err, frame.ErrMalformed):
		return reputation.MalformedFrame, true
	case errors.Is(err, errProtocol):
		return reputation.ProtocolViolation, true
	}
	return 0, false
}

// observe records err against p in o, when err is a violation and o is set.
func observe(o Observer, p peer.ID, err error) {
	if e, ok := violation(err); ok && o != nil {
		o.Observe(p.String(), e, time.Now())
	}
}

// Stream is what the protocol needs of a stream: a libp2p network.Stream, or a WebRTC data
// channel (transport/webrtc). Close ends it after the data written (the other side reads
// EOF); Reset aborts it (the other side reads an error); deadlines fail Read and Write with a
// timeout error.
type Stream interface {
	io.Reader
	io.Writer
	Close() error
	Reset() error
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// wireRequest is a request frame's JSON: the request's, with "replay" (the ids of
// inference.Request.Replay, which the OpenAI API never takes from a client) beside its
// fields.
type wireRequest struct {
	*inference.Request
	Replay []int `json:"replay,omitempty"`
}

func encodeRequest(req *inference.Request, wantReceipt bool) ([]byte, error) {
	b, err := json.Marshal(wireRequest{req, req.Replay})
	if err == nil && len(b)+1 > MaxRequestFrame && len(req.Replay) > 0 {
		// A replay is an optimization: a request it would push past the frame bound goes
		// without it, and the server generates the tokens again.
		b, err = json.Marshal(req)
	}
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	typ := frameRequest
	if wantReceipt {
		typ = frameRequestReceipt
	}
	return append([]byte{typ}, b...), nil
}

// decodeRequest decodes a request frame and reports whether its client wants a receipt.
func decodeRequest(body []byte) (req *inference.Request, wantReceipt bool, err error) {
	if len(body) == 0 || body[0] != frameRequest && body[0] != frameRequestReceipt {
		return nil, false, fmt.Errorf("%w: first frame is not a request", errProtocol)
	}
	req = new(inference.Request)
	w := wireRequest{Request: req}
	if err := json.Unmarshal(body[1:], &w); err != nil {
		return nil, false, inference.Errorf(inference.CodeInvalidRequest, "request frame: %v", err)
	}
	req.Replay = w.Replay
	return req, body[0] == frameRequestReceipt, nil
}

func encodeToken(dst []byte, t inference.Token) []byte {
	dst = append(dst, frameToken)
	dst = binary.AppendUvarint(dst, uint64(t.Index))
	dst = binary.AppendUvarint(dst, uint64(t.ID+1)) // -1 (unknown) encodes as 0
	return append(dst, t.Text...)
}

func decodeToken(body []byte) (inference.Token, error) {
	rest := body[1:]
	idx, n := binary.Uvarint(rest)
	if n <= 0 || idx > 1<<31 {
		return inference.Token{}, fmt.Errorf("%w: bad token index", errProtocol)
	}
	rest = rest[n:]
	id, n := binary.Uvarint(rest)
	if n <= 0 || id > 1<<31 {
		return inference.Token{}, fmt.Errorf("%w: bad token id", errProtocol)
	}
	text := rest[n:]
	if len(text) == 0 || !utf8.Valid(text) {
		return inference.Token{}, fmt.Errorf("%w: token text empty or not UTF-8", errProtocol)
	}
	return inference.Token{Index: int(idx), ID: int(id) - 1, Text: string(text)}, nil
}

func encodeDone(res inference.Result) []byte {
	b, _ := json.Marshal(res) // a struct of strings and ints always encodes
	return append([]byte{frameDone}, b...)
}

func encodeError(err error) []byte {
	b, _ := json.Marshal(wireErrorOf(err))
	return append([]byte{frameError}, b...)
}

// wireErrorOf is err's code and message, the message cut to half a terminal frame.
func wireErrorOf(err error) wireError {
	msg := err.Error()
	if len(msg) > MaxTerminalFrame/2 {
		msg = msg[:MaxTerminalFrame/2]
	}
	return wireError{Code: string(inference.CodeOf(err)), Message: msg}
}

func decodeTerminal(body []byte) (inference.Result, error) {
	switch body[0] {
	case frameDone:
		var res inference.Result
		if err := json.Unmarshal(body[1:], &res); err != nil {
			return inference.Result{}, fmt.Errorf("%w: done frame: %w", errProtocol, err)
		}
		if res.FinishReason != inference.FinishStop && res.FinishReason != inference.FinishLength {
			return inference.Result{}, fmt.Errorf("%w: finish reason %q", errProtocol, res.FinishReason)
		}
		return res, nil
	case frameError:
		var we wireError
		if err := json.Unmarshal(body[1:], &we); err != nil {
			return inference.Result{}, fmt.Errorf("%w: error frame: %w", errProtocol, err)
		}
		code, ok := inference.ParseCode(we.Code)
		if !ok {
			code = inference.CodeUnavailable
		}
		return inference.Result{}, inference.Errorf(code, "peer: %s", we.Message)
	}
	return inference.Result{}, fmt.Errorf("%w: frame type %#x", errProtocol, body[0])
}
