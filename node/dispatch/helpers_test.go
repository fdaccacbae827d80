package dispatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/reputation"
)

// entries is a fixed peer registry.
type entries []registry.Entry

func (e entries) Entries(time.Time) []registry.Entry { return e }

// newExecutor returns an executor over cfg, closed when the test ends.
func newExecutor(t *testing.T, cfg Config) *Executor {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// target is an in-memory place to run a request: the real synthetic model, with the faults
// a test asks for. Its fields are set before use and read-only after.
type target struct {
	b *synth.Backend
	// failBefore, when set, is returned before the first token.
	failBefore error
	// cutAfter > 0 ends the stream with peer_lost after that many tokens.
	cutAfter int
	// alter > 0 changes the text of token alter-1: a peer that lies.
	alter int
	// firstToken delays the first token (on the test's clock: virtual under synctest).
	firstToken time.Duration
	// regenerate ignores Request.Replay, as an upstream API does: it generates the tokens
	// sent again.
	regenerate bool
	// calls counts the requests it received.
	calls chan struct{}
}

func newTarget(t *testing.T, model string) *target {
	t.Helper()
	b, err := synth.New(model)
	if err != nil {
		t.Fatal(err)
	}
	return &target{b: b, calls: make(chan struct{}, 1024)}
}

func (tg *target) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	tg.calls <- struct{}{}
	if tg.failBefore != nil {
		return inference.Result{}, tg.failBefore
	}
	if tg.firstToken > 0 {
		select {
		case <-time.After(tg.firstToken):
		case <-ctx.Done():
			return inference.Result{}, ctx.Err()
		}
	}
	if tg.regenerate && len(req.Replay) > 0 {
		again := *req
		again.Replay = nil
		req = &again
	}
	errCut := inference.Errorf(inference.CodePeerLost, "stream reset after %d tokens", tg.cutAfter)
	n := 0
	res, err := tg.b.Generate(ctx, req, func(tok inference.Token) error {
		if tg.cutAfter > 0 && n == tg.cutAfter {
			return errCut
		}
		n++
		if tg.alter > 0 && tok.Index == tg.alter-1 {
			tok.Text += "!"
		}
		return emit(tok)
	})
	return res, err
}

func (tg *target) Models(ctx context.Context) ([]inference.ModelInfo, error) { return tg.b.Models(ctx) }

// Load makes a target a Loader (local targets speculate).
func (tg *target) Load(ctx context.Context, model string) error { return tg.b.Load(ctx, model) }

// calledTimes is how many requests tg has received.
func (tg *target) calledTimes() int { return len(tg.calls) }

// peers are in-memory peers by ID.
type peers map[peer.ID]*target

func (ps peers) Generate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	tg, ok := ps[p]
	if !ok {
		return inference.Result{}, inference.Errorf(inference.CodeUnavailable, "no such peer %s", p)
	}
	return tg.Generate(ctx, req, emit)
}

// registryOf announces model, warm and deterministic, for each of ids.
func registryOf(model string, ids ...peer.ID) entries {
	var out entries
	for _, id := range ids {
		out = append(out, registry.Entry{Peer: id, Contacted: true, Vector: &caps.Vector{
			Models: []caps.Model{{Name: model, State: caps.ModelWarm, Deterministic: true}},
			Load:   caps.Load{Accepting: true},
		}})
	}
	return out
}

func newRep(t *testing.T) *reputation.Store {
	t.Helper()
	rep, err := reputation.New(reputation.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// chat is a mesh request for model with a fixed seed.
func chat(model string, maxTokens int) *inference.Request {
	seed := int64(42)
	return &inference.Request{
		Model: model, Seed: &seed, MaxTokens: &maxTokens, Stream: true,
		Messages: []inference.Message{{Role: inference.RoleUser, Content: "route this through the mesh"}},
		Prefs:    inference.DefaultPrefs(),
	}
}

// collect runs req on d and returns what the client received, where each token came from,
// and the outcome.
func collect(d *Executor, req *inference.Request) (got []inference.Token, from []inference.Served, at inference.Served, err error) {
	_, at, err = d.Generate(context.Background(), req, func(s inference.Served, tok inference.Token) error {
		got, from = append(got, tok), append(from, s)
		return nil
	})
	return got, from, at, err
}

// reference is what model outputs for req on its own: the stream a client must see.
func reference(t *testing.T, model string, req *inference.Request) []inference.Token {
	t.Helper()
	tg := newTarget(t, model)
	var out []inference.Token
	if _, err := tg.Generate(context.Background(), req, func(tok inference.Token) error {
		out = append(out, tok)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func texts(toks []inference.Token) string {
	s := ""
	for _, t := range toks {
		s += fmt.Sprintf("%d:%q ", t.Index, t.Text)
	}
	return s
}
