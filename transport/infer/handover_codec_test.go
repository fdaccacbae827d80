package infer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// kvRows is a run of n positions from pos of a model of shape s, with values that tell
// positions, layers and halves apart.
func kvRows(s inference.ModelShape, pos, n int) inference.KVRows {
	r := inference.KVRows{Pos: pos, N: n, Data: make([]float32, inference.KVValues(s, n))}
	for i := range r.Data {
		r.Data[i] = float32(pos) + float32(i)/1024
	}
	return r
}

var tinyShape = inference.ModelShape{Layers: 2, Width: 64, Context: 512}

// kvFrame is a kv frame's body with the given header and value bytes.
func kvFrame(pos, n uint64, values []byte) []byte {
	b := binary.AppendUvarint([]byte{frameKV}, pos)
	b = binary.AppendUvarint(b, n)
	return append(b, values...)
}

func TestKVFrame(t *testing.T) {
	odd := inference.KVRows{Pos: 7, N: 1, Data: []float32{float32(math.Inf(-1)), -0, math.MaxFloat32, 1e-45}}
	for _, r := range []inference.KVRows{kvRows(tinyShape, 0, 1), kvRows(tinyShape, 300, 12), odd} {
		body := appendKV(nil, r)
		got, err := decodeKV(body, nil)
		if err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("rows at %d of %d: decoded %+v, %v", r.Pos, r.N, got.Pos, err)
		}
		if whole := appendKVFrame([]byte("x"), r); !bytes.Equal(whole, frame.Append([]byte("x"), body)) {
			t.Fatalf("rows at %d of %d: the frame built in place differs from frame.Append of the body", r.Pos, r.N)
		}
	}
	// The largest run fits MaxKVFrame, with its header.
	most := inference.KVRows{Pos: 1 << 30, N: 1 << 10, Data: make([]float32, inference.MaxKVRowsBytes/4)}
	if err := checkKV(most); err != nil {
		t.Fatal(err)
	}
	if n := len(frame.Append(nil, appendKV(nil, most))); n > MaxKVFrame+binary.MaxVarintLen64 || len(appendKV(nil, most)) > MaxKVFrame {
		t.Fatalf("the largest kv frame is %d bytes, bound %d", n, MaxKVFrame)
	}
	tests := []struct {
		name string
		body []byte
	}{
		{"no header", []byte{frameKV}},
		{"no count", binary.AppendUvarint([]byte{frameKV}, 3)},
		{"no values", kvFrame(0, 1, nil)},
		{"values not whole float32", kvFrame(0, 1, make([]byte, 10))},
		{"zero positions", kvFrame(0, 0, make([]byte, 8))},
		{"values not whole rows", kvFrame(0, 2, make([]byte, 4*6))},
		{"position past the bound", kvFrame(1<<31, 1, make([]byte, 8))},
		{"count past the bound", kvFrame(0, 1<<40, make([]byte, 8))},
		{"past the bound together", kvFrame(1<<31-1, 2, make([]byte, 16))},
		{"values over MaxKVRowsBytes", kvFrame(0, 1, make([]byte, inference.MaxKVRowsBytes+8))},
		{"another frame type", appendKV(nil, odd)[1:]},
	}
	for _, tt := range tests {
		if r, err := decodeKV(tt.body, nil); !errors.Is(err, errProtocol) {
			t.Errorf("%s: decoded %d positions at %d, %v; want a protocol error", tt.name, r.N, r.Pos, err)
		}
	}
}

func TestMovedFrame(t *testing.T) {
	m := &inference.Moved{Positions: 40, Tokens: 12}
	if got, err := decodeMoved(encodeMoved(m)); err != nil || *got != *m {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, m)
	}
	for _, body := range [][]byte{
		append([]byte{frameMoved}, `{"positions":-1,"tokens":2}`...),
		append([]byte{frameMoved}, `{"positions":1,"tokens":4294967296}`...),
		append([]byte{frameMoved}, `[]`...),
		append([]byte{frameDone}, `{"positions":1,"tokens":2}`...),
		{},
	} {
		if got, err := decodeMoved(body); !errors.Is(err, errProtocol) {
			t.Errorf("%q: decoded %+v, %v; want a protocol error", body, got, err)
		}
	}
}

func TestReadyFrame(t *testing.T) {
	s := inference.ModelShape{Layers: 4, Width: 256, Context: 1024, Params: 4458752, KVBytesPerToken: 8192}
	if got, err := decodeReady(encodeReady(s)); err != nil || got != s {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, s)
	}
	for _, bad := range []inference.ModelShape{
		{Layers: 0, Width: 8, Context: 8},
		{Layers: 1, Width: -8, Context: 8},
		{Layers: 1, Width: 8, Context: 0},
		{Layers: 1 << 25, Width: 8, Context: 8},
		{Layers: 512, Width: 1024, Context: 8}, // one position is 4 MiB: no kv frame holds it
	} {
		if got, err := decodeReady(encodeReady(bad)); !errors.Is(err, errProtocol) {
			t.Errorf("%+v: decoded %+v, %v; want a protocol error", bad, got, err)
		}
	}
	if _, err := decodeReady(append([]byte{frameReady}, "{"...)); !errors.Is(err, errProtocol) {
		t.Errorf("a ready frame that does not decode: %v", err)
	}
}

func TestGoFrame(t *testing.T) {
	for _, replay := range [][]int{nil, {}, {0, 5, 2047}} {
		body, err := encodeGo(replay)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeGo(body)
		if err != nil || !slices.Equal(got, replay) {
			t.Fatalf("%v: decoded %v, %v", replay, got, err)
		}
	}
	long := make([]int, MaxRequestFrame/2)
	if _, err := encodeGo(long); inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Fatalf("a replay over the frame bound: %v, want invalid_request", err)
	}
	if _, err := decodeGo(append([]byte{frameGo}, make([]byte, MaxRequestFrame)...)); !errors.Is(err, frame.ErrTooLarge) {
		t.Fatalf("a go frame over MaxRequestFrame: %v", err)
	}
	for _, body := range [][]byte{append([]byte{frameGo}, `{"replay":"x"}`...), {frameKV}, {}} {
		if _, err := decodeGo(body); !errors.Is(err, errProtocol) {
			t.Errorf("%q: %v, want a protocol error", body, err)
		}
	}
	req := request(8)
	for _, tt := range []struct {
		replay []int
		ok     bool
	}{{nil, true}, {[]int{1, 2, 3}, true}, {[]int{1, -2}, false}, {make([]int, 8), false}} {
		if err := checkReplay(req, tt.replay); (err == nil) != tt.ok || err != nil && inference.CodeOf(err) != inference.CodeInvalidRequest {
			t.Errorf("replay %v for max_tokens 8: %v", tt.replay, err)
		}
	}
}

// A request frame carries handover and resume; a resumption's with a replay is refused.
func TestRequestFrameHandoverFlags(t *testing.T) {
	req := request(8)
	req.Move = &inference.Move{}
	body, err := EncodeRequest(req, true)
	if err != nil {
		t.Fatal(err)
	}
	got, o, err := decodeRequest(body)
	if err != nil || o != (requestOpts{receipt: true, handover: true}) || got.Move != nil {
		t.Fatalf("decoded %+v, %v (Move %v); want receipt and handover, no Move", o, err, got.Move)
	}
	req.Move, req.Replay = nil, []int{4}
	if body, err = encodeRequestOpts(req, requestOpts{resume: true}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := decodeRequest(body); !errors.Is(err, errProtocol) {
		t.Fatalf("a resumption's request with a replay: %v, want a protocol error", err)
	}
}
