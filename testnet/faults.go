package testnet

import (
	"context"
	"fmt"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// Faults makes some of a testnet's nodes misbehave, so that anyone can watch the mesh
// route around them. Each fault is injected as a misbehaving backend under an otherwise
// ordinary node (node.Config.WrapBackend): the node announces, admits and streams as usual.
type Faults struct {
	// Liars is how many nodes lie: the last Liars nodes by index that New starts (not
	// those added later). A liar alters every token it generates (see liar), for its peers
	// and for its own API alike, and still announces its models as deterministic, so its
	// answers look like answers and only verification can tell.
	Liars int
	// Slow is how many nodes answer slowly: the Slow nodes just before the liars. A slow
	// node waits SlowFirstToken before its first token and SlowPerToken before each next
	// one, as an overloaded or underpowered machine would; the router's performance
	// weighting sends it less work.
	Slow int
	// Flaky is how many nodes drop their connections: the Flaky nodes just before the slow
	// ones. Every FlakyPeriod a flaky node closes all its connections at once, cutting the
	// streams in flight, as a machine on a bad link would; discovery reconnects it.
	Flaky int
}

// FlakyPeriod is how often a flaky node drops its connections.
const FlakyPeriod = 2 * time.Second

// The slow fault's delays.
const (
	SlowFirstToken = 500 * time.Millisecond
	SlowPerToken   = 30 * time.Millisecond
)

// validate reports a fault set that cannot apply to a testnet of n nodes.
func (f Faults) validate(n int) error {
	if f.Liars < 0 || f.Slow < 0 || f.Flaky < 0 || f.Liars+f.Slow+f.Flaky > n {
		return fmt.Errorf("faults: %d liars, %d slow and %d flaky nodes in a testnet of %d nodes", f.Liars, f.Slow, f.Flaky, n)
	}
	return nil
}

// wrapFor returns the backend wrapper of node idx of a testnet started with n nodes, or
// nil when that node is honest and quick.
func (f Faults) wrapFor(idx, n int) func(inference.Backend) inference.Backend {
	switch {
	case idx >= n:
		return nil
	case idx >= n-f.Liars:
		salt := uint64(idx)
		return func(b inference.Backend) inference.Backend { return newLiar(b, salt) }
	case idx >= n-f.Liars-f.Slow:
		return func(b inference.Backend) inference.Backend { return slow{b} }
	}
	return nil
}

// flaky reports whether node idx of a testnet started with n nodes drops its connections.
func (f Faults) flaky(idx, n int) bool {
	first := n - f.Liars - f.Slow - f.Flaky
	return idx >= first && idx < n-f.Liars-f.Slow
}

// slow wraps a backend and delays its tokens (SlowFirstToken, SlowPerToken). It keeps the
// inner backend's Load, if any, only through Backend (speculative dispatch then finds no
// loader on a slow node and does not race its cloud: fine for a fault).
type slow struct{ inference.Backend }

func (s slow) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	return s.Backend.Generate(ctx, req, func(t inference.Token) error {
		d := SlowPerToken
		if t.Index == 0 {
			d = SlowFirstToken
		}
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		return emit(t)
	})
}

// liar wraps a backend and replaces every token it emits with a made-up one: the text is a
// word picked (liarWord) by hashing (salt, index, id), and the id is flipped
// (liarIDFlip). The count, the indices and the terminal result stay, and texts stay
// non-empty UTF-8, so the stream is a well-formed answer; only its content is false. The
// alteration is deterministic, as the model is claimed to be, and salted per node, so two
// liars do not agree by accident and outvote an honest peer.
type liar struct {
	inference.Backend // Models is the inner backend's: the same models, still "deterministic"
	salt              uint64
}

// liarLoader is a liar over a backend that can load models ahead of a request, so that the
// node's speculative dispatch still finds a loader.
type liarLoader struct {
	liar
	ld interface {
		Load(ctx context.Context, model string) error
	}
}

func (l liarLoader) Load(ctx context.Context, model string) error { return l.ld.Load(ctx, model) }

func newLiar(b inference.Backend, salt uint64) inference.Backend {
	l := liar{Backend: b, salt: salt}
	if ld, ok := b.(interface {
		Load(ctx context.Context, model string) error
	}); ok {
		return liarLoader{liar: l, ld: ld}
	}
	return l
}

// liarWord is the text a liar emits for hash h: plausible English pieces, each non-empty.
func liarWord(h uint64) string {
	words := [...]string{" the", " mesh", " of", " peer", " is", " a", " model", ",", " and", " answer", " node", "."}
	return words[h%uint64(len(words))]
}

// liarIDFlip is XORed into every token id: it changes every id, -1 (unknown) included,
// and moves a vocabulary id (well under 2^20) out of the vocabulary.
const liarIDFlip = 1 << 20

func (l liar) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	return l.Backend.Generate(ctx, req, func(tok inference.Token) error {
		tok.Text = liarWord(mix64(l.salt ^ uint64(tok.Index)<<32 ^ uint64(uint32(tok.ID))))
		tok.ID ^= liarIDFlip
		return emit(tok)
	})
}

// mix64 is SplitMix64's finalizer: a cheap, well-spread hash of x.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
