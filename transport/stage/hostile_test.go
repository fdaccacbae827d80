package stage

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/reputation"
)

// observed is an Observer that keeps what it is told, as "peer event".
type observed struct {
	mu  sync.Mutex
	got []string
}

func (o *observed) Observe(p string, e reputation.Event, _ time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, p+" "+e.String())
}

func (o *observed) events() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.got)
}

// rawHead is a head that speaks the protocol's frames itself, on a one-stage chain.
type rawHead struct {
	h       host.Host
	id      [sessionIDLen]byte
	up, ret network.Stream
}

// openRaw sets up a session of layers [0, layers) at n by hand: the open frame and its
// ready on one stream, the attach and its ready on another.
func openRaw(t *testing.T, n *stageNode, layers, width, maxPositions, batch int) *rawHead {
	t.Helper()
	r := &rawHead{h: newHost(t)}
	know(r.h, n.h)
	rand.Read(r.id[:])
	o := &open{session: r.id, head: r.h.ID(), model: arithModel, maxPositions: maxPositions, maxBatch: batch,
		hops: []Hop{{Peer: n.h.ID(), Lo: 0, Hi: layers}}}
	var err error
	if r.up, err = r.h.NewStream(t.Context(), n.h.ID(), ID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.up.Reset() })
	r.ready(t, r.up, encodeOpen(o), width)
	if r.ret, err = r.h.NewStream(t.Context(), n.h.ID(), ID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ret.Reset() })
	r.ready(t, r.ret, encodeAttach(r.id), width)
	return r
}

// ready writes body on st and reads a ready frame of width back.
func (r *rawHead) ready(t *testing.T, st network.Stream, body []byte, width int) {
	t.Helper()
	if err := frame.Write(st, body); err != nil {
		t.Fatal(err)
	}
	got, err := frame.ReadOne(st, MaxErrorFrame)
	if err != nil {
		t.Fatal(err)
	}
	if w, _, err := decodeReady(got, 0); err != nil || w != width {
		t.Fatalf("answer %q: width %d, %v; want ready with %d", got, w, err, width)
	}
}

// hiddenBody is a hidden frame's body with the given header and values.
func hiddenBody(step, n uint64, values int) []byte {
	b := binary.AppendUvarint([]byte{frameHidden}, step)
	b = binary.AppendUvarint(b, n)
	return append(b, make([]byte, 4*values)...)
}

// A head (or previous hop) that sends a frame over the session's bound, malformed, out of
// place or out of order has its stream reset, is recorded, and the session ends: freed,
// with peer_lost passed on (forward, here on the return stream) naming the head.
func TestStageRejectsBadFrames(t *testing.T) {
	const layers, width, batch = 2, 8, 4
	// The stage reads its previous hop's frames up to the larger of the hidden frames' and
	// the error frames' bounds; each type's own bound is checked as it is decoded.
	bound := max(stepFrameMax(width, batch), MaxErrorFrame)
	tests := []struct {
		name  string
		wire  []byte // what the head writes, length prefixes included
		event reputation.Event
	}{
		{"over the frame bound", binary.AppendUvarint(nil, uint64(bound+1)), reputation.MalformedFrame},
		{"non-minimal length", []byte{0x80, 0x00}, reputation.MalformedFrame},
		{"empty frame", frame.Append(nil, nil), reputation.ProtocolViolation},
		{"unknown type", frame.Append(nil, []byte{0x09, 0, 1}), reputation.ProtocolViolation},
		{"no positions", frame.Append(nil, hiddenBody(0, 0, 0)), reputation.ProtocolViolation},
		{"more positions than the batch", frame.Append(nil, hiddenBody(0, batch+1, width)), reputation.ProtocolViolation},
		{"values short of the positions", frame.Append(nil, hiddenBody(0, 2, 2*width-1)), reputation.ProtocolViolation},
		{"values past the positions", frame.Append(nil, hiddenBody(0, 1, width+1)), reputation.ProtocolViolation},
		{"step out of order", frame.Append(nil, hiddenBody(1, 1, width)), reputation.ProtocolViolation},
		{"non-minimal step", frame.Append(nil, append([]byte{frameHidden, 0x80, 0x00, 1}, make([]byte, 4*width)...)), reputation.ProtocolViolation},
		{"a backward frame forward", frame.Append(nil, encodeReady(width, 0)), reputation.ProtocolViolation},
		{"an error blaming a later stage", frame.Append(nil, encodeError(stageFault{stage: 0, code: inference.CodeTimeout})), reputation.ProtocolViolation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen observed
			n := newStage(t, newArith(layers, width, 1), WithServerObserver(&seen))
			r := openRaw(t, n, layers, width, 16, batch)
			if _, err := r.up.Write(tt.wire); err != nil {
				t.Fatal(err)
			}
			// The stage passes the failure on (forward: on the return stream), then resets
			// the offending stream.
			body, err := frame.ReadOne(r.ret, MaxErrorFrame)
			if err != nil {
				t.Fatal(err)
			}
			f, err := decodeError(body, headStage, 1)
			if err != nil || f.code != inference.CodePeerLost || f.stage != headStage {
				t.Fatalf("return stream got %+v (%v), want peer_lost naming the head", f, err)
			}
			if _, err := r.up.Read(make([]byte, 1)); !errors.Is(err, network.ErrReset) {
				t.Fatalf("read on the offending stream: %v, want a reset", err)
			}
			if e := n.freed(t, string(inference.CodePeerLost)); e.Failed != headStage {
				t.Fatalf("session ended blaming stage %d, want the head", e.Failed)
			}
			want := r.h.ID().String() + " " + tt.event.String()
			if got := seen.events(); len(got) != 1 || got[0] != want {
				t.Fatalf("observed %q, want %q", got, want)
			}
			if n.srv.Stats().ProtocolErrors != 1 {
				t.Fatalf("protocol errors %d, want 1", n.srv.Stats().ProtocolErrors)
			}
		})
	}
}

// A first frame that is neither open nor attach, or an open frame that does not decode,
// resets the stream and is recorded; nothing is admitted.
func TestStageRejectsBadFirstFrames(t *testing.T) {
	tests := []struct {
		name  string
		wire  []byte
		event reputation.Event
	}{
		{"over the open bound", binary.AppendUvarint(nil, MaxOpenFrame+1), reputation.MalformedFrame},
		{"a hidden frame first", frame.Append(nil, hiddenBody(0, 1, 8)), reputation.ProtocolViolation},
		{"open that is not JSON", frame.Append(nil, []byte{frameOpen, '{'}), reputation.ProtocolViolation},
		{"open with a gap in the layers", frame.Append(nil, append([]byte{frameOpen}, `{"session":"00000000000000000000000000000000","head":"12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq","model":"arith","max_positions":4,"max_batch":4,"index":0,"hops":[{"peer":"12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq","lo":0,"hi":1},{"peer":"12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq","lo":2,"hi":3}]}`...)), reputation.ProtocolViolation},
		{"attach of the wrong length", frame.Append(nil, []byte{frameAttach, 1, 2}), reputation.ProtocolViolation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen observed
			n := newStage(t, newArith(2, 8, 1), WithServerObserver(&seen))
			h := newHost(t)
			know(h, n.h)
			st, err := h.NewStream(t.Context(), n.h.ID(), ID)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Reset()
			if _, err := st.Write(tt.wire); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Read(make([]byte, 1)); !errors.Is(err, network.ErrReset) {
				t.Fatalf("read: %v, want a reset", err)
			}
			want := h.ID().String() + " " + tt.event.String()
			if got := seen.events(); len(got) != 1 || got[0] != want {
				t.Fatalf("observed %q, want %q", got, want)
			}
			if n.srv.Sessions() != 0 || n.be.sessions() != 0 {
				t.Fatal("a session was admitted")
			}
		})
	}
}

// Only the head named in the open frame can attach its return stream: another peer that
// learnt the session ID is answered unavailable, and the head attaches after it.
func TestOnlyTheHeadAttaches(t *testing.T) {
	const layers, width = 2, 8
	n := newStage(t, newArith(layers, width, 1))
	r := &rawHead{h: newHost(t)}
	know(r.h, n.h)
	rand.Read(r.id[:])
	o := &open{session: r.id, head: r.h.ID(), model: arithModel, maxPositions: 8, maxBatch: 8,
		hops: []Hop{{Peer: n.h.ID(), Lo: 0, Hi: layers}}}
	var err error
	if r.up, err = r.h.NewStream(t.Context(), n.h.ID(), ID); err != nil {
		t.Fatal(err)
	}
	defer r.up.Reset()
	r.ready(t, r.up, encodeOpen(o), width)

	intruder := newHost(t)
	know(intruder, n.h)
	st, err := intruder.NewStream(t.Context(), n.h.ID(), ID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Reset()
	if err := frame.Write(st, encodeAttach(r.id)); err != nil {
		t.Fatal(err)
	}
	body, err := frame.ReadOne(st, MaxErrorFrame)
	if err != nil {
		t.Fatal(err)
	}
	if f, err := decodeError(body, headStage, 1); err != nil || f.code != inference.CodeUnavailable {
		t.Fatalf("the intruder's attach got %q (%v), want unavailable", body, err)
	}

	if r.ret, err = r.h.NewStream(t.Context(), n.h.ID(), ID); err != nil {
		t.Fatal(err)
	}
	defer r.ret.Reset()
	r.ready(t, r.ret, encodeAttach(r.id), width)
	// One step goes through: the session is the head's.
	in := promptStates(1, width)
	if _, err := r.up.Write(appendHiddenFrame(nil, 0, 1, in)); err != nil {
		t.Fatal(err)
	}
	out, err := frame.ReadOne(r.ret, stepFrameMax(width, 8))
	if err != nil {
		t.Fatal(err)
	}
	if _, got, _, err := decodeHidden(out, width, 8, nil); err != nil || got != 1 {
		t.Fatalf("output %d positions, %v", got, err)
	}
}

// fakeStage is a one-stage chain's stage that sets up as the protocol says and answers
// the first step with what answer returns for it (whole frames, length included), on the
// return stream (back) or on the head's stream to it (up).
func fakeStage(t *testing.T, width int, answer func(step []byte) (back, up []byte)) host.Host {
	t.Helper()
	return fakeChainStage(t, width, 0, 0, answer)
}

// fakeChainStage is fakeStage answering the open's and the attach's ready with the given
// flags.
func fakeChainStage(t *testing.T, width int, openFlags, attachFlags byte, answer func(step []byte) (back, up []byte)) host.Host {
	t.Helper()
	return fakeHost(t, width, openFlags, attachFlags, func(up, ret network.Stream) {
		step, err := frame.ReadOne(up, 1<<20)
		if err != nil {
			return
		}
		back, toUp := answer(step)
		ret.Write(back)
		up.Write(toUp)
		up.Read(make([]byte, 1)) // until the head resets it
	})
}

// fakeHost is a one-stage chain's stage that sets up as the protocol says, answering the
// open's and the attach's ready with the given flags, then runs serve on the head's stream
// to it (up) and the head's return stream, and resets both when serve returns.
func fakeHost(t *testing.T, width int, openFlags, attachFlags byte, serve func(up, ret network.Stream)) host.Host {
	t.Helper()
	h := newHost(t)
	rets := make(chan network.Stream, 1)
	h.SetStreamHandler(ID, func(st network.Stream) {
		body, err := frame.ReadOne(st, MaxOpenFrame)
		if err != nil || len(body) == 0 {
			st.Reset()
			return
		}
		if body[0] == frameAttach {
			frame.Write(st, encodeReady(width, attachFlags))
			rets <- st
			return
		}
		frame.Write(st, encodeReady(width, openFlags))
		var ret network.Stream
		select {
		case ret = <-rets: // the head attaches before it sends a step
		case <-t.Context().Done():
			st.Reset()
			return
		}
		defer ret.Reset()
		defer st.Reset()
		serve(st, ret)
	})
	return h
}

// A head believes no more than the step it sent: output of another step or size, a frame
// over the bound, an error frame naming a stage outside the chain, or anything but an
// error coming back on stage 0's stream fail the step with peer_lost naming the stage, and
// are recorded against it.
func TestHeadRejectsBadOutput(t *testing.T) {
	const width, maxPositions = 8, 16
	output := func(step, n uint64) []byte { return frame.Append(nil, hiddenBody(step, n, int(n)*width)) }
	tests := []struct {
		name     string
		back, up []byte
		event    reputation.Event
	}{
		{"output of the wrong step", output(1, 1), nil, reputation.ProtocolViolation},
		{"output of the wrong size", output(0, 2), nil, reputation.ProtocolViolation},
		{"output short of its values", frame.Append(nil, hiddenBody(0, 1, width-1)), nil, reputation.ProtocolViolation},
		{"output over the bound", binary.AppendUvarint(nil, uint64(max(stepFrameMax(width, maxPositions), MaxErrorFrame)+1)), nil, reputation.MalformedFrame},
		{"error naming a stage outside the chain", frame.Append(nil, encodeError(stageFault{stage: 3, code: inference.CodeTimeout})), nil, reputation.ProtocolViolation},
		{"an end frame the head did not send", frame.Append(nil, []byte{frameEnd}), nil, reputation.ProtocolViolation},
		{"a ready frame back on stage 0's stream", nil, frame.Append(nil, encodeReady(width, 0)), reputation.ProtocolViolation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakeStage(t, width, func([]byte) ([]byte, []byte) { return tt.back, tt.up })
			head := newHost(t)
			know(head, fake)
			var seen observed
			c := chain{head: head, hops: []Hop{{Peer: fake.ID(), Lo: 0, Hi: 4}}}
			p := c.open(t, maxPositions, WithPipelineObserver(&seen))
			defer p.Close()
			_, err := p.Forward(t.Context(), promptStates(1, width), 1)
			c.failedStage(t, err, inference.CodePeerLost, 0)
			want := fake.ID().String() + " " + tt.event.String()
			if got := seen.events(); len(got) != 1 || got[0] != want {
				t.Fatalf("observed %q, want %q", got, want)
			}
		})
	}
}
