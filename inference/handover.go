package inference

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Live transfer: a node that must leave while it serves a generation (its owner paused it,
// it is draining for a restart) hands the generation's KV cache to the node that goes on,
// so that the new one prefills only what it was not sent. This file is the contract between
// the pieces: the leaving backend's side (Move, Moved), the taking backend's side (Resumer,
// Resumption), and the rows of cache they exchange (KVRows). The wire protocol is
// transport/infer's; the choice of whether to take a handover at all is the requester's
// viability gate (mesh/route.Gate, node/dispatch).
//
// The way it goes: the serving node calls Move.Start. From its next token on, the
// generation sends its cache's rows in order, from position 0, to Move.Send while it keeps
// generating (pre-copy: at most Move.PreCopyQuota between two tokens). At a token where
// what it has not sent is at most MoveStopRows positions (one after the last pre-copy, not
// the same), it stops, sends those (stop-and-copy) and returns *Moved. Whoever took the rows loads them into a Resumption in the same order and calls
// its Generate with the tokens the client has: the new node prefills the positions it was
// not sent (at least the last token's) and goes on with the very tokens the old one would
// have generated. Rows a taker did not get (a transfer that failed halfway) are simply
// prefilled: a partial transfer degrades to a replay (Request.Replay), never to a hang.

// Bounds of a handover, in the leaving backend.
const (
	// MovePreCopyBytes bounds the rows a generation sends between two of its tokens while it
	// pre-copies, unless the cache is larger than MovePreCopyTicks times it: 1 MiB is 32
	// positions of synth-base, a few milliseconds on a LAN, so the tokens keep coming while
	// the cache moves.
	MovePreCopyBytes = 1 << 20
	// MovePreCopyTicks is how many tokens a pre-copy takes at most with the default bound
	// (Move.PreCopyBytes 0): a larger cache sends a 32nd of itself between two tokens.
	// synth-base's cache at 4,096 positions is 128 MiB, 128 tokens at 1 MiB each: over 7 s
	// of a leaving node's time (the drain's bound is 10 s) where 32 take 2 s, each token
	// later by the time 4 MiB take on its link (a few milliseconds on a LAN).
	MovePreCopyTicks = 32
	// MoveStopRows is the size of the remainder, in positions, at which the generation stops
	// and copies the rest: a stop-and-copy of this many rows, whatever the context's length.
	// The pause the client sees is that, any rows of the last pre-copy still on their way to
	// the replacement, and the replacement's first step (issue 17's M1: all rows there 1-11
	// ms after the last token on loopback). Nothing paces the pre-copy by what the
	// replacement has applied: on a slow link, rows queued in the streams are in the pause.
	MoveStopRows = 4
	// MaxKVRowsBytes bounds one KVRows' values in bytes (a frame of the wire protocol):
	// Send is called with runs of at most this size.
	MaxKVRowsBytes = 1 << 20
)

// KVRows is a run of a generation's KV cache across all of the model's layers: positions
// [Pos, Pos+N). Data holds, for each layer in order, the keys of those positions, then their
// values, each N × Width float32 (ModelShape.Width), row-major: Layers × 2 × N × Width values
// in all.
type KVRows struct {
	Pos, N int
	Data   []float32
}

// KVValues is the number of float32 values of n positions of a model of shape s.
func KVValues(s ModelShape, n int) int { return s.Layers * 2 * n * s.Width }

// Check returns an invalid_request *Error unless r is well formed for s: N ≥ 1, Pos ≥ 0, and
// exactly KVValues(s, N) values.
func (r KVRows) Check(s ModelShape) error { return r.CheckLayers(s, s.Layers) }

// CheckLayers is Check for rows of a run of layers of s (a pipeline stage's,
// StageMover): exactly layers × 2 × N × Width values.
func (r KVRows) CheckLayers(s ModelShape, layers int) error {
	if r.Pos < 0 || r.N < 1 || r.N > s.Context || layers < 1 || layers > s.Layers || len(r.Data) != layers*2*r.N*s.Width {
		return Errorf(CodeInvalidRequest, "KV rows at %d: %d positions of %d values are not %d layers × 2 × width %d",
			r.Pos, r.N, len(r.Data), layers, s.Width)
	}
	return nil
}

// Move is a generation's way out (Request.Move): set by whoever serves the request, read
// by a backend that can hand its generation over. A backend that cannot ignores it and the
// generation simply runs to its end (or until its context ends).
type Move struct {
	started atomic.Bool
	// PreCopyBytes bounds the rows sent between two tokens while the generation pre-copies
	// (0: MovePreCopyBytes, or a MovePreCopyTicks-th of the cache when that is more).
	// Smaller keeps more of a slow uplink for the tokens.
	PreCopyBytes int
	// Send takes the cache's rows in order from position 0, each run at most
	// MaxKVRowsBytes. It is called on Generate's goroutine, between tokens, and may keep
	// r.Data only until it returns. An error from it ends the generation with that error.
	Send func(r KVRows) error
}

// PreCopyQuota is the most bytes of rows sent between two tokens while the generation
// pre-copies a cache of cacheBytes: PreCopyBytes when set, else MovePreCopyBytes or a
// MovePreCopyTicks-th of the cache, whichever is more.
func (m *Move) PreCopyQuota(cacheBytes int) int {
	if m.PreCopyBytes > 0 {
		return m.PreCopyBytes
	}
	return max(MovePreCopyBytes, cacheBytes/MovePreCopyTicks)
}

// Start asks the generation to move: from its next token it sends its cache and then stops
// with *Moved. Safe to call from any goroutine, and more than once.
func (m *Move) Start() { m.started.Store(true) }

// Started reports whether Start was called.
func (m *Move) Started() bool { return m != nil && m.started.Load() }

// Moved is the error a generation returns when it handed itself over: it sent the rows of
// positions [0, Positions) and emitted tokens [0, Tokens). The request goes on elsewhere:
// its client resumes it with those tokens as Replay.
type Moved struct {
	Positions, Tokens int
}

func (m *Moved) Error() string {
	return fmt.Sprintf("generation moved after %d tokens, with %d positions of KV cache", m.Tokens, m.Positions)
}

// Resumer is a backend that can go on with a generation another node began.
type Resumer interface {
	// Resume checks req as Generate does (model, limits, context window) and readies its
	// generation, with a KV cache the caller fills (Resumption.Load) before calling
	// Resumption.Generate. It fails with an *Error as Generate would.
	Resume(ctx context.Context, req *Request) (Resumption, error)
}

// Resumption is a generation being resumed: its KV cache filling up.
type Resumption interface {
	// Shape is the model's shape: what KVRows.Check needs.
	Shape() ModelShape
	// Load appends rows to the cache. They must start where the rows loaded so far end
	// (at 0 first) and fit the generation's positions (prompt and max_tokens); otherwise
	// invalid_request, and nothing changes.
	Load(r KVRows) error
	// Generate runs the request as Backend.Generate does, with Replay as the tokens the
	// client has (Request.Replay's rules): the loaded rows stand for their positions' part
	// of the prompt and replay, which are prefilled from the first position not loaded (at
	// least the last replayed token's). The output is the uninterrupted generation's, tokens
	// from index 0 (the replayed ones emitted again). Called at most once.
	Generate(ctx context.Context, replay []int, emit func(Token) error) (Result, error)
	// Close frees the cache. Idempotent; Generate's end does not close it.
	Close() error
}
