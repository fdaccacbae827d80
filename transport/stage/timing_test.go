package stage

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/reputation"
)

// withoutTiming makes a stage act as one of stage/1.0.0 before timed sessions: it ignores an
// open's timing field, passes none on, and answers ready without the timed flag.
func withoutTiming() ServerOption { return func(s *Server) { s.untimed = true } }

// A chain whose stages all report their times gives the head each stage's layers' time,
// step by step, exactly as each stage counts it, inside the step's round trip; each stage
// lists its session while it is open. The outputs are the same bits as untimed.
func TestTimedChainReportsEachStage(t *testing.T) {
	const layers, width, promptLen, decode = 6, 16, 11, 5
	prompt := promptStates(promptLen, width)
	want := local(t, layers, width, prompt, decode)
	c := newChain(t, layers, width, [][2]int{{0, 1}, {1, 4}, {4, 6}})
	p := c.open(t, 64)
	if st := p.Stats(); st.Steps != 0 || len(st.Forward) != 3 || st.Err != nil {
		t.Fatalf("stats before any step: %+v, want no steps and a time for each of 3 stages", st)
	}
	got, err := generate(t.Context(), p.Forward, width, prompt, decode)
	if err != nil {
		t.Fatal(err)
	}
	if !sameBits(got, want) {
		t.Fatal("a timed chain's outputs differ from one process's")
	}
	st := p.Stats()
	if st.Steps != 1+decode || st.Positions != promptLen+decode || st.RoundTrip <= 0 || st.Err != nil {
		t.Fatalf("stats %+v: want %d steps of %d positions, a round trip, no error", st, 1+decode, promptLen+decode)
	}
	var sum time.Duration
	for i, n := range c.stages {
		run := n.srv.Running()
		if len(run) != 1 {
			t.Fatalf("stage %d runs %d sessions, want 1", i, len(run))
		}
		s := run[0]
		if s.Head != c.head.ID() || s.From != prev(c, i) || s.Index != i || s.Stages != 3 || s.Model != arithModel ||
			s.Lo != c.hops[i].Lo || s.Hi != c.hops[i].Hi || s.Steps != st.Steps || s.Positions != st.Positions {
			t.Fatalf("stage %d lists %+v", i, s)
		}
		// Its own count and what it told the head, nanosecond for nanosecond.
		if s.Forward <= 0 || st.Forward[i] != s.Forward {
			t.Fatalf("stage %d: %v of layers by its count, %v at the head", i, s.Forward, st.Forward[i])
		}
		sum += s.Forward
	}
	if sum > st.RoundTrip {
		t.Fatalf("the stages' layers took %v in all, more than the %v round trip that holds them", sum, st.RoundTrip)
	}
	p.Close()
	for _, n := range c.stages {
		n.freed(t, OutcomeClosed)
		if run := n.srv.Running(); len(run) != 0 {
			t.Fatalf("a freed session is still listed: %+v", run)
		}
	}
	if after := p.Stats(); after.Steps != st.Steps || after.Err != nil {
		t.Fatalf("stats after an orderly Close: %+v", after)
	}
}

// prev is the previous hop of stage i of c: the head for stage 0.
func prev(c chain, i int) peer.ID {
	if i == 0 {
		return c.head.ID()
	}
	return c.hops[i-1].Peer
}

// A chain with a stage that predates timed sessions, wherever it is, runs untimed from end
// to end: the same outputs, the head's round trips and steps, no per-stage times; and a
// stage that is asked for no times (a head that predates them) answers untimed.
func TestChainWithAnUntimedStage(t *testing.T) {
	const layers, width, promptLen, decode = 6, 16, 7, 4
	prompt := promptStates(promptLen, width)
	want := local(t, layers, width, prompt, decode)
	for old := range 3 {
		t.Run(fmt.Sprintf("stage %d untimed", old), func(t *testing.T) {
			c := chain{head: newHost(t)}
			for i, r := range [][2]int{{0, 2}, {2, 3}, {3, 6}} {
				var opts []ServerOption
				if i == old {
					opts = append(opts, withoutTiming())
				}
				n := newStage(t, newArith(layers, width, 8), opts...)
				know(c.head, n.h)
				c.stages = append(c.stages, n)
				c.hops = append(c.hops, Hop{Peer: n.h.ID(), Lo: r[0], Hi: r[1]})
			}
			p := c.open(t, 64)
			defer p.Close()
			got, err := generate(t.Context(), p.Forward, width, prompt, decode)
			if err != nil {
				t.Fatal(err)
			}
			if !sameBits(got, want) {
				t.Fatalf("stage %d untimed: the outputs differ", old)
			}
			st := p.Stats()
			if st.Steps != 1+decode || st.RoundTrip <= 0 || st.Forward != nil {
				t.Fatalf("stage %d untimed: stats %+v, want %d steps, a round trip and no per-stage times", old, st, 1+decode)
			}
			for i, n := range c.stages {
				if run := n.srv.Running(); len(run) != 1 || run[0].Steps != st.Steps || run[0].Forward <= 0 {
					t.Fatalf("stage %d lists %+v", i, run)
				}
			}
		})
	}
}

// lastStageRaw sets up, by hand, a session of layers [0, layers) at n as the last stage
// (index 1) of a two-stage chain whose open asks for what asked says (times, receipts):
// the raw host plays both the previous hop and the head. The stage must answer the open
// with exactly those flags and the attach with none.
func lastStageRaw(t *testing.T, n *stageNode, layers, width, batch int, asked byte) *rawHead {
	t.Helper()
	r := &rawHead{h: newHost(t)}
	know(r.h, n.h)
	rand.Read(r.id[:])
	o := &open{session: r.id, head: r.h.ID(), model: arithModel, maxPositions: 16, maxBatch: batch, index: 1,
		hops: []Hop{{Peer: n.h.ID(), Lo: 0, Hi: layers}}, timing: asked&flagTimed != 0, receipts: asked&flagReceipts != 0}
	var err error
	if r.up, err = r.h.NewStream(t.Context(), n.h.ID(), ID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.up.Reset() })
	if err := frame.Write(r.up, encodeOpen(o)); err != nil {
		t.Fatal(err)
	}
	got, err := frame.ReadOne(r.up, MaxErrorFrame)
	if err != nil {
		t.Fatal(err)
	}
	if w, flags, err := decodeReady(got, asked); err != nil || w != width || flags != asked {
		t.Fatalf("answer to an open asking for %b %x: width %d, flags %b, %v", asked, got, w, flags, err)
	}
	if r.ret, err = r.h.NewStream(t.Context(), n.h.ID(), ID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ret.Reset() })
	r.ready(t, r.ret, encodeAttach(r.id), width) // no flags: decodeReady(…, 0)
	return r
}

// A stage of a timed session takes the step's earlier times in, adds its own, and sends the
// output timed; one that gets a frame without exactly its predecessors' times, or a time
// past MaxStageTime, treats it as any malformed frame: peer_lost, recorded, session freed.
func TestTimedStageChecksItsInput(t *testing.T) {
	const layers, width, batch = 2, 8, 4
	timed := func(k int, times ...time.Duration) []byte {
		b := binary.AppendUvarint([]byte{frameTimed}, 0)
		b = binary.AppendUvarint(b, 1)
		b = binary.AppendUvarint(b, uint64(k))
		for _, d := range times {
			b = binary.AppendUvarint(b, uint64(d))
		}
		return frame.Append(nil, append(b, make([]byte, 4*width)...))
	}
	t.Run("good", func(t *testing.T) {
		n := newStage(t, newArith(layers, width, 1))
		r := lastStageRaw(t, n, layers, width, batch, flagTimed)
		earlier := 1234567 * time.Nanosecond
		if _, err := r.up.Write(appendTimedFrame(nil, 0, 1, []time.Duration{earlier}, promptStates(1, width))); err != nil {
			t.Fatal(err)
		}
		out, err := frame.ReadOne(r.ret, stepFrameMax(width, batch))
		if err != nil {
			t.Fatal(err)
		}
		step, m, times, _, err := decodeTimed(out, width, batch, 2, nil)
		if err != nil || step != 0 || m != 1 || times[0] != earlier || times[1] <= 0 {
			t.Fatalf("output %d positions of step %d, times %v, %v; want the earlier %v and its own", m, step, times, err, earlier)
		}
		if run := n.srv.Running(); len(run) != 1 || run[0].Forward != times[1] {
			t.Fatalf("the stage lists %+v, and told the head %v", run, times[1])
		}
	})
	tests := []struct {
		name string
		wire []byte
	}{
		{"untimed frame", frame.Append(nil, hiddenBody(0, 1, width))},
		{"no earlier time", timed(0)},
		{"two earlier times", timed(2, 1, 2)},
		{"a time past MaxStageTime", timed(1, MaxStageTime+1)},
		{"a count without its time", timed(1)},
		{"non-minimal time", frame.Append(nil, append([]byte{frameTimed, 0, 1, 1, 0x80, 0x00}, make([]byte, 4*width)...))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen observed
			n := newStage(t, newArith(layers, width, 1), WithServerObserver(&seen))
			r := lastStageRaw(t, n, layers, width, batch, flagTimed)
			r.violates(t, n, &seen, tt.wire)
		})
	}
}

// violates writes wire (whole frames) on r's stream to n, the last stage of a two-stage
// chain, and checks that n takes it as its previous hop's violation: peer_lost naming
// stage 0 passed on to the head, the offending stream reset, the session freed, the
// violation recorded in seen.
func (r *rawHead) violates(t *testing.T, n *stageNode, seen *observed, wire []byte) {
	t.Helper()
	if _, err := r.up.Write(wire); err != nil {
		t.Fatal(err)
	}
	body, err := frame.ReadOne(r.ret, MaxErrorFrame)
	if err != nil {
		t.Fatal(err)
	}
	if f, err := decodeError(body, headStage, 2); err != nil || f.code != inference.CodePeerLost || f.stage != 0 {
		t.Fatalf("return stream got %+v (%v), want peer_lost naming the previous hop", f, err)
	}
	if _, err := r.up.Read(make([]byte, 1)); !errors.Is(err, network.ErrReset) {
		t.Fatalf("read on the offending stream: %v, want a reset", err)
	}
	n.freed(t, string(inference.CodePeerLost))
	want := r.h.ID().String() + " " + reputation.ProtocolViolation.String()
	if got := seen.events(); len(got) != 1 || got[0] != want {
		t.Fatalf("observed %q, want %q", got, want)
	}
}

// A head believes times only as the protocol allows them: a timed flag on the attach's
// ready, output in a plain frame after a timed ready, or a timed frame with the wrong
// count of times fail with peer_lost naming the stage, recorded against it.
func TestHeadChecksTimes(t *testing.T) {
	const width, maxPositions = 8, 16
	timedOut := func(times ...time.Duration) []byte {
		return appendTimedFrame(nil, 0, 1, times, make([]float32, width))
	}
	tests := []struct {
		name              string
		openReady, attach bool // the ready frames' timed flags
		back              []byte
	}{
		{"timed flag on the attach", false, true, frame.Append(nil, hiddenBody(0, 1, width))},
		{"plain output after a timed ready", true, false, frame.Append(nil, hiddenBody(0, 1, width))},
		{"timed output after a plain ready", false, false, timedOut(time.Millisecond)},
		{"no time in a one-stage chain", true, false, timedOut()},
		{"two times in a one-stage chain", true, false, timedOut(1, 2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := fakeTimedStage(t, width, tt.openReady, tt.attach, tt.back)
			head := newHost(t)
			know(head, fake)
			var seen observed
			c := chain{head: head, hops: []Hop{{Peer: fake.ID(), Lo: 0, Hi: 4}}}
			p, err := Open(t.Context(), head, arithModel, c.hops, maxPositions, WithPipelineObserver(&seen))
			if err == nil {
				defer p.Close()
				_, err = p.Forward(t.Context(), promptStates(1, width), 1)
				if st := p.Stats(); st.Steps != 0 || !errors.Is(st.Err, err) {
					t.Fatalf("stats of the broken pipeline %+v, want no step and its error", st)
				}
			}
			c.failedStage(t, err, inference.CodePeerLost, 0)
			want := fake.ID().String() + " " + reputation.ProtocolViolation.String()
			if got := seen.events(); len(got) != 1 || got[0] != want {
				t.Fatalf("observed %q, want %q", got, want)
			}
		})
	}
	// The one good case: a timed ready, then the stage's own time.
	fake := fakeTimedStage(t, width, true, false, timedOut(42*time.Microsecond))
	head := newHost(t)
	know(head, fake)
	p, err := Open(t.Context(), head, arithModel, []Hop{{Peer: fake.ID(), Lo: 0, Hi: 4}}, maxPositions)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Forward(t.Context(), promptStates(1, width), 1); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Steps != 1 || len(st.Forward) != 1 || st.Forward[0] != 42*time.Microsecond {
		t.Fatalf("stats %+v, want one step whose stage took 42µs", st)
	}
}

// fakeTimedStage is a one-stage chain's stage answering the open's and the attach's ready
// with the given timed flags, then the first step with back on the return stream.
func fakeTimedStage(t *testing.T, width int, openTimed, attachTimed bool, back []byte) host.Host {
	t.Helper()
	return fakeChainStage(t, width, flagsOf(openTimed, false), flagsOf(attachTimed, false), func([]byte) ([]byte, []byte) { return back, nil })
}
