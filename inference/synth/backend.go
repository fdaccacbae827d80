package synth

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// Backend serves a fixed set of synthetic models. It is safe for concurrent use. It starts
// no goroutines of its own (matrix products may use short-lived helpers that end before
// they return), so it has no Close; dropping it frees the weights.
type Backend struct {
	names  []string          // served models, in New's order
	models map[string]*model // read-only after New
	// loadDelay is added to every load (WithLoadDelay), which then waits for loadGate
	// (WithLoadGate) when it is set.
	loadDelay time.Duration
	loadGate  <-chan struct{}
	// onRange is called when a stage's range starts loading, its load ends, or it is
	// unloaded (WithOnRangeChange).
	onRange func()
	// mem counts the stages' ranges and sessions against the stage budget (memory.go).
	mem stageMem
}

// Option configures a Backend.
type Option func(*Backend)

// WithLoadDelay adds d to every model load, standing for reading weights from disk: the
// presets materialize in milliseconds, a real model takes seconds, and a testnet that shows
// cold starts (speculative dispatch racing a cold model) needs them as long as real ones.
// The wait ends early, with the model still cold, when the load's context ends.
func WithLoadDelay(d time.Duration) Option { return func(b *Backend) { b.loadDelay = d } }

// WithLoadGate holds every load, after its delay, until gate is closed: a test can watch a
// model or a layer range while it loads. As with the delay, the wait ends early, with the
// part still cold, when the load's context ends.
func WithLoadGate(gate <-chan struct{}) Option { return func(b *Backend) { b.loadGate = gate } }

// WithOnRangeChange calls f each time a layer range held for pipeline stages (see Ranges)
// starts loading, each time such a load ends, loaded or failed, and each time such a range
// is unloaded to make room (WithStageBudget). It runs on the goroutine loading (or opening
// the stage that made room), with no lock held, and must return quickly. Loads of whole models and of the
// head are not reported: a node's own requests load those, and announcing them at once
// would tell the mesh when its owner used it.
func WithOnRangeChange(f func()) Option { return func(b *Backend) { b.onRange = f } }

var (
	_ inference.Backend      = (*Backend)(nil)
	_ inference.StageBackend = (*Backend)(nil)
)

// model is one served preset and the parts of it loaded so far.
type model struct {
	preset Preset
	tok    *tokenizer

	// loads counts materializations started, of any part, for tests of load-once.
	loads atomic.Int64
	// delay and gate hold each load (WithLoadDelay, WithLoadGate); onRange is told of the
	// stage ranges' loads (WithOnRangeChange). Set by NewWith.
	delay   time.Duration
	gate    <-chan struct{}
	onRange func()

	mu sync.Mutex
	// parts holds a slot for each part loaded or being loaded. A slot is removed when its
	// load fails; a loaded one stays as long as the Backend, but for a stage's range, which
	// the stage budget may unload (memory.go) when no session uses it.
	parts map[part]*slot
}

// slot is the load state of one part of a model.
type slot struct {
	// w is non-nil once the part is loaded; it never changes after that.
	w *weights
	// loading is non-nil while the load runs; it is closed when that load ends, either way.
	loading chan struct{}
}

// New returns a backend serving the named presets, cold: no weights are materialized until
// the first request for a model or a call to Load. Unknown or repeated names are an error.
func New(models ...string) (*Backend, error) { return NewWith(models, nil) }

// NewWith is New with options.
func NewWith(models []string, opts []Option) (*Backend, error) {
	if len(models) == 0 {
		return nil, fmt.Errorf("synth: no models given (known: %s)", presetNames())
	}
	b := &Backend{models: make(map[string]*model, len(models)), mem: stageMem{ranges: make(map[heldKey]*heldRng)}}
	for _, name := range models {
		p, ok := LookupPreset(name)
		if !ok {
			return nil, fmt.Errorf("synth: unknown model %q (known: %s)", name, presetNames())
		}
		if _, dup := b.models[name]; dup {
			return nil, fmt.Errorf("synth: model %q given twice", name)
		}
		b.names = append(b.names, name)
		b.models[name] = &model{preset: p, tok: newTokenizer(p.Vocab), parts: make(map[part]*slot)}
	}
	for _, o := range opts {
		o(b)
	}
	for _, m := range b.models {
		m.delay, m.gate, m.onRange = b.loadDelay, b.loadGate, b.onRange
	}
	return b, nil
}

// Models lists the served models in New's order; Warm is true once a model's whole weights
// are materialized (parts loaded for stages or a head do not count). It never fails.
func (b *Backend) Models(ctx context.Context) ([]inference.ModelInfo, error) {
	infos := make([]inference.ModelInfo, 0, len(b.names))
	for _, name := range b.names {
		m := b.models[name]
		warm := m.loaded(whole(m.preset)) != nil
		infos = append(infos, inference.ModelInfo{Name: name, Warm: warm, Deterministic: true})
	}
	return infos, nil
}

// Load materializes the weights of model now, so that its first request pays no cold start.
// It returns at once if they are already loaded and waits if another call is loading them.
// If ctx ends first it returns ctx's error and the model stays cold (a later call retries).
func (b *Backend) Load(ctx context.Context, model string) error {
	m, err := b.lookup(model)
	if err != nil {
		return err
	}
	_, err = m.load(ctx, whole(m.preset))
	return err
}

func (b *Backend) lookup(name string) (*model, error) {
	m, ok := b.models[name]
	if !ok {
		return nil, inference.Errorf(inference.CodeModelNotFound,
			"model %q is not served here (serving %s)", name, strings.Join(b.names, ", "))
	}
	return m, nil
}

// loaded returns the weights of pt if they are loaded, else nil. It never waits.
func (m *model) loaded(pt part) *weights {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.parts[pt]; s != nil {
		return s.w
	}
	return nil
}

// get returns weights that hold pt: pt's own if loaded, else the whole model's if loaded
// (a part of it), else pt's, loaded now.
func (m *model) get(ctx context.Context, pt part) (*weights, error) {
	if w := m.loaded(pt); w != nil {
		return w, nil
	}
	if w := m.loaded(whole(m.preset)); w != nil {
		return w, nil
	}
	return m.load(ctx, pt)
}

// load returns the weights of pt, materializing them on first use. Concurrent callers share
// one materialization; a caller whose ctx ends stops waiting, and if it was the one loading,
// the load is abandoned and the next caller starts over.
func (m *model) load(ctx context.Context, pt part) (*weights, error) {
	what := pt.describe(m.preset)
	for {
		m.mu.Lock()
		s := m.parts[pt]
		if s != nil && s.w != nil {
			m.mu.Unlock()
			return s.w, nil
		}
		if s != nil {
			wait := s.loading
			m.mu.Unlock()
			select {
			case <-wait:
				continue // loaded, or the loader gave up: look again
			case <-ctx.Done():
				return nil, fmt.Errorf("synth: waiting for %s to load: %w", what, ctx.Err())
			}
		}
		if err := ctx.Err(); err != nil {
			m.mu.Unlock()
			return nil, fmt.Errorf("synth: loading %s: %w", what, err)
		}
		s = &slot{loading: make(chan struct{})}
		m.parts[pt] = s
		m.mu.Unlock()
		m.rangeChanged(pt)

		m.loads.Add(1)
		w, err := materialize(ctx, m.preset, pt)
		if err == nil && m.delay > 0 {
			t := time.NewTimer(m.delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				w, err = nil, ctx.Err()
			}
			t.Stop()
		}
		if err == nil && m.gate != nil {
			select {
			case <-m.gate:
			case <-ctx.Done():
				w, err = nil, ctx.Err()
			}
		}

		m.mu.Lock()
		if err != nil {
			delete(m.parts, pt) // the part stays cold
		}
		s.w = w
		done := s.loading
		s.loading = nil
		m.mu.Unlock()
		close(done)
		m.rangeChanged(pt)
		if err != nil {
			return nil, fmt.Errorf("synth: loading %s: %w", what, err)
		}
		return w, nil
	}
}

// rangeChanged tells onRange that the load state of pt changed, if pt is a stage's range.
func (m *model) rangeChanged(pt part) {
	if m.onRange != nil && pt.isRange() {
		m.onRange()
	}
}

// Generate runs one completion; see inference.Backend for the contract. In order it checks
// the model (model_not_found), the request (invalid_request, by Request.Validate without
// size limits: those are the API's), the prompt's length (context_overflow when the chat
// template leaves no room for one token), then loads the model if cold, processes the prompt
// and samples until the end-of-text token or a stop string (FinishStop), or until max_tokens
// or the context window is reached (FinishLength).
//
// It is GenerateWith whose layers are a stage session of all the model's layers, run here.
func (b *Backend) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	m, prompt, budget, err := b.prepare(ctx, req)
	if err != nil {
		return inference.Result{}, err
	}
	w, err := m.load(ctx, whole(m.preset))
	if err != nil {
		return inference.Result{}, err
	}
	// The cache needs no slot for the last sampled token: it is never fed back.
	local := newSession(w, 0, m.preset.Layers, len(prompt)+budget-1, nil)
	defer local.Close()
	return generate(ctx, m, w, local.Forward, req, prompt, budget, emit, 0, newMover(req.Move, local))
}

// GenerateWith is Generate, with every layer computed by layers instead of here: the head
// of a sharded generation. It has Generate's contract (checks, tokenization, chat template,
// sampling, stop strings, finish reasons, usage, context_overflow) and, for the same
// request, emits the same tokens and returns the same Result as Generate, provided layers
// computes what the model's layers compute: the stages' sessions of model's layers, chained
// in order, do bit for bit.
//
// It loads only the head (token and position embeddings, final norm, output projection),
// or uses the whole model's when that is loaded. It calls layers once with the whole prompt
// (n = prompt length; a stage runs it in passes of 16 positions, which gives the same bits
// as any other split), then once per generated token but the last (n = 1), checking ctx
// before each call. The positions fed in all are at most prompt length + max_tokens − 1
// and fewer than the context window: stage sessions opened for that many suffice. hidden
// is fresh for each call and not used again by the head, so layers may keep or modify it.
// An error from layers ends the generation and is returned wrapped (CodeOf and errors.Is
// see it); a result of the wrong size is an unavailable *inference.Error.
func (b *Backend) GenerateWith(ctx context.Context, req *inference.Request, layers inference.Layers, emit func(inference.Token) error) (inference.Result, error) {
	m, prompt, budget, err := b.prepare(ctx, req)
	if err != nil {
		return inference.Result{}, err
	}
	w, err := m.get(ctx, headOnly())
	if err != nil {
		return inference.Result{}, err
	}
	return generate(ctx, m, w, layers, req, prompt, budget, emit, 0, nil)
}

// prepare does Generate's checks, in its order, and returns the model, the prompt's tokens
// and the completion's budget: max_tokens, cut to what the context window leaves.
func (b *Backend) prepare(ctx context.Context, req *inference.Request) (*model, []int, int, error) {
	m, err := b.lookup(req.Model)
	if err != nil {
		return nil, nil, 0, err
	}
	if err := req.Validate(inference.NoSizeLimits()); err != nil {
		return nil, nil, 0, err
	}
	p := m.preset
	prompt := m.tok.encodeChat(req.Messages, p.Context)
	if len(prompt) >= p.Context {
		return nil, nil, 0, inference.Errorf(inference.CodeContextOverflow,
			"prompt needs at least %d tokens, %s has a context window of %d", len(prompt), p.Name, p.Context)
	}
	budget := min(req.EffectiveMaxTokens(), p.Context-len(prompt))
	if err := m.checkReplay(req.Replay, budget); err != nil {
		return nil, nil, 0, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, 0, fmt.Errorf("synth: %w", err)
	}
	return m, prompt, budget, nil
}

// checkReplay returns an invalid_request *inference.Error unless replay can be replayed in
// a completion of budget tokens: fewer ids than the budget, each a token m samples.
func (m *model) checkReplay(replay []int, budget int) error {
	p := m.preset
	if len(replay) >= budget {
		return inference.Errorf(inference.CodeInvalidRequest,
			"%d tokens to replay leave none of the completion's %d to generate", len(replay), budget)
	}
	for _, id := range replay {
		if id < 0 || id >= p.Vocab || id == idEOT || !m.tok.sampleable[id] {
			return inference.Errorf(inference.CodeInvalidRequest,
				"token id %d cannot be replayed: not a token %s samples", id, p.Name)
		}
	}
	return nil
}

// generate is the generation loop of Generate, GenerateWith and a Resumption: head holds
// the head's weights, layers runs every layer. The tokens to replay (req.Replay, checked by
// prepare) go through the layers with the prompt, in one call, from position from (the
// positions before it are in the layers' cache already: a resumed generation's); each then
// takes the place of a pick (the sampler draws what the pick would have) and passes the stop
// strings like a sampled one, so the tokens after them are those of the uninterrupted run.
// mv, when set, hands the generation over once its Move starts (mover.tick).
func generate(ctx context.Context, m *model, head *weights, layers inference.Layers, req *inference.Request,
	prompt []int, budget int, emit func(inference.Token) error, from int, mv *mover) (inference.Result, error) {
	replay := req.Replay
	emitted := 0 // tokens emitted: what a handover reports the client has
	if mv != nil {
		next := emit
		emit = func(t inference.Token) error {
			emitted++
			return next(t)
		}
	}
	p := m.preset
	d := p.Dim
	logits, xn := make([]float32, p.Vocab), make([]float32, d)
	// step embeds tokens at positions pos…, runs them through the layers, and leaves in
	// logits the logits after the last one.
	step := func(tokens []int, pos int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := len(tokens)
		hidden := make([]float32, n*d)
		head.embed(hidden, tokens, pos)
		out, err := layers(ctx, hidden, n)
		if err != nil {
			return err
		}
		if len(out) != n*d {
			return inference.Errorf(inference.CodeUnavailable,
				"the layers returned %d values for %d positions of width %d", len(out), n, d)
		}
		head.logits(logits, xn, out[(n-1)*d:])
		return nil
	}
	if err := step(append(slices.Clip(prompt), replay...)[from:], from); err != nil {
		return inference.Result{}, fmt.Errorf("synth: prompt: %w", err)
	}
	smp := newSampler(req.EffectiveTemperature(), req.EffectiveTopP(), req.EffectiveSeed(), m.tok.sampleable)
	stop := newStopper(req.Stop)
	usage := inference.Usage{PromptTokens: len(prompt)}
	replayed := len(replay) // prefilled with the prompt (Result.Replayed)
	if from > 0 {
		replayed = 0 // a resumption's: only what its cache lacked went through the layers
	}
	result := func(fr inference.FinishReason) inference.Result {
		usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
		return inference.Result{FinishReason: fr, Usage: usage, Replayed: replayed}
	}
	for {
		var id int
		if k := usage.CompletionTokens; k < len(replay) {
			id = replay[k]
			smp.skip()
		} else {
			id = smp.pick(logits)
		}
		if id == idEOT {
			if err := emitAll(emit, stop.flush()); err != nil {
				return inference.Result{}, err
			}
			return result(inference.FinishStop), nil
		}
		usage.CompletionTokens++
		ready, stopped := stop.push(id, m.tok.pieces[id])
		if err := emitAll(emit, ready); err != nil {
			return inference.Result{}, err
		}
		if stopped {
			return result(inference.FinishStop), nil
		}
		if usage.CompletionTokens == budget {
			if err := emitAll(emit, stop.flush()); err != nil {
				return inference.Result{}, err
			}
			return result(inference.FinishLength), nil
		}
		if usage.CompletionTokens <= len(replay) {
			continue // a replayed token: in the layers already, with the prompt
		}
		if err := mv.tick(emitted); err != nil {
			return inference.Result{}, err
		}
		if err := step([]int{id}, len(prompt)+usage.CompletionTokens-1); err != nil {
			return inference.Result{}, fmt.Errorf("synth: generation: %w", err)
		}
	}
}

func emitAll(emit func(inference.Token) error, toks []inference.Token) error {
	for _, t := range toks {
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}
