package bwprobe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/meshinfer/meshinfer/inference"
)

// ID is the protocol ID of the bandwidth probe.
const ID = protocol.ID("/meshinfer/bwprobe/1.0.0")

// ServiceName is the resource manager service the probe's streams are accounted to.
const ServiceName = "meshinfer.bwprobe"

// Sizes, limits and timeouts (see the package doc).
const (
	// MaxProbeBytes bounds one probe's payload, both ways together: 1 MiB, enough for a
	// transfer of tens of milliseconds on a 100 Mbit/s path, little for a metered one.
	MaxProbeBytes = 1 << 20
	// DefaultProbeBytes is what a Client sends each way: half of MaxProbeBytes.
	DefaultProbeBytes = MaxProbeBytes / 2
	// MaxRequestFrame bounds a request frame: the type and two varints.
	MaxRequestFrame = 1 + 2*binary.MaxVarintLen64
	// MaxAnswerFrame bounds an answer frame: the type and an error code (the longest is
	// 20 bytes).
	MaxAnswerFrame = 64
	// RequestTimeout bounds the server's wait for the request frame (slowloris).
	RequestTimeout = 5 * time.Second
	// ProbeTimeout bounds a whole exchange, at both ends: 1 MiB at 300 kbit/s.
	ProbeTimeout = 30 * time.Second
	// ServeInterval is the least time between the starts of two probes a server answers
	// for one peer: an honest client probes a peer once every ProbeInterval.
	ServeInterval = 10 * time.Second
	// MaxServing bounds the probes a server answers at once.
	MaxServing = 4
	// ProbeInterval is the least time between two probes of one peer by a Client.
	ProbeInterval = time.Minute
	// ProbeBurst probes at most start in any ProbeWindow, whichever peers they go to.
	ProbeBurst  = 4
	ProbeWindow = time.Minute
	// FreshFor is how old a sample may be for Measure not to probe: one half-life of the
	// estimates (internal/bandwidth.HalfLife).
	FreshFor = 2 * time.Minute
	// maxPeersRemembered bounds the per-peer times a limiter keeps: peers whose interval is
	// over are forgotten first.
	maxPeersRemembered = 1024
	// chunk is the size of the payload reads and writes.
	chunk = 32 << 10
)

// Frame types.
const (
	frameRequest  byte = 0x01
	frameAccept   byte = 0x02
	frameRefuse   byte = 0x03
	frameReceived byte = 0x04
)

var errProtocol = errors.New("bwprobe protocol violation")

// encodeRequest is a request frame's body.
func encodeRequest(up, down uint64) []byte {
	b := []byte{frameRequest}
	b = binary.AppendUvarint(b, up)
	return binary.AppendUvarint(b, down)
}

// decodeRequest reads a request frame's body: the bytes each way, as asked (their bounds
// are the server's to check). Anything but a request frame of two minimal varints is
// errProtocol.
func decodeRequest(b []byte) (up, down uint64, err error) {
	if len(b) == 0 || b[0] != frameRequest {
		return 0, 0, fmt.Errorf("%w: not a request frame", errProtocol)
	}
	rest := b[1:]
	var v [2]uint64
	for i := range v {
		x, n := binary.Uvarint(rest)
		if n <= 0 || n != uvarintLen(x) {
			return 0, 0, fmt.Errorf("%w: bad or non-minimal varint", errProtocol)
		}
		v[i], rest = x, rest[n:]
	}
	if len(rest) != 0 {
		return 0, 0, fmt.Errorf("%w: %d bytes after the request", errProtocol, len(rest))
	}
	return v[0], v[1], nil
}

// withinBounds reports whether a probe of up and down bytes is one a server answers.
func withinBounds(up, down uint64) bool {
	return up <= MaxProbeBytes && down <= MaxProbeBytes && up+down <= MaxProbeBytes
}

// uvarintLen is the length of x's minimal encoding.
func uvarintLen(x uint64) int { return len(binary.AppendUvarint(nil, x)) }

// encodeRefuse is a refusal's body.
func encodeRefuse(code inference.Code) []byte { return append([]byte{frameRefuse}, code...) }

// decodeAnswer reads the server's answer to a request: nil for accept, the refusal as an
// *inference.Error (unknown codes read as unavailable), errProtocol for anything else.
func decodeAnswer(b []byte) error {
	switch {
	case len(b) == 1 && b[0] == frameAccept:
		return nil
	case len(b) > 1 && b[0] == frameRefuse:
		code, ok := inference.ParseCode(string(b[1:]))
		if !ok {
			code = inference.CodeUnavailable
		}
		return inference.Errorf(code, "probe refused: %s", code)
	}
	return fmt.Errorf("%w: not an answer to a request", errProtocol)
}
