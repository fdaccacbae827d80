package stage

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// Moving a stage (doc.go, "Moves"): the frames, their bounds and the defaults.

const (
	// DefaultHandOverGrace bounds how long a stage that leaves (Server.HandOver) keeps
	// serving a session after its leaving notice: the head re-links the chain at its next
	// step, within a decode step and a set-up (OpenTimeout) of the replacement; 10 s is
	// what a drain waits (node.DefaultDrainTimeout). Past it the session ends with
	// shutting_down, as it would have without the notice, and the head replays.
	DefaultHandOverGrace = 10 * time.Second
	// DefaultKeepTimeout bounds how long a stage keeps a session that a keep end closed,
	// for the head's re-linked chain to adopt or its fetch to read: the head opens that
	// chain at once, and its set-up waits at most OpenTimeout at each stage; twice that
	// leaves room for the replacement's load. A kept session not taken by then is freed.
	DefaultKeepTimeout = 2 * OpenTimeout
	// MaxKVFrame bounds the KV values of one kv frame (bytes): 8 MiB, as a step's hidden
	// states (MaxStepBytes), is 42 positions of synth-large's 16 layers. A stage whose one
	// position's rows do not fit takes part in no move.
	MaxKVFrame = 8 << 20
	// maxKVHeader bounds a kv frame's header: its type and two uvarints.
	maxKVHeader = 1 + 2*binary.MaxVarintLen64
	// MaxMoveBytes bounds the rows one move carries (bytes), whatever the chain says:
	// 1 GiB is the whole of synth-large's KV cache at its context ten times over. A head
	// moves no stage whose rows would pass it.
	MaxMoveBytes = 1 << 30
)

// rowBytes is the bytes of one position's KV rows of layers layers of the given width:
// keys and values.
func rowBytes(width, layers int) int { return layers * 2 * width * 4 }

// kvPerFrame is how many positions a kv frame of layers layers carries at most, 0 when one
// position's rows do not fit MaxKVFrame.
func kvPerFrame(width, layers int) int { return MaxKVFrame / rowBytes(width, layers) }

// kvFrameMax bounds a kv frame.
const kvFrameMax = maxKVHeader + MaxKVFrame

// encodeLeaving is a leaving frame naming stage.
func encodeLeaving(stage int) []byte {
	return binary.AppendUvarint([]byte{frameLeaving}, uint64(stage))
}

// decodeLeaving decodes a leaving frame, whose stage must be in [lo, hi): a stage passes
// on only the notices of stages before it.
func decodeLeaving(body []byte, lo, hi int) (int, error) {
	if len(body) < 2 || body[0] != frameLeaving {
		return 0, fmt.Errorf("%w: not a leaving frame", errProtocol)
	}
	st, rest, ok := uvarint(body[1:])
	if !ok || len(rest) != 0 || st < uint64(lo) || st >= uint64(hi) {
		return 0, fmt.Errorf("%w: leaving frame of stage %d, want [%d, %d)", errProtocol, st, lo, hi)
	}
	return int(st), nil
}

// encodeSessionFrame is a fetch or load frame: its type and the session ID.
func encodeSessionFrame(typ byte, id [sessionIDLen]byte) []byte { return append([]byte{typ}, id[:]...) }

// decodeSessionFrame decodes a frame of type typ that carries a session ID alone (attach,
// fetch, load).
func decodeSessionFrame(body []byte, typ byte) ([sessionIDLen]byte, error) {
	var id [sessionIDLen]byte
	if len(body) != 1+sessionIDLen || body[0] != typ {
		return id, fmt.Errorf("%w: bad frame of type %#x", errProtocol, typ)
	}
	copy(id[:], body[1:])
	return id, nil
}

// appendKVFrame appends a whole kv frame, length prefix included, to dst: rows r.
func appendKVFrame(dst []byte, r inference.KVRows) []byte {
	body := 1 + frame.UvarintLen(uint64(r.Pos)) + frame.UvarintLen(uint64(r.N)) + 4*len(r.Data)
	dst = slices.Grow(dst, binary.MaxVarintLen64+body)
	dst = binary.AppendUvarint(dst, uint64(body))
	dst = append(dst, frameKV)
	dst = binary.AppendUvarint(dst, uint64(r.Pos))
	dst = binary.AppendUvarint(dst, uint64(r.N))
	for _, v := range r.Data {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// decodeKV decodes a kv frame of rows of layers layers of the given width, that must start
// at position pos: at least one position, at most kvPerFrame, and exactly their values,
// into dst when it has room.
func decodeKV(body []byte, width, layers, pos int, dst []float32) (inference.KVRows, error) {
	if len(body) == 0 || body[0] != frameKV {
		return inference.KVRows{}, fmt.Errorf("%w: not a kv frame", errProtocol)
	}
	p, rest, ok := uvarint(body[1:])
	if !ok || p != uint64(pos) {
		return inference.KVRows{}, fmt.Errorf("%w: kv rows not at position %d", errProtocol, pos)
	}
	n, rest, ok := uvarint(rest)
	if !ok || n < 1 || n > uint64(kvPerFrame(width, layers)) || len(rest) != int(n)*rowBytes(width, layers) {
		return inference.KVRows{}, fmt.Errorf("%w: kv frame of %d bytes for %d positions of %d layers, width %d", errProtocol, len(rest), n, layers, width)
	}
	return inference.KVRows{Pos: pos, N: int(n), Data: readStates(rest, len(rest)/4, dst)}, nil
}
