package infer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
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
	// maxFrame is the largest frame a client accepts from a server, kv frames aside.
	maxFrame = max(MaxTokenFrame, MaxTerminalFrame)
	// MaxKVFrame bounds a kv frame (0x06): one run of KV rows of at most
	// inference.MaxKVRowsBytes, plus its type and two varints. Only a handover's or a
	// resumption's reader accepts frames this large.
	MaxKVFrame = inference.MaxKVRowsBytes + 32
	// MaxMoveBytes bounds the kv frames a requester reads from one handover, in bytes. The
	// rows wait in its memory (or in its stream to the replacement) until the replacement
	// has loaded them, so a leaving peer must not be able to make it hold more than this.
	// 512 MiB is the full context window of synth-large (96 KiB a position, 1,024
	// positions) five times over and 2,048 positions of a 7 B model with grouped-query
	// attention in float32 (256 KiB a position); a cache bigger than that takes longer to
	// move (over 4 s at 1 Gbit/s) than to prefill again, which the replacement does with
	// whatever it was not sent.
	MaxMoveBytes = 512 << 20
	// TransferTimeout bounds a resumption's transfer phase at the replacement, from its
	// request frame to its go frame (on top of RequestTimeout, which bounds the request
	// frame's arrival): the replacement holds an in-flight slot and a cache for it. The
	// requester streams the rows while the leaving peer still pre-copies them (a token's
	// time each) and 512 MiB (MaxMoveBytes) takes 43 s at 100 Mbit/s: 60 s is room for
	// an honest transfer, and a requester that stalls past it is cut off.
	TransferTimeout = 60 * time.Second
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
	// DefaultOpenTimeout bounds opening a request's stream to a peer that has none open:
	// the dial, and the DHT walk for its addresses when the dial fails (node's routed
	// host). A live peer answers a dial in milliseconds on a LAN and in a few seconds
	// through a relay with hole punching; a peer that left answers never, and its dials
	// fail only at libp2p's dial timeouts (5 s on a local network, 15 s elsewhere), each
	// round of the DHT walk after them included. Without a bound of its own a request
	// routed to a peer that left stalled 10-20 s before trying another (docs/reliability.md
	// F19). Past it the attempt is unavailable, the peer cools down and the executor tries
	// the next candidate.
	DefaultOpenTimeout = 10 * time.Second
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
	frameKV             byte = 0x06 // rows of a KV cache: server → client (handover), client → server (resume)
	frameMoved          byte = 0x07 // terminal: the generation was handed over
	frameGo             byte = 0x08 // client → server: the resumption's rows are in, generate
	frameReady          byte = 0x09 // server → client: a resumption is ready for its rows
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
// inference.Request.Replay, which the OpenAI API never takes from a client), "handover"
// (the client takes the generation's cache if the server leaves: inference.Request.Move is
// set) and "resume" (the client resumes a generation begun elsewhere) beside its fields.
type wireRequest struct {
	*inference.Request
	Replay   []int `json:"replay,omitempty"`
	Handover bool  `json:"handover,omitempty"`
	Resume   bool  `json:"resume,omitempty"`
}

// requestOpts are what a request frame asks besides the request itself.
type requestOpts struct {
	receipt  bool // a signed receipt in the done frame (frame type 0x05)
	handover bool // kv frames and a moved frame if the server leaves (req.Move is set)
	resume   bool // a resumption: ready, kv and go frames before the answer
}

// encodeRequestOpts is the request frame of req asking o (encodeBounded bounds it).
func encodeRequestOpts(req *inference.Request, o requestOpts) ([]byte, error) {
	w := wireRequest{Request: req, Replay: req.Replay, Handover: o.handover, Resume: o.resume}
	b, err := json.Marshal(w)
	if err == nil && len(b)+1 > MaxRequestFrame && len(req.Replay) > 0 {
		// A replay is an optimization: a request it would push past the frame bound goes
		// without it, and the server generates the tokens again.
		w.Replay = nil
		b, err = json.Marshal(w)
	}
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	typ := frameRequest
	if o.receipt {
		typ = frameRequestReceipt
	}
	return append([]byte{typ}, b...), nil
}

// decodeRequest decodes a request frame and what it asks besides. A resumption's request
// frame carries no replay (its go frame does): one that does is a protocol error.
func decodeRequest(body []byte) (req *inference.Request, o requestOpts, err error) {
	if len(body) == 0 || body[0] != frameRequest && body[0] != frameRequestReceipt {
		return nil, o, fmt.Errorf("%w: first frame is not a request", errProtocol)
	}
	req = new(inference.Request)
	w := wireRequest{Request: req}
	if err := json.Unmarshal(body[1:], &w); err != nil {
		return nil, o, inference.Errorf(inference.CodeInvalidRequest, "request frame: %v", err)
	}
	if w.Resume && len(w.Replay) > 0 {
		return nil, o, fmt.Errorf("%w: a resumption's request frame with a replay", errProtocol)
	}
	req.Replay = w.Replay
	return req, requestOpts{receipt: body[0] == frameRequestReceipt, handover: w.Handover, resume: w.Resume}, nil
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

// appendKV appends the kv frame of r to dst: uvarint pos, uvarint n, then r.Data as
// little-endian float32. r must be well formed (checkKV).
func appendKV(dst []byte, r inference.KVRows) []byte {
	dst = append(dst, frameKV)
	dst = binary.AppendUvarint(dst, uint64(r.Pos))
	dst = binary.AppendUvarint(dst, uint64(r.N))
	for _, v := range r.Data {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// appendKVFrame appends r's whole kv frame, length prefix included, to dst: frame.Append of
// appendKV's body, written without building the body apart (a frame is up to 1 MiB).
func appendKVFrame(dst []byte, r inference.KVRows) []byte {
	body := 1 + frame.UvarintLen(uint64(r.Pos)) + frame.UvarintLen(uint64(r.N)) + 4*len(r.Data)
	dst = slices.Grow(dst, binary.MaxVarintLen64+body)
	dst = binary.AppendUvarint(dst, uint64(body))
	return appendKV(dst, r)
}

// maxKVPositions bounds a kv frame's pos and pos+n: far beyond any context window, and
// small enough that no sum of them overflows an int.
const maxKVPositions = 1 << 31

// checkKV returns an error unless r fits a kv frame: 0 ≤ Pos, 1 ≤ N, Pos+N ≤
// maxKVPositions, and between 1 and inference.MaxKVRowsBytes of values, a whole number of
// layers × 2 × N.
func checkKV(r inference.KVRows) error {
	switch {
	case r.Pos < 0 || r.N < 1 || r.Pos > maxKVPositions-r.N:
		return fmt.Errorf("KV rows at %d of %d positions", r.Pos, r.N)
	case len(r.Data) == 0 || len(r.Data) > inference.MaxKVRowsBytes/4:
		return fmt.Errorf("KV rows of %d values, limit %d", len(r.Data), inference.MaxKVRowsBytes/4)
	case len(r.Data)%(2*r.N) != 0:
		return fmt.Errorf("%d values are no whole rows of keys and values for %d positions", len(r.Data), r.N)
	}
	return nil
}

// decodeKV decodes a kv frame, its values into dst's array when it has room (the rows are
// used only until the next frame: Move.Send and Resumption.Load keep none). Anything but a
// well-formed run of rows (checkKV) is a protocol error.
func decodeKV(body []byte, dst []float32) (inference.KVRows, error) {
	if len(body) == 0 || body[0] != frameKV {
		return inference.KVRows{}, fmt.Errorf("%w: not a kv frame", errProtocol)
	}
	rest := body[1:]
	pos, n := binary.Uvarint(rest)
	if n <= 0 || pos > maxKVPositions {
		return inference.KVRows{}, fmt.Errorf("%w: bad kv position", errProtocol)
	}
	rest = rest[n:]
	count, n := binary.Uvarint(rest)
	if n <= 0 || count > maxKVPositions {
		return inference.KVRows{}, fmt.Errorf("%w: bad kv count", errProtocol)
	}
	rest = rest[n:]
	if len(rest)%4 != 0 {
		return inference.KVRows{}, fmt.Errorf("%w: kv values of %d bytes, not whole float32", errProtocol, len(rest))
	}
	r := inference.KVRows{Pos: int(pos), N: int(count), Data: slices.Grow(dst[:0], len(rest)/4)[:len(rest)/4]}
	for i := range r.Data {
		r.Data[i] = math.Float32frombits(binary.LittleEndian.Uint32(rest[4*i:]))
	}
	if err := checkKV(r); err != nil {
		return inference.KVRows{}, fmt.Errorf("%w: %w", errProtocol, err)
	}
	return r, nil
}

// wireMoved is a moved frame's JSON (0x07).
type wireMoved struct {
	Positions int `json:"positions"`
	Tokens    int `json:"tokens"`
}

func encodeMoved(m *inference.Moved) []byte {
	b, _ := json.Marshal(wireMoved{Positions: m.Positions, Tokens: m.Tokens}) // two ints always encode
	return append([]byte{frameMoved}, b...)
}

// decodeMoved decodes a moved frame; counts that are negative or past maxKVPositions are a
// protocol error (the caller checks them against what it received).
func decodeMoved(body []byte) (*inference.Moved, error) {
	var w wireMoved
	if len(body) == 0 || body[0] != frameMoved {
		return nil, fmt.Errorf("%w: not a moved frame", errProtocol)
	}
	if err := json.Unmarshal(body[1:], &w); err != nil {
		return nil, fmt.Errorf("%w: moved frame: %w", errProtocol, err)
	}
	if w.Positions < 0 || w.Tokens < 0 || w.Positions > maxKVPositions || w.Tokens > maxKVPositions {
		return nil, fmt.Errorf("%w: moved frame with %d positions and %d tokens", errProtocol, w.Positions, w.Tokens)
	}
	return &inference.Moved{Positions: w.Positions, Tokens: w.Tokens}, nil
}

// wireGo is a go frame's JSON (0x08).
type wireGo struct {
	Replay []int `json:"replay"`
}

// encodeGo is the go frame of replay, or invalid_request when it would exceed
// MaxRequestFrame (unlike a request's, a resumption's replay cannot be left out: the rows
// loaded stand for its tokens).
func encodeGo(replay []int) ([]byte, error) {
	b, err := json.Marshal(wireGo{Replay: replay})
	if err != nil {
		return nil, fmt.Errorf("encode go frame: %w", err)
	}
	if len(b)+1 > MaxRequestFrame {
		return nil, inference.Errorf(inference.CodeInvalidRequest, "a replay of %d tokens over the %d byte frame limit", len(replay), MaxRequestFrame)
	}
	return append([]byte{frameGo}, b...), nil
}

// decodeGo decodes a go frame's replay. A frame over MaxRequestFrame or whose JSON does not
// decode is a protocol error; the ids are checked against the request by the caller
// (checkReplay).
func decodeGo(body []byte) ([]int, error) {
	if len(body) == 0 || body[0] != frameGo {
		return nil, fmt.Errorf("%w: not a go frame", errProtocol)
	}
	if len(body) > MaxRequestFrame {
		return nil, fmt.Errorf("%w: go frame of %d bytes, max %d", frame.ErrTooLarge, len(body), MaxRequestFrame)
	}
	var w wireGo
	if err := json.Unmarshal(body[1:], &w); err != nil {
		return nil, fmt.Errorf("%w: go frame: %w", errProtocol, err)
	}
	return w.Replay, nil
}

// checkReplay checks replay as a request frame's replay is checked (inference.Request.Validate:
// fewer ids than req's completion budget, none negative), and the rest of req with it.
func checkReplay(req *inference.Request, replay []int) error {
	r := *req
	r.Replay = replay
	return r.Validate(inference.NoSizeLimits())
}

// wireReady is a ready frame's JSON (0x09).
type wireReady struct {
	Shape inference.ModelShape `json:"shape"`
}

func encodeReady(s inference.ModelShape) []byte {
	b, _ := json.Marshal(wireReady{Shape: s}) // ints always encode
	return append([]byte{frameReady}, b...)
}

// maxShapeDim bounds a ready frame's layers, width and context: far beyond any model, and
// small enough that no product of two of them overflows an int.
const maxShapeDim = 1 << 24

// decodeReady decodes a ready frame's shape. A shape whose one position of KV rows would
// not fit a kv frame, or with a dimension under 1 or past maxShapeDim, is a protocol error:
// no rows could be loaded into it.
func decodeReady(body []byte) (inference.ModelShape, error) {
	var w wireReady
	if len(body) == 0 || body[0] != frameReady {
		return w.Shape, fmt.Errorf("%w: not a ready frame", errProtocol)
	}
	if err := json.Unmarshal(body[1:], &w); err != nil {
		return inference.ModelShape{}, fmt.Errorf("%w: ready frame: %w", errProtocol, err)
	}
	s := w.Shape
	for _, d := range []int{s.Layers, s.Width, s.Context} {
		if d < 1 || d > maxShapeDim {
			return inference.ModelShape{}, fmt.Errorf("%w: ready frame with shape %d layers × width %d, context %d", errProtocol, s.Layers, s.Width, s.Context)
		}
	}
	if inference.KVValues(s, 1) > inference.MaxKVRowsBytes/4 {
		return inference.ModelShape{}, fmt.Errorf("%w: one position of %d layers × width %d exceeds a kv frame", errProtocol, s.Layers, s.Width)
	}
	return s, nil
}
