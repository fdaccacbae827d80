package testnet

import (
	"context"
	"slices"
	"sync"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/node"
)

// tokenGate holds the streams of the backends it wraps before one token index until the
// test opens it, so that a test acting mid-stream (killing the serving node, draining its
// battery) acts while the stream is certainly still in flight, on a fast machine as on a
// slow one. A gate holds nothing until Hold arms it; each Hold arms it anew.
type tokenGate struct {
	mu   sync.Mutex
	at   int           // index of the token held back; -1 when disarmed
	open chan struct{} // closed by the open func Hold returned
	// replays are the lengths of the replays (inference.Request.Replay) of the requests
	// the gated backends were given, when not empty, in order.
	replays []int
	// resumed are the positions of KV cache each resumed generation (a live handover's
	// replacement) was loaded with before it went on, in order.
	resumed []int
	// moveHeld, when set, holds the next handover after its first rows (HoldMove):
	// loaded is where the replacement reports the positions its first rows held, open
	// what the source's second send waits on.
	moveHeld *heldMove
}

// heldMove is a handover held after its first rows (HoldMove).
type heldMove struct {
	loaded chan int
	open   chan struct{}
}

// HoldMove holds the next live handover after its first rows: the leaving node's second
// send of rows waits until open is called (or its stream's context ends), and the
// replacement, once its first rows are loaded, reports how many positions they held on
// loaded. So a test can cut the source mid-transfer whatever the machine's speed. The
// held handover pre-copies at most heldPreCopyBytes a token (Move.PreCopyBytes), so that
// its cache moves in several sends whatever the model. open is idempotent and registered
// as a cleanup.
func (g *tokenGate) HoldMove(t interface{ Cleanup(func()) }) (loaded <-chan int, open func()) {
	h := &heldMove{loaded: make(chan int, 1), open: make(chan struct{})}
	g.mu.Lock()
	g.moveHeld = h
	g.mu.Unlock()
	var once sync.Once
	open = func() { once.Do(func() { close(h.open) }) }
	t.Cleanup(open)
	return h.loaded, open
}

// heldPreCopyBytes bounds a held handover's pre-copy a token: 16 positions of synth-tiny.
const heldPreCopyBytes = 16 << 10

// held returns the handover HoldMove armed, if any.
func (g *tokenGate) held() *heldMove {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.moveHeld
}

// Resumed returns the positions of KV cache the gated backends' resumed generations were
// loaded with, so far.
func (g *tokenGate) Resumed() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.resumed)
}

// Replays returns the lengths of the replays the gated backends were given so far.
func (g *tokenGate) Replays() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.replays)
}

func newTokenGate() *tokenGate { return &tokenGate{at: -1} }

// Hold makes every stream served by a gated backend wait before emitting the token with
// index at (0-based: the client has received exactly at tokens) until open is called, or
// the stream's context ends. open is idempotent; Hold also registers it as a cleanup, so
// a test that fails early does not leave a node's backend waiting.
func (g *tokenGate) Hold(t interface{ Cleanup(func()) }, at int) (open func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.at, g.open = at, ch
	g.mu.Unlock()
	var once sync.Once
	open = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(open)
	return open
}

// wait returns the channel a stream must wait on before emitting token index, or nil.
func (g *tokenGate) wait(index int) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if index != g.at {
		return nil
	}
	return g.open
}

// configure installs the gate under every node's backend; use as Options.Configure.
func (g *tokenGate) configure(_ int, cfg *node.Config) {
	cfg.WrapBackend = func(b inference.Backend) inference.Backend { return gated{b, g} }
}

// gated is a backend whose streams stop at the gate's token. Like the fault wrappers it
// hides the inner backend's Load: a gated node is never the speculating router.
type gated struct {
	inference.Backend
	g *tokenGate
}

func (b gated) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	if n := len(req.Replay); n > 0 {
		b.g.mu.Lock()
		b.g.replays = append(b.g.replays, n)
		b.g.mu.Unlock()
	}
	if h := b.g.held(); h != nil && req.Move != nil {
		// The server's Move, whose Start its HandOver calls: its Send is wrapped in place,
		// and its pre-copy bounded, before the generation reads either.
		req.Move.PreCopyBytes = heldPreCopyBytes
		send, sends := req.Move.Send, 0
		req.Move.Send = func(rows inference.KVRows) error {
			if sends++; sends == 2 {
				select {
				case <-h.open:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return send(rows)
		}
	}
	return b.Backend.Generate(ctx, req, func(tok inference.Token) error {
		if ch := b.g.wait(tok.Index); ch != nil {
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return emit(tok)
	})
}

// Resume forwards to the inner backend, noting the rows each resumption was loaded with;
// its stream waits at the gate like any other.
func (b gated) Resume(ctx context.Context, req *inference.Request) (inference.Resumption, error) {
	r, ok := b.Backend.(inference.Resumer)
	if !ok {
		return nil, inference.Errorf(inference.CodeUnavailable, "the gated backend cannot resume")
	}
	res, err := r.Resume(ctx, req)
	if err != nil {
		return nil, err
	}
	return &gatedResumption{Resumption: res, g: b.g}, nil
}

type gatedResumption struct {
	inference.Resumption
	g      *tokenGate
	loaded int
}

func (r *gatedResumption) Load(rows inference.KVRows) error {
	if err := r.Resumption.Load(rows); err != nil {
		return err
	}
	first := r.loaded == 0
	r.loaded += rows.N
	if h := r.g.held(); first && h != nil {
		select {
		case h.loaded <- r.loaded:
		default: // reported once
		}
	}
	return nil
}

func (r *gatedResumption) Generate(ctx context.Context, replay []int, emit func(inference.Token) error) (inference.Result, error) {
	r.g.mu.Lock()
	r.g.resumed = append(r.g.resumed, r.loaded)
	r.g.mu.Unlock()
	return r.Resumption.Generate(ctx, replay, emit)
}
