package stage

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// FuzzStageFrame: any bytes, read as a stage's stream under a session's bounds and decoded
// by each of the protocol's decoders, never panic nor read past the bound; whatever a
// decoder accepts stays within the protocol's bounds, and encodes back to the same frame
// (the binary frames byte for byte: one encoding per message) or to the same message (JSON).
func FuzzStageFrame(f *testing.F) {
	const width, batch = 4, 3
	p1, p2 := peer.ID("\x00\x24\x08\x01\x12\x20"+string(bytes.Repeat([]byte{7}, 32))), peer.ID("\x00\x24\x08\x01\x12\x20"+string(bytes.Repeat([]byte{9}, 32)))
	addr := ma.StringCast("/ip4/127.0.0.1/tcp/4001")
	o := &open{session: [sessionIDLen]byte{1, 2, 3}, head: p1, model: "m", maxPositions: 8, maxBatch: 3, index: 1,
		hops: []Hop{{Peer: p2, Lo: 2, Hi: 5}, {Peer: p1, Lo: 5, Hi: 9}}, addrs: [][]ma.Multiaddr{{addr}, nil}}
	timedOpen := *o
	timedOpen.timing = true
	relinked := *o
	relinked.moves, relinked.adopting, relinked.adopt, relinked.positions, relinked.loads = true, true, [sessionIDLen]byte{4}, 5, []bool{true, false}
	for _, seed := range [][]byte{
		appendHiddenFrame(nil, 0, 2, []float32{1, -2, 3.5, 0, 1e-40, 7, 8, -0}),
		appendHiddenFrame(nil, 300, 1, []float32{1, 2, 3, 4}),
		appendTimedFrame(nil, 0, 2, []time.Duration{0, 3 * time.Millisecond}, []float32{1, -2, 3.5, 0, 1e-40, 7, 8, -0}),
		appendTimedFrame(nil, 7, 3, []time.Duration{MaxStageTime}, make([]float32, 3*width)),
		frame.Append(nil, encodeReady(width, 0)),
		frame.Append(nil, encodeReady(width, flagTimed)),
		frame.Append(nil, encodeReady(width, flagTimed|flagReceipts)),
		frame.Append(nil, encodeReceipts([]string{"{\"a\":1}", "", "x"})),
		frame.Append(nil, encodeReceipts(nil)),
		frame.Append(nil, encodeAttach(o.session)),
		frame.Append(nil, encodeError(stageFault{stage: 2, code: inference.CodeTimeout, msg: "slow <3>"})),
		frame.Append(nil, encodeOpen(o)),
		frame.Append(nil, encodeOpen(&timedOpen)),
		frame.Append(nil, []byte{frameEnd}),
		frame.Append(nil, encodeOpen(&relinked)),
		frame.Append(nil, encodeLeaving(1)),
		frame.Append(nil, []byte{frameKeep}),
		frame.Append(nil, encodeSessionFrame(frameFetch, o.session)),
		frame.Append(nil, encodeSessionFrame(frameLoad, o.session)),
		appendKVFrame(nil, inference.KVRows{Pos: 0, N: 2, Data: make([]float32, kvLayers*2*2*width)}),
		appendKVFrame(nil, inference.KVRows{Pos: 3, N: 1, Data: []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}),
		{0x80, 0x00}, {0x05, 0x02, 0x80, 0x00, 0x01}, {},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		bound := max(stepFrameMax(width, batch), MaxOpenFrame, kvFrameMax)
		r := frame.NewReader(bytes.NewReader(data), bound)
		for {
			body, err := r.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, frame.ErrTooLarge) && !errors.Is(err, frame.ErrMalformed) {
					t.Fatalf("reader: %v", err)
				}
				return
			}
			if len(body) > bound {
				t.Fatalf("a %d-byte frame read under a %d-byte bound", len(body), bound)
			}
			checkHidden(t, body, width, batch)
			if w, flags, err := decodeReady(body, flagTimed|flagReceipts); err == nil && (w < 1 || !bytes.Equal(encodeReady(w, flags), body)) {
				t.Fatalf("ready %d (flags %b) from %x re-encodes to %x", w, flags, body, encodeReady(w, flags))
			}
			for _, asked := range []byte{0, flagTimed, flagReceipts} {
				if _, flags, err := decodeReady(body, asked); err == nil && flags&^asked != 0 {
					t.Fatalf("ready %x read with flags %b by a reader that asked for %b", body, flags, asked)
				}
			}
			checkReceipts(t, body)
			checkTimed(t, body, width, batch)
			if id, err := decodeAttach(body); err == nil && !bytes.Equal(encodeAttach(id), body) {
				t.Fatalf("attach %x re-encodes differently", body)
			}
			checkError(t, body)
			checkOpen(t, body)
			checkMoveFrames(t, body, width)
		}
	})
}

// checkReceipts: a receipts frame decodes only with its own count of receipts, each within
// MaxReceipt, and encodes back byte for byte.
func checkReceipts(t *testing.T, body []byte) {
	for k := range 4 {
		rs, err := decodeReceipts(body, k)
		if err != nil {
			continue
		}
		if len(rs) != k {
			t.Fatalf("receipts frame %x read as %d receipts, want %d", body, len(rs), k)
		}
		for _, r := range rs {
			if len(r) > MaxReceipt {
				t.Fatalf("a receipt of %d bytes accepted", len(r))
			}
		}
		if again := encodeReceipts(rs); !bytes.Equal(again, body) {
			t.Fatalf("receipts frame %x re-encodes to %x", body, again)
		}
		if len(body) > receiptsFrameMax(k) {
			t.Fatalf("a %d-byte receipts frame of %d receipts, over its bound %d", len(body), k, receiptsFrameMax(k))
		}
	}
}

func checkHidden(t *testing.T, body []byte, width, batch int) {
	step, n, h, err := decodeHidden(body, width, batch, nil)
	if err != nil {
		return
	}
	if n < 1 || n > batch || len(h) != n*width {
		t.Fatalf("hidden frame of %d positions, %d values (batch %d, width %d)", n, len(h), batch, width)
	}
	if re := appendHiddenFrame(nil, step, n, h); !bytes.Equal(re, frame.Append(nil, body)) {
		t.Fatalf("hidden frame %x re-encodes to %x", body, re)
	}
}

func checkTimed(t *testing.T, body []byte, width, batch int) {
	for k := range 3 {
		step, n, times, h, err := decodeTimed(body, width, batch, k, nil)
		if err != nil {
			continue
		}
		if n < 1 || n > batch || len(h) != n*width || len(times) != k {
			t.Fatalf("timed frame of %d positions, %d values, %d times (batch %d, width %d, %d stages)", n, len(h), len(times), batch, width, k)
		}
		for _, d := range times {
			if d < 0 || d > MaxStageTime {
				t.Fatalf("timed frame with a time of %v", d)
			}
		}
		if re := appendTimedFrame(nil, step, n, times, h); !bytes.Equal(re, frame.Append(nil, body)) {
			t.Fatalf("timed frame %x re-encodes to %x", body, re)
		}
	}
}

func checkError(t *testing.T, body []byte) {
	f, err := decodeError(body, headStage, MaxStages)
	if err != nil {
		return
	}
	if _, ok := inference.ParseCode(string(f.code)); !ok || f.stage < headStage || f.stage >= MaxStages || len(f.msg) > maxErrorMessage {
		t.Fatalf("error frame decoded to %+v", f)
	}
	re := encodeError(f)
	if len(re) > MaxErrorFrame {
		t.Fatalf("error frame re-encodes to %d bytes, over its bound", len(re))
	}
	if back, err := decodeError(re, headStage, MaxStages); err != nil || back.stage != f.stage || back.code != f.code {
		t.Fatalf("error %+v re-decodes to %+v, %v", f, back, err)
	}
}

func checkOpen(t *testing.T, body []byte) {
	o, err := decodeOpen(body)
	if err != nil {
		return
	}
	if len(o.hops) < 1 || o.index < 0 || o.stages() > MaxStages || o.maxBatch < 1 || o.maxBatch > o.maxPositions || len(o.addrs) != len(o.hops) {
		t.Fatalf("open decoded out of bounds: %+v", o)
	}
	for i, h := range o.hops {
		if h.Lo < 0 || h.Hi <= h.Lo || i > 0 && h.Lo != o.hops[i-1].Hi || len(o.addrs[i]) > MaxAddrsPerHop {
			t.Fatalf("open's hop %d out of bounds: %+v", i, h)
		}
	}
	back, err := decodeOpen(encodeOpen(o))
	if err != nil {
		t.Fatalf("open %+v re-encodes to a frame that does not decode: %v", o, err)
	}
	if !reflect.DeepEqual(nilEmpty(o), nilEmpty(back)) {
		t.Fatalf("open changed in a round trip:\n%+v\n%+v", o, back)
	}
}

// kvLayers is the layer count FuzzStageFrame reads kv frames with.
const kvLayers = 2

// checkMoveFrames: the frames of moves decode only within their bounds (a leaving frame's
// stage in its range; a kv frame's position the expected one, its positions within
// kvPerFrame and exactly their values) and encode back byte for byte.
func checkMoveFrames(t *testing.T, body []byte, width int) {
	if i, err := decodeLeaving(body, 0, 3); err == nil && (i < 0 || i >= 3 || !bytes.Equal(encodeLeaving(i), body)) {
		t.Fatalf("leaving %x read as stage %d", body, i)
	}
	for _, typ := range []byte{frameFetch, frameLoad} {
		if id, err := decodeSessionFrame(body, typ); err == nil && !bytes.Equal(encodeSessionFrame(typ, id), body) {
			t.Fatalf("session frame %x re-encodes differently", body)
		}
	}
	for _, pos := range []int{0, 3} {
		r, err := decodeKV(body, width, kvLayers, pos, nil)
		if err != nil {
			continue
		}
		if r.Pos != pos || r.N < 1 || r.N > kvPerFrame(width, kvLayers) || len(r.Data) != kvLayers*2*r.N*width {
			t.Fatalf("kv frame %x read as %d positions at %d with %d values", body, r.N, r.Pos, len(r.Data))
		}
		if re := appendKVFrame(nil, r); !bytes.Equal(re, frame.Append(nil, body)) {
			t.Fatalf("kv frame %x re-encodes to %x", body, re)
		}
	}
}

// nilEmpty is o with empty address lists as nil, which JSON does not tell apart.
func nilEmpty(o *open) *open {
	c := *o
	c.addrs = nil
	if !slices.Contains(c.loads, true) {
		c.loads = nil // all false: the same as none
	}
	for _, a := range o.addrs {
		if len(a) == 0 {
			a = nil
		}
		c.addrs = append(c.addrs, a)
	}
	return &c
}
