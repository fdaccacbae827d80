package stage

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// Moves are tested on the synthetic model (inference/synth), whose stage sessions give and
// take their KV rows: synth-small, 4 layers of width 256.
const (
	moveModel  = "synth-small"
	moveLayers = 4
	moveWidth  = 256
)

// hooked is a stage backend around synth's whose sessions run rows, when set, before
// giving their rows: a test's hook to kill the stage during a fetch, or to spoil the rows.
type hooked struct {
	*synth.Backend
	rows atomic.Pointer[func(r inference.KVRows) inference.KVRows]
}

func (h *hooked) OpenStage(ctx context.Context, model string, lo, hi, maxPositions int) (inference.StageSession, error) {
	s, err := h.Backend.OpenStage(ctx, model, lo, hi, maxPositions)
	if err != nil {
		return nil, err
	}
	return hookedSession{s.(inference.StageMover), h}, nil
}

type hookedSession struct {
	inference.StageMover
	h *hooked
}

func (s hookedSession) Rows(dst []float32, from, n int) (inference.KVRows, error) {
	r, err := s.StageMover.Rows(dst, from, n)
	if f := s.h.rows.Load(); f != nil && err == nil {
		r = (*f)(r)
	}
	return r, err
}

// moveStage is a stage on synth: its host, backend and server, with the sessions it ended.
type moveStage struct {
	*stageNode
	be *hooked
}

func newMoveStage(t *testing.T, opts ...ServerOption) *moveStage {
	t.Helper()
	b, err := synth.New(moveModel)
	if err != nil {
		t.Fatal(err)
	}
	be := &hooked{Backend: b}
	n := &stageNode{h: newHost(t), ends: make(chan SessionEnd, 64)}
	opts = append(opts, WithOnSessionEnd(func(e SessionEnd) { n.ends <- e }))
	n.srv = NewServer(n.h, be, opts...)
	t.Cleanup(func() { n.srv.Close() })
	return &moveStage{stageNode: n, be: be}
}

// freed waits for the stage's next session end and checks that it ended with one of
// outcomes and left nothing held: no session running or kept at the server (the server
// closes or keeps every backend session it opened).
func (s *moveStage) freed(t *testing.T, outcomes ...string) SessionEnd {
	t.Helper()
	e := s.ended(t)
	if !slices.Contains(outcomes, e.Outcome) {
		t.Errorf("stage %d ended with %q, want one of %q", e.Index, e.Outcome, outcomes)
	}
	if r, k := s.srv.Sessions(), s.srv.Kept(); r != 0 || k != 0 {
		t.Errorf("stage %d: %d sessions running, %d kept after the end", e.Index, r, k)
	}
	return e
}

// moveChain is a head, a chain of synth stages and spare stages, all known to the head.
type moveChain struct {
	head   *stageNode // its host only
	stages []*moveStage
	spares []*moveStage
	hops   []Hop
}

func newMoveChain(t *testing.T, ranges [][2]int, spares int, opts ...ServerOption) moveChain {
	t.Helper()
	c := moveChain{head: &stageNode{h: newHost(t)}}
	for _, r := range ranges {
		s := newMoveStage(t, opts...)
		know(c.head.h, s.h)
		c.stages = append(c.stages, s)
		c.hops = append(c.hops, Hop{Peer: s.h.ID(), Lo: r[0], Hi: r[1]})
	}
	for range spares {
		s := newMoveStage(t, opts...)
		know(c.head.h, s.h)
		c.spares = append(c.spares, s)
	}
	return c
}

// replaceWith is a Replacer that gives the layers to the spares' hosts, split evenly
// over them, and records what it was asked.
func replaceWith(spares []*moveStage, asked *[]Hop) Replacer {
	return func(_ context.Context, lo, hi int, leaving peer.ID, chain []Hop) ([]Hop, error) {
		*asked = append(*asked, Hop{Peer: leaving, Lo: lo, Hi: hi})
		var out []Hop
		for i, s := range spares {
			a, b := lo+(hi-lo)*i/len(spares), lo+(hi-lo)*(i+1)/len(spares)
			if a < b {
				out = append(out, Hop{Peer: s.h.ID(), Lo: a, Hi: b})
			}
		}
		return out, nil
	}
}

// localSynth is the reference: the same generation on every layer in one session.
func localSynth(t *testing.T, prompt []float32, decode int) [][]float32 {
	t.Helper()
	b, err := synth.New(moveModel)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := b.OpenStage(t.Context(), moveModel, 0, moveLayers, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	outs, err := generate(t.Context(), ss.Forward, moveWidth, prompt, decode)
	if err != nil {
		t.Fatal(err)
	}
	return outs
}

// leavingAt is layers that, before its call k (0: the prefill), tells stage s to leave.
func leavingAt(f inference.Layers, k int, s *moveStage) inference.Layers {
	calls := 0
	return func(ctx context.Context, h []float32, n int) ([]float32, error) {
		if calls == k {
			if told := s.srv.HandOver(); told != 1 {
				return nil, errors.New("the leaving stage told no session")
			}
		}
		calls++
		return f(ctx, h, n)
	}
}

// A stage that leaves mid-generation hands its session over with no replay: the head
// re-links the chain at the next step, the other stages keep their KV caches, the
// leaving stage's rows go to its replacements (one, or two splitting its layers), and
// the outputs are bit for bit those of an uninterrupted run. Every session is freed at
// the end, the leaving one as moved.
func TestStageMovesLive(t *testing.T) {
	const promptLen, decode = 9, 8
	prompt := promptStates(promptLen, moveWidth)
	want := localSynth(t, prompt, decode)
	for _, tt := range []struct {
		name   string
		leave  int // the stage that leaves
		spares int
	}{
		{"middle stage, one replacement", 1, 1},
		{"middle stage, split over two", 1, 2},
		{"first stage", 0, 1},
		{"last stage", 2, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newMoveChain(t, [][2]int{{0, 1}, {1, 3}, {3, 4}}, tt.spares)
			var asked []Hop
			p, err := Open(t.Context(), c.head.h, moveModel, c.hops, 64, WithMoves(replaceWith(c.spares, &asked)))
			if err != nil {
				t.Fatal(err)
			}
			leaving := c.stages[tt.leave]
			got, err := generate(t.Context(), leavingAt(p.Forward, 3, leaving), moveWidth, prompt, decode)
			if err != nil {
				t.Fatal(err)
			}
			if !sameBits(got, want) {
				t.Fatal("the moved chain's outputs differ from an uninterrupted run's")
			}
			if len(asked) != 1 || asked[0] != c.hops[tt.leave] {
				t.Fatalf("replacer asked for %v, want once for %v", asked, c.hops[tt.leave])
			}
			moves := p.Moves()
			if len(moves) != 1 || moves[0].Index != tt.leave || moves[0].From != leaving.h.ID() || len(moves[0].To) != tt.spares {
				t.Fatalf("moves %+v, want stage %d from %s to %d hops", moves, tt.leave, leaving.h.ID(), tt.spares)
			}
			hi, lo := c.hops[tt.leave].Hi, c.hops[tt.leave].Lo
			// The notice comes with call 3's output (the prefill and 3 decode steps run),
			// and call 4 moves the stage.
			if m := moves[0]; m.Positions != promptLen+3 || m.Bytes != int64(m.Positions*rowBytes(moveWidth, hi-lo)) {
				t.Fatalf("move of %d positions, %d bytes; want %d positions of %d bytes each", m.Positions, m.Bytes, promptLen+3, rowBytes(moveWidth, hi-lo))
			}
			if e := leaving.freed(t, OutcomeMoved); e.Positions != promptLen+3 {
				t.Fatalf("the leaving stage's session ended with %d positions, want %d", e.Positions, promptLen+3)
			}
			if st := p.Stages(); len(st) != 2+tt.spares || slices.ContainsFunc(st, func(h Hop) bool { return h.Peer == leaving.h.ID() }) {
				t.Fatalf("chain after the move %v", st)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			for i, s := range c.stages {
				if i == tt.leave {
					continue
				}
				// A kept stage's session is the one it had: it ran every step.
				if e := s.freed(t, OutcomeClosed); e.Steps != 1+decode || e.Positions != promptLen+decode {
					t.Fatalf("stage %d's session ended after %d steps, %d positions; want %d, %d", i, e.Steps, e.Positions, 1+decode, promptLen+decode)
				}
			}
			for _, s := range c.spares {
				if e := s.freed(t, OutcomeClosed); e.Positions != promptLen+decode {
					t.Fatalf("a replacement's session ended with %d positions, want %d", e.Positions, promptLen+decode)
				}
			}
			for _, s := range append(slices.Clone(c.stages), c.spares...) {
				if s.srv.Kept() != 0 {
					t.Fatalf("a stage still keeps %d sessions", s.srv.Kept())
				}
			}
		})
	}
}

// failedMove runs a 3-stage chain whose middle stage leaves before call 2, with
// replacements from replace, and returns the pipeline, its session before the move, and
// Forward's error.
func failedMove(t *testing.T, c moveChain, replace Replacer) (*Pipeline, [sessionIDLen]byte, error) {
	t.Helper()
	p, err := Open(t.Context(), c.head.h, moveModel, c.hops, 64, WithMoves(replace))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	session := p.session
	_, err = generate(t.Context(), leavingAt(p.Forward, 1, c.stages[1]), moveWidth, promptStates(5, moveWidth), 4)
	return p, session, err
}

// A re-link that fails once the chain kept its sessions (the replacement cannot be
// reached) breaks the pipeline with a retryable error naming the leaving stage, never a
// hang; the kept sessions are freed after the keep timeout; another head cannot adopt
// them meanwhile.
func TestKeptSessionsExpire(t *testing.T) {
	c := newMoveChain(t, [][2]int{{0, 1}, {1, 3}, {3, 4}}, 0, WithKeepTimeout(eventWait/4))
	nobody := newHost(t) // no stage server: the replacement's open fails
	know(c.head.h, nobody)
	_, old, err := failedMove(t, c, func(_ context.Context, lo, hi int, _ peer.ID, _ []Hop) ([]Hop, error) {
		return []Hop{{Peer: nobody.ID(), Lo: lo, Hi: hi}}, nil
	})
	if !inference.CodeOf(err).Retryable() {
		t.Fatalf("failed move: %v, want a retryable error", err)
	}
	var fs *FailedStage
	if !errors.As(err, &fs) || fs.Peer != c.hops[1].Peer {
		t.Fatalf("failed move: %v, want it to name the leaving stage %s", err, c.hops[1].Peer)
	}
	// Stage 0 adopted its session into the chain that failed, and freed it with it; the
	// chain's open never reached stage 2, which keeps its own.
	if k := c.stages[2].srv.Kept(); k != 1 {
		t.Fatalf("stage 2 keeps %d sessions after the keep, want 1", k)
	}
	c.stages[0].freed(t, string(inference.CodeUnavailable), string(inference.CodePeerLost))
	// Another head that learnt the session's ID cannot adopt stage 2's kept session.
	other := newHost(t)
	know(other, c.stages[2].h)
	o := &open{head: other.ID(), model: moveModel, maxPositions: 64, maxBatch: 64, moves: true,
		hops: []Hop{c.hops[2]}, adopt: old, adopting: true, positions: 5 + 1, loads: []bool{false}}
	o.session[0] = 1
	if err := rawOpen(t, other, o); inference.CodeOf(err) != inference.CodeUnavailable {
		t.Fatalf("another head's adopt: %v, want unavailable", err)
	}
	for i, s := range c.stages[1:] {
		s.freed(t, OutcomeExpired)
		if s.srv.Kept() != 0 || s.srv.Sessions() != 0 {
			t.Fatalf("stage %d keeps %d and runs %d sessions after the expiry", i+1, s.srv.Kept(), s.srv.Sessions())
		}
	}
}

// rawOpen sends o, an open frame, from h to its first hop and returns the error its answer
// carries (nil: ready).
func rawOpen(t *testing.T, h host.Host, o *open) error {
	t.Helper()
	st, err := h.NewStream(t.Context(), o.hops[0].Peer, ID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Reset()
	if err := frame.Write(st, encodeOpen(o)); err != nil {
		t.Fatal(err)
	}
	body, err := frame.ReadOne(st, MaxErrorFrame)
	if err != nil {
		t.Fatal(err)
	}
	if len(body) > 0 && body[0] == frameError {
		f, err := decodeError(body, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		return inference.Errorf(f.code, "%s", f.msg)
	}
	return nil
}

// The leaving stage dies during the fetch, or sends rows of the wrong shape: the head's
// Forward fails with a retryable error within its bounds, and no session is left held.
func TestLeavingStageFailsDuringTheFetch(t *testing.T) {
	for _, tt := range []struct {
		name string
		rows func(s *moveStage) func(inference.KVRows) inference.KVRows
	}{
		{"dies", func(s *moveStage) func(inference.KVRows) inference.KVRows {
			return func(r inference.KVRows) inference.KVRows {
				s.h.Close()
				return r
			}
		}},
		{"bad rows", func(*moveStage) func(inference.KVRows) inference.KVRows {
			return func(r inference.KVRows) inference.KVRows { r.Data = r.Data[:len(r.Data)-moveWidth]; return r }
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newMoveChain(t, [][2]int{{0, 1}, {1, 3}, {3, 4}}, 1, WithKeepTimeout(eventWait/4))
			f := tt.rows(c.stages[1])
			c.stages[1].be.rows.Store(&f)
			var asked []Hop
			done := make(chan error, 1)
			go func() {
				_, _, err := failedMove(t, c, replaceWith(c.spares, &asked))
				done <- err
			}()
			select {
			case err := <-done:
				if !inference.CodeOf(err).Retryable() {
					t.Fatalf("Forward: %v, want a retryable error", err)
				}
			case <-time.After(eventWait):
				t.Fatal("Forward hangs")
			}
			// The re-linked chain broke: its stages free their sessions at once.
			for _, s := range []*moveStage{c.stages[0], c.stages[2], c.spares[0]} {
				s.freed(t, string(inference.CodePeerLost))
			}
		})
	}
}
