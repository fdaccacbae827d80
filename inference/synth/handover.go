package synth

import (
	"context"
	"fmt"
	"slices"

	"github.com/meshinfer/meshinfer/inference"
)

// Live transfer (inference/handover.go): Generate hands its generation over when its
// request's Move starts, and Resume goes on with one from the rows another node sent. A
// position's keys and values are the same bits however positions were split into calls and
// passes (TestFeedSplitInvariant), so a resumed generation computes, from the rows it was
// sent, exactly what the one that left would have (TestResumeIdentical).

// mover sends the cache of a generation's session out through a Move.
type mover struct {
	move *inference.Move
	s    *session
	sent int       // positions sent
	buf  []float32 // one run's values, reused
}

// newMover returns the mover of move over s, or nil when there is no move to watch.
func newMover(move *inference.Move, s *session) *mover {
	if move == nil || move.Send == nil {
		return nil
	}
	return &mover{move: move, s: s}
}

// tick runs between two tokens, after emitted tokens went out and before the last of them
// is fed to the layers. Once the move started it sends the rows not sent yet, at most
// Move.PreCopyBytes of them per tick (by default inference.MovePreCopyBytes, or a
// MovePreCopyTicks-th of the cache when that is more; pre-copy: the generation goes on
// between ticks); at a tick that finds at most inference.MoveStopRows unsent it sends them
// and returns *Moved (stop-and-copy). A tick that pre-copied never stops too: the next
// token comes first, so the last pre-copy's rows (up to a 32nd of a long context's cache)
// are not part of the pause the client sees, only the remainder's few. A nil mover does
// nothing.
func (mv *mover) tick(emitted int) error {
	if mv == nil || !mv.move.Started() {
		return nil
	}
	st := mv.s.stack()
	if st == nil {
		return inference.Errorf(inference.CodeUnavailable, "synth: the session to move is closed")
	}
	rowBytes := 2 * len(st.kc) * st.p.Dim * 4
	perRun := max(inference.MaxKVRowsBytes/rowBytes, 1)
	if st.pos-mv.sent > inference.MoveStopRows {
		for quota := mv.move.PreCopyQuota(st.pos * rowBytes); mv.sent < st.pos && quota >= rowBytes; {
			n := min(st.pos-mv.sent, perRun, quota/rowBytes)
			if err := mv.send(st, n); err != nil {
				return err
			}
			quota -= n * rowBytes
		}
		return nil
	}
	for mv.sent < st.pos {
		if err := mv.send(st, min(st.pos-mv.sent, perRun)); err != nil {
			return err
		}
	}
	return &inference.Moved{Positions: mv.sent, Tokens: emitted}
}

// send sends the next n positions of st's cache.
func (mv *mover) send(st *stack, n int) error {
	r := inference.KVRows{Pos: mv.sent, N: n}
	mv.buf = st.rows(mv.buf[:0], mv.sent, n)
	r.Data = mv.buf
	if err := mv.move.Send(r); err != nil {
		return fmt.Errorf("synth: handover: %w", err)
	}
	mv.sent += n
	return nil
}

// rows appends to dst the keys then the values of positions [from, from+n) of every layer
// of s, in KVRows' layout.
func (s *stack) rows(dst []float32, from, n int) []float32 {
	for l := range s.kc {
		dst = s.gather(dst, s.kc[l], from, n)
		dst = s.gather(dst, s.vc[l], from, n)
	}
	return dst
}

// load copies r's values (KVRows' layout, positions s.pos…) into the cache.
func (s *stack) load(r inference.KVRows) {
	d, n := s.p.Dim, r.N
	for l := range s.kc {
		base := l * 2 * n * d
		s.store(s.kc[l], r.Data[base:base+n*d], s.pos, n)
		s.store(s.vc[l], r.Data[base+n*d:base+2*n*d], s.pos, n)
	}
	s.pos += n
}

// stack returns the session's stack, nil once closed. Only the goroutine that runs the
// session's Forward calls it, so the stack is not used concurrently.
func (s *session) stack() *stack {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// Resume readies a generation of req that starts from KV rows another node sent; see
// inference.Resumer. req is checked as Generate checks it, the whole model is loaded (it may
// be cold: the loading happens while the rows arrive), and a cache for the prompt and the
// completion is allocated. req.Replay must be empty: the replay comes with Generate.
func (b *Backend) Resume(ctx context.Context, req *inference.Request) (inference.Resumption, error) {
	if len(req.Replay) > 0 {
		return nil, inference.Errorf(inference.CodeInvalidRequest, "a resumed request's replay comes after its KV rows, not with it")
	}
	m, prompt, budget, err := b.prepare(ctx, req)
	if err != nil {
		return nil, err
	}
	w, err := m.load(ctx, whole(m.preset))
	if err != nil {
		return nil, err
	}
	r := *req
	r.Messages = slices.Clone(req.Messages) // req is not retained
	r.Stop = slices.Clone(req.Stop)
	r.Move = nil
	return &resumption{m: m, w: w, req: r, prompt: prompt, budget: budget,
		local: newSession(w, 0, m.preset.Layers, len(prompt)+budget-1, nil)}, nil
}

// resumption is an inference.Resumption of the synthetic models.
type resumption struct {
	m      *model
	w      *weights
	req    inference.Request
	prompt []int
	budget int
	local  *session
	ran    bool
}

var _ inference.Resumer = (*Backend)(nil)

// Shape is the model's shape.
func (r *resumption) Shape() inference.ModelShape { return r.m.preset.Shape() }

// Load appends rows to the cache; see inference.Resumption.
func (r *resumption) Load(rows inference.KVRows) error {
	if err := rows.Check(r.Shape()); err != nil {
		return err
	}
	st := r.local.stack()
	switch {
	case st == nil || r.ran:
		return inference.Errorf(inference.CodeInvalidRequest, "KV rows for a resumption that is closed or running")
	case rows.Pos != st.pos:
		return inference.Errorf(inference.CodeInvalidRequest, "KV rows at position %d, expected %d", rows.Pos, st.pos)
	case st.pos+rows.N > st.capacity:
		return inference.Errorf(inference.CodeInvalidRequest,
			"KV rows up to position %d, past the %d the generation can have", st.pos+rows.N, st.capacity)
	}
	st.load(rows)
	return nil
}

// Generate goes on with the generation; see inference.Resumption. Of the rows loaded it
// keeps those before the last replayed token (or before the prompt's last, without replay):
// at least one position is fed so that its logits give the next token.
func (r *resumption) Generate(ctx context.Context, replay []int, emit func(inference.Token) error) (inference.Result, error) {
	st := r.local.stack()
	if st == nil || r.ran {
		return inference.Result{}, inference.Errorf(inference.CodeInvalidRequest, "a resumption runs once")
	}
	r.ran = true
	if err := r.m.checkReplay(replay, r.budget); err != nil {
		return inference.Result{}, err
	}
	req := r.req
	req.Replay = replay
	from := min(st.pos, len(r.prompt)+len(replay)-1)
	st.pos = from // rows past it are overwritten as their positions are fed again
	return generate(ctx, r.m, r.w, r.local.Forward, &req, r.prompt, r.budget, emit, from, nil)
}

// Close frees the cache.
func (r *resumption) Close() error { return r.local.Close() }
