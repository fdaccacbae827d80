package webrtc

import (
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/meshinfer/meshinfer/internal/frame"
)

// SignalID is the protocol ID of WebRTC signaling between two nodes.
const SignalID = protocol.ID("/meshinfer/webrtc-signal/1.0.0")

// Signaling bounds.
const (
	// MaxSDP bounds an offer or answer, in bytes. pion's data-channel-only SDP is under
	// 1 KiB and a browser's with every fingerprint and extension stays under 8 KiB; 16 KiB
	// leaves room without letting a peer make us buffer much.
	MaxSDP = 16 << 10
	// MaxCandidate bounds one candidate line, in bytes; a real one is 60 to 200.
	MaxCandidate = 1 << 10
	// MaxCandidates bounds the candidates one side sends, trickled and embedded in its
	// description together: one host candidate per interface address and network type plus
	// reflexive and relay ones; 32 covers a multi-homed host with IPv4 and IPv6, and bounds
	// the ICE checks a peer can make us run (the addresses it can make us send to).
	MaxCandidates = 32
	// MaxIncomingSetups bounds the set-ups this node answers at once: each holds a
	// PeerConnection (UDP sockets, a DTLS certificate, goroutines) for up to ConnectTimeout.
	// One peer holds at most one of them over SignalID, and a relaying peer at most
	// maxRelayedPerRelay relayed ones.
	MaxIncomingSetups = 16
	// maxSignalFrame is the largest signaling frame: a description and its type byte.
	maxSignalFrame = 1 + MaxSDP
)

// Signaling message types: the first byte of every frame.
const (
	sigOffer     byte = 0x01
	sigAnswer    byte = 0x02
	sigCandidate byte = 0x03
	sigEnd       byte = 0x04
)

var errSignalMessage = errors.New("bad signaling message")

// sigMsg is one decoded signaling message.
type sigMsg struct {
	typ  byte
	text string // the SDP or the candidate line; empty for end
}

func encodeSignal(typ byte, text string) []byte {
	return append([]byte{typ}, text...)
}

// decodeSignal checks a frame's body against the bounds of its type.
func decodeSignal(body []byte) (sigMsg, error) {
	if len(body) == 0 {
		return sigMsg{}, fmt.Errorf("%w: empty frame", errSignalMessage)
	}
	m := sigMsg{typ: body[0], text: string(body[1:])}
	var limit int
	switch m.typ {
	case sigOffer, sigAnswer:
		limit = MaxSDP
	case sigCandidate:
		limit = MaxCandidate
	case sigEnd:
		if len(m.text) != 0 {
			return sigMsg{}, fmt.Errorf("%w: end with a body", errSignalMessage)
		}
		return m, nil
	default:
		return sigMsg{}, fmt.Errorf("%w: type %#x", errSignalMessage, m.typ)
	}
	switch {
	case len(m.text) == 0:
		return sigMsg{}, fmt.Errorf("%w: type %#x empty", errSignalMessage, m.typ)
	case len(m.text) > limit:
		return sigMsg{}, fmt.Errorf("%w: type %#x of %d bytes, max %d", errSignalMessage, m.typ, len(m.text), limit)
	case !utf8.ValidString(m.text):
		return sigMsg{}, fmt.Errorf("%w: type %#x not UTF-8", errSignalMessage, m.typ)
	}
	return m, nil
}

// frameSource yields the bodies of signaling frames: a frame.Reader, or a signalReader.
type frameSource interface {
	Next() ([]byte, error)
}

// newSignalReader returns the frame reader of a signaling exchange on st: a buffered
// frame.Reader, or for a relayed exchange, whose stream goes back to its caller, a
// signalReader.
func newSignalReader(st io.Reader, relayed bool) frameSource {
	if relayed {
		return &signalReader{r: st, max: maxSignalFrame}
	}
	return frame.NewReader(st, maxSignalFrame)
}

// signalReader reads frames as frame.Reader does (same bounds, same errors) but never
// reads a byte past the frame it returns (frame.ReadOne). A relayed exchange hands its
// stream back to the caller after the remote's end, and frame.Reader's buffer could hold
// what the remote sent next. The cost, a read call per length byte (at most three for a
// signaling frame), is nothing for a dozen frames.
type signalReader struct {
	r   io.Reader
	max int
}

// Next returns the next frame's body: io.EOF at a clean end of stream,
// io.ErrUnexpectedEOF inside a frame, frame.ErrTooLarge or frame.ErrMalformed for a bad
// length.
func (sr *signalReader) Next() ([]byte, error) { return frame.ReadOne(sr.r, sr.max) }
