package stage

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/reputation"
)

// ID is the protocol ID of the stage protocol.
const ID = protocol.ID("/meshinfer/stage/1.0.0")

// ServiceName is the resource manager service the protocol's streams are accounted under.
const ServiceName = "meshinfer.stage"

// Sizes, bounds and timeouts. Each is the protocol's, or the default a Server or Pipeline
// uses.
const (
	// MaxStages bounds a chain's length: 64 stages of at least one layer each covers every
	// open model with room to spare, and bounds what one open frame makes a stage check.
	MaxStages = 64
	// MaxAddrsPerHop bounds the addresses an open frame gives for a hop: a stage dials at
	// most these for its next hop, so a head cannot make it dial a long list.
	MaxAddrsPerHop = 4
	// maxAddrLen bounds one address's text (bytes): an ip6/dns name, a port and a peer ID.
	maxAddrLen = 256
	// maxModelLen bounds a model name (bytes), as the API does in practice.
	maxModelLen = 256
	// MaxOpenFrame bounds an open frame: MaxStages hops of a peer ID (≤ 60 bytes of text)
	// and MaxAddrsPerHop addresses each fit with room for the JSON around them.
	MaxOpenFrame = 96 << 10
	// MaxErrorFrame bounds an error frame (a JSON code, stage and message) and the small
	// frames (ready, attach): a message of maxErrorMessage bytes takes at most 6 bytes of
	// JSON per byte (\u003c), 3 KiB.
	MaxErrorFrame = 4 << 10
	// maxErrorMessage bounds an error frame's message (bytes).
	maxErrorMessage = 512
	// MaxStepBytes bounds the hidden states of one step (bytes): a session's steps carry at
	// most MaxStepBytes/(4·width) positions, and a longer prompt goes as several steps. 8 MiB
	// is 512 positions of a 4096-wide model; it fits, with its frame header, in one stream's
	// memory under go-libp2p's default resource limits (16 MiB per stream).
	MaxStepBytes = 8 << 20
	// maxStepHeader bounds a hidden frame's header: the type and two uvarints, and in a
	// timed session the count and the times of at most MaxStages stages.
	maxStepHeader = 1 + 2*binary.MaxVarintLen64 + maxTimes
	// maxTimes bounds a timed frame's times: their count and MaxStages of them.
	maxTimes = (1 + MaxStages) * binary.MaxVarintLen64
	// MaxStageTime bounds the time one stage may report for its layers in one step: more
	// than any step timeout (a stage's Forward past its own is cut off).
	MaxStageTime = 10 * time.Minute
	// OpenTimeout bounds each wait of a session's set-up: the open or attach frame after a
	// stream opens, the next hop's answer (the rest of the chain set up behind it), the
	// head's attach at the last stage. Loading a range of layers can take a few seconds.
	OpenTimeout = 20 * time.Second
	// DefaultStepTimeout bounds a step of several positions (a prefill): at the head, from
	// sending the hidden states to the last stage's output; and, at a stage, its layers'
	// Forward and the write to the next hop in any step. A prefill of MaxStepBytes takes
	// well under a second on the hardware that holds such a model; 30 s, as transport/infer's
	// first-token timeout, leaves room for a slow stage and a long batch.
	DefaultStepTimeout = 30 * time.Second
	// DefaultDecodeStepTimeout bounds a step of one position (a decode step: one token's
	// layers) at the head. It takes milliseconds plus a crossing per stage; a chain silent
	// for 5 s in one is frozen (a stage stopped, SIGSTOP) or gone, by transport/infer's
	// reasoning for its inter-token timeout, which it equals: a pipeline's client sees no
	// longer a stall than a peer's.
	DefaultDecodeStepTimeout = 5 * time.Second
	// DefaultSessionIdle bounds a stage's wait for the next step: a session idle this long
	// is freed (its KV cache with it), as transport/infer's reused streams are.
	DefaultSessionIdle = 60 * time.Second
	// DefaultMaxSessions bounds the sessions a stage holds at once.
	DefaultMaxSessions = 64
	// DefaultMaxSessionsPerPeer bounds the sessions one previous hop holds at a stage.
	DefaultMaxSessionsPerPeer = 8
	// errorWriteTimeout bounds the write of an error frame while a session ends: a small
	// frame, written once; a peer that does not take it is not waited for.
	errorWriteTimeout = 2 * time.Second
	// sessionIDLen is the length of a session ID in bytes (random, chosen by the head).
	sessionIDLen = 16
	// MaxReceipt bounds one stage's receipt in a receipts frame (bytes): mesh/receipts'
	// MaxTaskReceipt, which a stage receipt (two peer IDs, a model name of at most 256
	// bytes, a session ID and a signature) stays under.
	MaxReceipt = 2 << 10
	// CloseTimeout bounds the head's wait, after its end frame, for the receipts of a
	// receipted session: k one-way crossings and a signature per stage, milliseconds on
	// any link a chain runs on. A chain that does not answer within it leaves the pipeline
	// without receipts, and the head's Close returns then.
	CloseTimeout = 5 * time.Second
)

// Frame types: the first byte of every frame body.
const (
	frameOpen   byte = 0x01 // previous hop → stage: JSON openMsg
	frameHidden byte = 0x02 // forward: uvarint step, uvarint n, n×width float32 LE
	frameReady  byte = 0x03 // backward (and last stage → head): uvarint width
	frameError  byte = 0x04 // either way: JSON wireError
	frameAttach byte = 0x05 // head → last stage: the session ID
	frameEnd    byte = 0x06 // forward: the session ends in order (the head closed it)
	frameTimed  byte = 0x07 // forward, timed sessions: a hidden frame with the stages' times
	// forward, receipted sessions: the end, with the receipts of the stages so far
	frameReceipts byte = 0x08
	frameLeaving  byte = 0x09 // forward, movable sessions: uvarint stage, which is leaving
	frameKeep     byte = 0x0a // forward, movable sessions: the end, every stage keeping its session
	frameFetch    byte = 0x0b // head → leaving stage: the kept session's ID, whose rows it wants
	frameLoad     byte = 0x0c // head → replacement stage: the session ID, whose rows follow
	frameKV       byte = 0x0d // fetch and load streams: uvarint pos, uvarint n, KV values
)

// Flags of a ready frame, after its width: what the stage and every stage after it do for
// the session, each only when the open asked for it.
const (
	flagTimed    byte = 1 << 0 // they report their layers' times in each step
	flagReceipts byte = 1 << 1 // they send their receipts at the end
	flagMoves    byte = 1 << 2 // they pass leaving notices on, and can keep and move their sessions
)

// headStage is the stage index that names the head in an error frame.
const headStage = -1

var errProtocol = errors.New("stage protocol violation")

// Observer records a peer's malformed frames and protocol violations in its score;
// reputation.Store is one.
type Observer interface {
	Observe(peer string, e reputation.Event, now time.Time)
}

// violation is the reputation event err stands for when the remote peer broke the protocol
// (a frame over its bound or with a malformed length: MalformedFrame; a well-formed frame
// out of place or with bad content: ProtocolViolation), and false for anything else
// (timeouts, resets, cancellation say nothing about integrity).
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

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout() || errors.Is(err, io.ErrNoProgress)
}

// Hop is one stage of a chain: the peer that runs it and its layers [Lo, Hi).
type Hop struct {
	Peer   peer.ID
	Lo, Hi int
}

// FailedStage names the stage a pipeline error is about. Errors of Open and Forward that a
// stage caused or reported wrap one: errors.As(err, &fs) gives it, inference.CodeOf the
// code. Index is the stage's place in the chain (0 first); -1 names the head itself (a
// stage reported that the head broke the protocol).
//
// What a stage reports about another one is believed as far as the chain's order allows (a
// stage can only blame a stage after it on the way back, before it on the way forward),
// not further: a lying stage can blame its neighbour.
type FailedStage struct {
	Index int
	Peer  peer.ID
}

func (f *FailedStage) Error() string {
	if f.Index == headStage {
		return "the head"
	}
	return fmt.Sprintf("stage %d (%s)", f.Index, f.Peer)
}

// maxBatch is the most positions one step carries in a session of the given width,
// maxPositions and head's batch bound.
func maxBatch(width, maxPositions, batch int) int {
	return max(1, min(maxPositions, batch, MaxStepBytes/(4*width)))
}

// stepFrameMax bounds a hidden frame of a session with at most batch positions per step.
func stepFrameMax(width, batch int) int { return maxStepHeader + 4*width*batch }

// openMsg is the open frame's JSON: the session and the chain from the receiving stage on.
type openMsg struct {
	Session      string    `json:"session"`       // sessionIDLen bytes, lowercase hex
	Head         string    `json:"head"`          // the head's peer ID
	Model        string    `json:"model"`         // the model whose layers run
	MaxPositions int       `json:"max_positions"` // the positions the session may hold
	MaxBatch     int       `json:"max_batch"`     // the most positions the head sends in one step
	Index        int       `json:"index"`         // the receiving stage's place in the chain
	Hops         []wireHop `json:"hops"`          // the receiving stage's hop, then the rest
	// Timing asks the stages to report their layers' time in each step (a timed session).
	// A stage that does not know the field ignores it, and answers a ready without the flag.
	Timing bool `json:"timing,omitempty"`
	// Receipts asks the stages for their signed receipts at the end (a receipted session),
	// ignored like Timing by a stage that does not know it.
	Receipts bool `json:"receipts,omitempty"`
	// Moves says the head takes leaving notices and can re-link the chain around a stage
	// that leaves (a movable session), ignored like Timing by a stage that does not know it.
	Moves bool `json:"moves,omitempty"`
	// Adopt, in the open of a re-linked chain, is the session ID of the chain it replaces:
	// each hop without Load takes over the session it kept of that chain; Positions is how
	// many positions every stage holds then.
	Adopt     string `json:"adopt,omitempty"`
	Positions int    `json:"positions,omitempty"`
}

type wireHop struct {
	Peer  string   `json:"peer"`
	Lo    int      `json:"lo"`
	Hi    int      `json:"hi"`
	Addrs []string `json:"addrs,omitempty"`
	// Load, in a re-linked chain's open, marks a replacement hop: it opens a fresh session
	// and loads its rows from the head's load stream.
	Load bool `json:"load,omitempty"`
}

// open is a decoded open frame.
type open struct {
	session      [sessionIDLen]byte
	head         peer.ID
	model        string
	maxPositions int
	maxBatch     int
	index        int
	hops         []Hop
	addrs        [][]ma.Multiaddr // per hop
	timing       bool             // the head asks for the stages' times
	receipts     bool             // the head asks for the stages' receipts
	moves        bool             // the head takes leaving notices and keep ends
	// adopt is the session a re-linked chain replaces (adopting: set); positions is what
	// every stage holds then, and loads says which hops load their rows instead of adopting.
	adopt     [sessionIDLen]byte
	adopting  bool
	positions int
	loads     []bool // per hop
}

// stages is the chain's length.
func (o *open) stages() int { return o.index + len(o.hops) }

// asked is the ready flags the open asks for: what a ready answering it may carry.
func (o *open) asked() byte {
	f := flagsOf(o.timing, o.receipts)
	if o.moves {
		f |= flagMoves
	}
	return f
}

func encodeOpen(o *open) []byte {
	m := openMsg{
		Session: hex.EncodeToString(o.session[:]), Head: o.head.String(), Model: o.model,
		MaxPositions: o.maxPositions, MaxBatch: o.maxBatch, Index: o.index, Timing: o.timing,
		Receipts: o.receipts, Moves: o.moves,
	}
	if o.adopting {
		m.Adopt, m.Positions = hex.EncodeToString(o.adopt[:]), o.positions
	}
	for i, h := range o.hops {
		wh := wireHop{Peer: h.Peer.String(), Lo: h.Lo, Hi: h.Hi, Load: i < len(o.loads) && o.loads[i]}
		if i < len(o.addrs) {
			for _, a := range o.addrs[i] {
				wh.Addrs = append(wh.Addrs, a.String())
			}
		}
		m.Hops = append(m.Hops, wh)
	}
	b, _ := json.Marshal(m) // strings and ints always encode
	return append([]byte{frameOpen}, b...)
}

// decodeOpen decodes an open frame and checks its structure: a well-formed session ID and
// peer IDs, a chain of 1..MaxStages hops in all with contiguous, non-empty layer ranges,
// positions and batch at least 1, bounded addresses. What depends on the receiving stage
// (its peer, the model's layers) is checked by the server. Any failure is errProtocol: a
// head or stage that follows the protocol never sends it.
func decodeOpen(body []byte) (*open, error) {
	if len(body) == 0 || body[0] != frameOpen {
		return nil, fmt.Errorf("%w: not an open frame", errProtocol)
	}
	var m openMsg
	if err := json.Unmarshal(body[1:], &m); err != nil {
		return nil, fmt.Errorf("%w: open frame: %v", errProtocol, err)
	}
	o := &open{model: m.Model, maxPositions: m.MaxPositions, maxBatch: m.MaxBatch, index: m.Index, timing: m.Timing,
		receipts: m.Receipts, moves: m.Moves}
	if len(m.Session) != 2*sessionIDLen || hex.EncodeToString(mustHex(m.Session)) != m.Session {
		return nil, fmt.Errorf("%w: session ID %q", errProtocol, m.Session)
	}
	copy(o.session[:], mustHex(m.Session))
	var err error
	if o.head, err = peer.Decode(m.Head); err != nil {
		return nil, fmt.Errorf("%w: head %q: %v", errProtocol, m.Head, err)
	}
	switch {
	case m.Model == "" || len(m.Model) > maxModelLen || !utf8.ValidString(m.Model):
		return nil, fmt.Errorf("%w: model name", errProtocol)
	case m.MaxPositions < 1 || m.MaxBatch < 1 || m.MaxBatch > m.MaxPositions:
		return nil, fmt.Errorf("%w: max_positions %d, max_batch %d", errProtocol, m.MaxPositions, m.MaxBatch)
	case m.Index < 0 || len(m.Hops) < 1 || m.Index+len(m.Hops) > MaxStages:
		return nil, fmt.Errorf("%w: stage %d of a chain with %d more", errProtocol, m.Index, len(m.Hops))
	}
	if m.Adopt != "" || m.Positions != 0 {
		// A re-linked chain: the session it replaces, and the positions, which the
		// sessions hold already and which the steps go on after.
		if len(m.Adopt) != 2*sessionIDLen || hex.EncodeToString(mustHex(m.Adopt)) != m.Adopt ||
			m.Positions < 1 || m.Positions >= m.MaxPositions || m.Adopt == m.Session || !m.Moves {
			return nil, fmt.Errorf("%w: adopt %q at %d positions", errProtocol, m.Adopt, m.Positions)
		}
		copy(o.adopt[:], mustHex(m.Adopt))
		o.adopting, o.positions = true, m.Positions
	}
	for i, wh := range m.Hops {
		p, err := peer.Decode(wh.Peer)
		if err != nil {
			return nil, fmt.Errorf("%w: hop %d peer: %v", errProtocol, i, err)
		}
		if wh.Lo < 0 || wh.Hi <= wh.Lo || i > 0 && wh.Lo != m.Hops[i-1].Hi {
			return nil, fmt.Errorf("%w: hop %d layers [%d, %d) do not follow on", errProtocol, i, wh.Lo, wh.Hi)
		}
		if len(wh.Addrs) > MaxAddrsPerHop {
			return nil, fmt.Errorf("%w: hop %d has %d addresses", errProtocol, i, len(wh.Addrs))
		}
		var addrs []ma.Multiaddr
		for _, s := range wh.Addrs {
			a, err := ma.NewMultiaddr(s)
			if err != nil || len(s) > maxAddrLen {
				return nil, fmt.Errorf("%w: hop %d address %q", errProtocol, i, s)
			}
			addrs = append(addrs, a)
		}
		if wh.Load && !o.adopting {
			return nil, fmt.Errorf("%w: hop %d loads rows in a chain that adopts none", errProtocol, i)
		}
		o.hops = append(o.hops, Hop{Peer: p, Lo: wh.Lo, Hi: wh.Hi})
		o.addrs = append(o.addrs, addrs)
		o.loads = append(o.loads, wh.Load)
	}
	return o, nil
}

// mustHex is s decoded, or nil.
func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil
	}
	return b
}

// appendHiddenFrame appends a whole hidden frame, length prefix included, to dst: step s,
// n positions of hidden states h (n × width values). It is frame.Append of the body,
// written without building the body apart.
func appendHiddenFrame(dst []byte, step uint64, n int, h []float32) []byte {
	body := 1 + frame.UvarintLen(step) + frame.UvarintLen(uint64(n)) + 4*len(h)
	dst = slices.Grow(dst, binary.MaxVarintLen64+body)
	dst = binary.AppendUvarint(dst, uint64(body))
	dst = append(dst, frameHidden)
	dst = binary.AppendUvarint(dst, step)
	dst = binary.AppendUvarint(dst, uint64(n))
	for _, v := range h {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// uvarint reads a minimally encoded uvarint from b and returns the rest.
func uvarint(b []byte) (uint64, []byte, bool) {
	x, k := binary.Uvarint(b)
	if k <= 0 || k > 1 && b[k-1] == 0 {
		return 0, nil, false
	}
	return x, b[k:], true
}

// appendTimedFrame appends a whole timed frame, length prefix included, to dst: step s, n
// positions of hidden states h (n × width values), and times, the layers' time in this
// step of each stage so far (at most MaxStages, each in [0, MaxStageTime]), in nanoseconds.
func appendTimedFrame(dst []byte, step uint64, n int, times []time.Duration, h []float32) []byte {
	body := 1 + frame.UvarintLen(step) + frame.UvarintLen(uint64(n)) + frame.UvarintLen(uint64(len(times))) + 4*len(h)
	for _, d := range times {
		body += frame.UvarintLen(uint64(d))
	}
	dst = slices.Grow(dst, binary.MaxVarintLen64+body)
	dst = binary.AppendUvarint(dst, uint64(body))
	dst = append(dst, frameTimed)
	dst = binary.AppendUvarint(dst, step)
	dst = binary.AppendUvarint(dst, uint64(n))
	dst = binary.AppendUvarint(dst, uint64(len(times)))
	for _, d := range times {
		dst = binary.AppendUvarint(dst, uint64(d))
	}
	for _, v := range h {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// decodeHidden decodes a hidden frame of a session of the given width whose steps carry at
// most batch positions: its step number, its positions n (1..batch) and exactly n × width
// values, into dst when it has room.
func decodeHidden(body []byte, width, batch int, dst []float32) (step uint64, n int, h []float32, err error) {
	if len(body) == 0 || body[0] != frameHidden {
		return 0, 0, nil, fmt.Errorf("%w: not a hidden frame", errProtocol)
	}
	step, rest, ok := uvarint(body[1:])
	if !ok {
		return 0, 0, nil, fmt.Errorf("%w: bad step number", errProtocol)
	}
	n, h, err = decodeStates(rest, width, batch, dst)
	return step, n, h, err
}

// decodeTimed decodes a timed frame of a session of the given width and batch that must
// carry the times of exactly k stages: decodeHidden's step, positions and values, and the
// times, each at most MaxStageTime.
func decodeTimed(body []byte, width, batch, k int, dst []float32) (step uint64, n int, times []time.Duration, h []float32, err error) {
	if len(body) == 0 || body[0] != frameTimed {
		return 0, 0, nil, nil, fmt.Errorf("%w: not a timed frame", errProtocol)
	}
	step, rest, ok := uvarint(body[1:])
	if !ok {
		return 0, 0, nil, nil, fmt.Errorf("%w: bad step number", errProtocol)
	}
	nn, rest, ok := uvarint(rest)
	if !ok || nn < 1 || nn > uint64(batch) {
		return 0, 0, nil, nil, fmt.Errorf("%w: bad position count (batch %d)", errProtocol, batch)
	}
	count, rest, ok := uvarint(rest)
	if !ok || count != uint64(k) {
		return 0, 0, nil, nil, fmt.Errorf("%w: times of %d stages, want %d", errProtocol, count, k)
	}
	times = make([]time.Duration, k)
	for i := range times {
		var d uint64
		if d, rest, ok = uvarint(rest); !ok || d > uint64(MaxStageTime) {
			return 0, 0, nil, nil, fmt.Errorf("%w: bad time of stage %d", errProtocol, i)
		}
		times[i] = time.Duration(d)
	}
	n = int(nn)
	if len(rest) != 4*n*width {
		return 0, 0, nil, nil, fmt.Errorf("%w: %d bytes of hidden states for %d positions of width %d", errProtocol, len(rest), n, width)
	}
	return step, n, times, readStates(rest, n*width, dst), nil
}

// decodeStates decodes a position count (1..batch) and exactly that many positions of
// width values from b, into dst when it has room.
func decodeStates(b []byte, width, batch int, dst []float32) (int, []float32, error) {
	nn, rest, ok := uvarint(b)
	if !ok || nn < 1 || nn > uint64(batch) {
		return 0, nil, fmt.Errorf("%w: bad position count (batch %d)", errProtocol, batch)
	}
	n := int(nn)
	if len(rest) != 4*n*width {
		return 0, nil, fmt.Errorf("%w: %d bytes of hidden states for %d positions of width %d", errProtocol, len(rest), n, width)
	}
	return n, readStates(rest, n*width, dst), nil
}

// readStates reads m float32 little-endian values from b, into dst when it has room.
func readStates(b []byte, m int, dst []float32) []float32 {
	h := slices.Grow(dst[:0], m)[:m]
	for i := range h {
		h[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return h
}

// encodeReady is a ready frame: the width, then the flags byte when any flag is set
// (flagTimed, flagReceipts).
func encodeReady(width int, flags byte) []byte {
	b := binary.AppendUvarint([]byte{frameReady}, uint64(width))
	if flags != 0 {
		b = append(b, flags)
	}
	return b
}

// decodeReady decodes a ready frame: a width of at least 1 that lets a step carry one
// position, and its flags. A flag is allowed only when the reader asked for it (asked); a
// flags byte is present only when a flag is set.
func decodeReady(body []byte, asked byte) (width int, flags byte, err error) {
	if len(body) == 0 || body[0] != frameReady {
		return 0, 0, fmt.Errorf("%w: not a ready frame", errProtocol)
	}
	w, rest, ok := uvarint(body[1:])
	if !ok || w < 1 || w > MaxStepBytes/4 {
		return 0, 0, fmt.Errorf("%w: bad ready frame", errProtocol)
	}
	switch {
	case len(rest) == 0:
	case len(rest) == 1 && rest[0] != 0 && rest[0]&^asked == 0:
		flags = rest[0]
	default:
		return 0, 0, fmt.Errorf("%w: bad ready frame", errProtocol)
	}
	return int(w), flags, nil
}

// flagsOf is the ready flags a stage asks its next hop for, or answers with: timed and
// receipted as given.
func flagsOf(timed, receipted bool) byte {
	var f byte
	if timed {
		f |= flagTimed
	}
	if receipted {
		f |= flagReceipts
	}
	return f
}

// receiptsFrameMax bounds a receipts frame with k receipts: the type, the count (k ≤
// MaxStages, one byte) and k receipts of at most MaxReceipt bytes with their lengths.
func receiptsFrameMax(k int) int { return 2 + k*(binary.MaxVarintLen16+MaxReceipt) }

// encodeReceipts is a receipts frame: the count, then each receipt's length and bytes, in
// chain order ("" for a stage that has none).
func encodeReceipts(receipts []string) []byte {
	b := binary.AppendUvarint([]byte{frameReceipts}, uint64(len(receipts)))
	for _, r := range receipts {
		b = binary.AppendUvarint(b, uint64(len(r)))
		b = append(b, r...)
	}
	return b
}

// decodeReceipts decodes a receipts frame that must carry exactly k receipts, each at most
// MaxReceipt bytes. What a receipt says is not this package's to read: the head checks each
// against what it ran (WithReceipts).
func decodeReceipts(body []byte, k int) ([]string, error) {
	if len(body) == 0 || body[0] != frameReceipts {
		return nil, fmt.Errorf("%w: not a receipts frame", errProtocol)
	}
	count, rest, ok := uvarint(body[1:])
	if !ok || count != uint64(k) {
		return nil, fmt.Errorf("%w: receipts of %d stages, want %d", errProtocol, count, k)
	}
	out := make([]string, k)
	for i := range out {
		var n uint64
		if n, rest, ok = uvarint(rest); !ok || n > MaxReceipt || n > uint64(len(rest)) {
			return nil, fmt.Errorf("%w: bad receipt of stage %d", errProtocol, i)
		}
		out[i], rest = string(rest[:n]), rest[n:]
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the receipts", errProtocol, len(rest))
	}
	return out, nil
}

func encodeAttach(id [sessionIDLen]byte) []byte { return append([]byte{frameAttach}, id[:]...) }

func decodeAttach(body []byte) ([sessionIDLen]byte, error) {
	var id [sessionIDLen]byte
	if len(body) != 1+sessionIDLen || body[0] != frameAttach {
		return id, fmt.Errorf("%w: bad attach frame", errProtocol)
	}
	copy(id[:], body[1:])
	return id, nil
}

// wireError is an error frame's JSON: which stage failed, how, and a message for people.
type wireError struct {
	Stage   int    `json:"stage"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// stageFault is a failure as the chain passes it on: the stage it names, its code from
// inference's closed set, a message.
type stageFault struct {
	stage int
	code  inference.Code
	msg   string
}

func encodeError(f stageFault) []byte {
	b, _ := json.Marshal(wireError{Stage: f.stage, Code: string(f.code), Message: cutMessage(f.msg)})
	return append([]byte{frameError}, b...)
}

// cutMessage is msg as valid UTF-8 of at most maxErrorMessage bytes, cut on a rune.
func cutMessage(msg string) string {
	msg = strings.ToValidUTF8(msg, "?")
	if len(msg) <= maxErrorMessage {
		return msg
	}
	i := maxErrorMessage
	for i > 0 && !utf8.RuneStart(msg[i]) {
		i--
	}
	return msg[:i]
}

// decodeError decodes an error frame whose stage must be in [lo, hi): where the frame came
// from bounds whom it can blame. An unknown code reads as unavailable.
func decodeError(body []byte, lo, hi int) (stageFault, error) {
	if len(body) == 0 || body[0] != frameError || len(body) > MaxErrorFrame {
		return stageFault{}, fmt.Errorf("%w: not an error frame within its bound", errProtocol)
	}
	var we wireError
	if err := json.Unmarshal(body[1:], &we); err != nil {
		return stageFault{}, fmt.Errorf("%w: error frame: %v", errProtocol, err)
	}
	if we.Stage < lo || we.Stage >= hi || len(we.Message) > maxErrorMessage {
		return stageFault{}, fmt.Errorf("%w: error frame names stage %d, want [%d, %d)", errProtocol, we.Stage, lo, hi)
	}
	code, ok := inference.ParseCode(we.Code)
	if !ok {
		code = inference.CodeUnavailable
	}
	return stageFault{stage: we.Stage, code: code, msg: we.Message}, nil
}
